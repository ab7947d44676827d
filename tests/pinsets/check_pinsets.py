"""The `pinsets` test stage: every production pin set, on every Python it is locked for, installed and checked
as a host would install and check it (tests/pinsets/run; docs/stacks.md).

For each pin set without `lab: true` in its pinset.yml, and each requirements-py3XY.lock it has:
  1. pinset.yml's `expect` agrees with the lock (versions, torch's CUDA build, nvcc, hashes);
  2. the lock's wheels (cached per lock, hash-checked) installed into a venv exactly as
     roles/sglang_stack installs them (cached per lock, interpreter and install recipe);
  3. `pip check`, as the role runs it;
  4. ddtree.sglang.stack_verify: its probe with the expected imports plus torch, SGLang's server
     arguments, spec_info and plugins and sgl_kernel, and its rules (GPU claims left out: no GPU here;
     sgl_kernel loads against a stub libcuda.so.1, see libcuda_stub);
  5. a release of the overlay built now from sglang_overlay/ (ddtree.sglang.overlay_build, then
     ddtree.sglang.release, which installs it into the release's site/ as on a host);
  6. ddtree.sglang.spec_verify with that release: the predicate matrix pristine and with the plugin
     loaded through SGLang's load_plugins(), and a dry parse of a DDTREE service's flags from the
     example inventory.
Steps 3-6 run every time; 2 only when its cache is cold. The modules run as Ansible runs them on a
host (their file, with a JSON args file). Exits 1 naming every problem.

Steps 4 and 6 record a pass as they do on a host (their `state_root`, docs/host-layout.md "Recorded
checks"), in $DDTREE_CACHE/pinsets/checks, and releases stay in $DDTREE_CACHE/pinsets/releases: a run
whose venv, release, options and check code are those of a run that passed gets the recorded pass
instead of importing CUDA torch again (about 130 of the stage's 155 CPU seconds). Any change to one of
them (a lock, the overlay, pinset.yml's expectation, the modules) checks again; DDTREE_PINSETS_RECHECK=1
checks everything again, recording nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "scripts"))
import pinset_env  # noqa: E402

from ansible_collections.ddtree.sglang.plugins.module_utils.pinset import (  # noqa: E402
    is_lab_pinset,
    lock_name,
    lock_pins,
    locked_pythons,
    pinset_problems,
    stack_id,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.services import service_environment, service_flags  # noqa: E402

# Modules every SGLang server imports, checked on CPU beside the pin set's own `expect.imports`.
CPU_IMPORTS = ["torch", "sglang.srt.server_args", "sglang.srt.speculative.spec_info", "sglang.srt.plugins"]


class StepFailed(Exception):
    """A step's problem, as the person fixing it needs to read it."""


def run_module(name: str, args: dict, env: dict | None = None) -> dict:
    """Run ddtree.sglang.<name> as Ansible runs a module on a host: its file with a JSON args file."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ansible_collections.ddtree.sglang.plugins.modules.%s" % name, handle.name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO / "collections"), **(env or {})),
            check=False,
        )
    finally:
        os.unlink(handle.name)
    try:
        result = json.loads(done.stdout[done.stdout.index("{") :])
    except ValueError:
        raise StepFailed(
            "ddtree.sglang.%s printed no result (exit %d): %s"
            % (name, done.returncode, (done.stderr or done.stdout)[-2000:])
        ) from None
    if result.get("failed"):
        detail = result.get("stderr_lines") or result.get("contradictions") or []
        raise StepFailed(
            "ddtree.sglang.%s: %s%s" % (name, result.get("msg"), "".join("\n    " + str(line) for line in detail[-15:]))
        )
    return result


def example_services() -> list[dict]:
    """The services of the example inventory (what production hosts are told to serve)."""
    services = []
    for path in sorted((REPO / "inventories" / "example" / "group_vars").glob("*.yml")):
        services += (yaml.safe_load(path.read_text()) or {}).get("sglang_services") or []
    return services


def ffmpeg_missing() -> list[str]:
    """The FFmpeg packages roles/cuda_stack installs on a host of this distribution release that are missing here."""
    release = ""
    if Path("/etc/os-release").exists():
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                release = line.split("=", 1)[1].strip('"')
    defaults = yaml.safe_load((REPO / "roles" / "cuda_stack" / "defaults" / "main.yml").read_text())
    packages = defaults["cuda_stack_ffmpeg_packages"].get(release, [])
    return [
        package
        for package in packages
        if subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            check=False,
        ).stdout
        != "install ok installed"
    ]


def ensure_ffmpeg() -> None:
    """torchcodec loads the host's FFmpeg: install what roles/cuda_stack installs on a host, when missing."""
    missing = ffmpeg_missing() if Path("/usr/bin/dpkg-query").exists() else []
    if not missing:
        return
    if os.geteuid() != 0:
        raise StepFailed(
            "torchcodec needs FFmpeg's libraries, as roles/cuda_stack installs them on hosts; missing: %s "
            "(apt-get install %s, or run as root)" % (" ".join(missing), " ".join(missing))
        )
    pinset_env.log("installing FFmpeg's libraries as roles/cuda_stack does on hosts: %s" % " ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    pinset_env.run(["apt-get", "update", "-qq"], "apt-get update", env)
    pinset_env.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing, "apt-get install FFmpeg", env
    )


def driver_symbols(package: Path) -> list[str]:
    """CUDA driver API functions (cuXxx) that the package's native libraries needing libcuda.so.1 import."""
    symbols = set()
    for library in sorted(package.rglob("*.so")):
        needed = subprocess.run(
            ["readelf", "-d", str(library)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False
        ).stdout
        if "[libcuda.so.1]" not in needed:
            continue
        undefined = subprocess.run(
            ["nm", "-D", "--undefined-only", str(library)], stdout=subprocess.PIPE, text=True, check=True
        ).stdout
        symbols.update(word for word in undefined.split() if re.fullmatch(r"cu[A-Z]\w*", word))
    return sorted(symbols)


def libcuda_stub(venv: Path, work: Path) -> Path | None:
    """A directory with a stub libcuda.so.1 whose driver functions all return CUDA_ERROR_NOT_SUPPORTED.

    A host's driver provides libcuda.so.1; this machine has none, and sgl_kernel's libraries need it to
    load at all. With the stub they load, so the import proves what a CPU machine can: their links to
    torch's C++ ABI and the CUDA 13 runtime (sglang-kernel built for another torch fails here, with the
    missing symbol named). None when there is no C compiler or nothing needs libcuda.
    """
    packages = sorted(venv.glob("lib/python3*/site-packages/sgl_kernel"))
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not packages or not compiler:
        return None
    symbols = driver_symbols(packages[0])
    if not symbols:
        return None
    directory = work / "libcuda-stub"
    directory.mkdir(exist_ok=True)
    source = directory / "stub.c"
    source.write_text("".join("int %s(void) { return 801; }\n" % symbol for symbol in symbols))
    pinset_env.run(
        [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(directory / "libcuda.so.1"), str(source)],
        "compiling a stub libcuda.so.1",
    )
    return directory


class Stage:
    """Runs the checks of (pin set, Python) pairs, up to `jobs` at once (each is a chain of processes, mostly
    imports of SGLang on one core); cold only, downloads one at a time and installs one at a time."""

    def __init__(self, work: Path, records: Path | None = None, releases: Path | None = None):
        self.work = work
        self.records = records  # state_root of the recorded checks; None: check every time, record nothing
        self.keep_releases = releases is not None  # in the cache, used again by later runs; else in `work`
        self.releases = releases if self.keep_releases else work / "releases"
        self.problems: list[str] = []
        self.passed = 0
        self.wheel: dict | None = None
        self.lock = threading.Lock()  # counters, the overlay wheel, FFmpeg
        # One download at a time (a later wheelhouse is seeded from the files of an earlier one: the CUDA
        # wheels fit every Python) and one install at a time, but one pair's install beside the next one's download.
        self.download_lock = threading.Lock()
        self.install_lock = threading.Lock()
        self.local = threading.local()

    def say(self, text: str) -> None:
        """Output of the pair this thread checks (printed whole when it ends), or printed now."""
        lines = getattr(self.local, "lines", None)
        if lines is None:
            print(text, flush=True)
        else:
            lines.append(text)

    def step(self, label: str, what: str, action):
        """Run one check; record its problem (and return None) when it fails."""
        start = time.time()
        try:
            result = action()
        except (StepFailed, RuntimeError) as error:
            with self.lock:
                self.problems.append("%s: %s: %s" % (label, what, error))
            self.say(
                "FAILED  %s: %s (%.0f s)\n        %s"
                % (label, what, time.time() - start, str(error).replace("\n", "\n        "))
            )
            return None
        with self.lock:
            self.passed += 1
        self.say("ok      %s: %s (%.0f s)" % (label, what, time.time() - start))
        return result

    def overlay_wheel(self) -> dict:
        """The overlay wheel built from this checkout now (into this run's own directory, so never a cached one)."""
        with self.lock:
            if self.wheel is None:
                self.wheel = run_module(
                    "overlay_build", {"source": str(REPO / "sglang_overlay"), "dest": str(self.work / "overlay")}
                )
            return self.wheel

    def check_pair(self, directory: Path, spec: dict, python: str) -> list[str]:
        """check() with this thread's output collected and returned."""
        self.local.lines = []
        try:
            self.check(directory, spec, python)
        except Exception as error:  # a bug here must still name the pair, and not hide the others' results
            with self.lock:
                self.problems.append("%s py%s: the stage itself failed: %r" % (spec["name"], python, error))
            self.local.lines.append("FAILED  %s py%s: %r" % (spec["name"], python, error))
        lines, self.local.lines = self.local.lines, None
        return lines

    def check(self, directory: Path, spec: dict, python: str) -> None:
        label = "%s py%s" % (spec["name"], python)
        lock = directory / lock_name(python)
        pins = lock_pins(lock.read_text())
        interpreter = self.step(label, "find a Python %s" % python, lambda: pinset_env.find_python(python))
        if interpreter is None:
            return
        with self.download_lock:
            wheels = self.step(
                label,
                "wheelhouse of %s (cached per lock, hash-checked)" % lock.name,
                lambda: pinset_env.wheelhouse(lock, python, spec["glibc"], spec["name"]),
            )
        with self.install_lock:
            venv = wheels and self.step(
                label,
                "install %s as the role does (cached per lock and recipe)" % lock.name,
                lambda: pinset_env.stack_venv(lock, interpreter, wheels, spec["name"]),
            )
        if not venv:
            return
        self.say("        %s (%s)" % (venv, interpreter))
        if spec.get("install_without_dependencies"):
            self.say("skip    %s: pip check (packages installed without dependencies, as the role skips it)" % label)
        else:
            self.step(label, "pip check", lambda: self.pip_check(venv))
        self.step(
            label,
            "ddtree.sglang.stack_verify (no GPU here: GPU claims left out)",
            lambda: self.stack_verify(venv, spec, python, pins),
        )
        release = self.step(
            label,
            "overlay release (ddtree.sglang.overlay_build, ddtree.sglang.release)",
            lambda: self.release(venv, spec, lock),
        )
        if release is None:
            return
        # The module once, with a DDTREE service's flags when there is one. (Every service's flags are
        # dry-parsed with the same SGLang by Molecule, whose lab uses these inventory files.)
        services = sorted(
            example_services(), key=lambda service: (service.get("speculative") or {}).get("algorithm") != "DDTREE"
        )
        if services:
            self.step(
                label,
                "ddtree.sglang.spec_verify: predicate matrix, and the flags of service %s" % services[0]["name"],
                lambda: self.spec_verify(venv, release, services[0]),
            )

    def pip_check(self, venv: Path) -> str:
        passed, output = pinset_env.pip_check(venv)
        self.say("        pip check: %s" % output.replace("\n", "\n        "))
        if not passed:
            raise StepFailed(output)
        return output

    def stack_verify(self, venv: Path, spec: dict, python: str, pins: dict) -> dict:
        expect = dict(spec["expect"], python=python, gpu=False)
        imports = list(expect.get("imports") or [])
        imports += [
            module
            for module in CPU_IMPORTS + (["sgl_kernel"] if "sglang-kernel" in pins else [])
            if module not in imports
        ]
        env = {}
        if "sgl_kernel" in imports:
            stub = libcuda_stub(venv, self.work)
            if stub is None:
                self.say(
                    "        sgl_kernel not imported: it needs libcuda.so.1 and no C compiler is here to make a stub"
                )
                imports.remove("sgl_kernel")
            else:
                env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(stub), os.environ.get("LD_LIBRARY_PATH")]))
                self.say(
                    "        sgl_kernel loads against a stub libcuda.so.1 (no driver here): its links to torch and CUDA are checked"
                )
        expect["imports"] = imports
        if spec["expect"].get("torch_cuda"):
            with self.lock:
                ensure_ffmpeg()
        result = run_module("stack_verify", dict({"stack": str(venv), "expected": expect}, **self.state_root()), env)
        self.say_recorded(result)
        facts = result["facts"]
        self.say(
            "        torch %s (CUDA %s), sglang %s, sglang-kernel %s, nvcc %s; imported: %s"
            % (
                facts["torch"]["version"],
                facts["torch"]["cuda"],
                facts["packages"]["sglang"],
                facts["packages"]["sglang-kernel"],
                (facts.get("nvcc") or {}).get("version"),
                ", ".join(sorted(facts["imports"])),
            )
        )
        return result

    def release(self, venv: Path, spec: dict, lock: Path) -> str:
        wheel = self.overlay_wheel()
        # The role's stack id: sha256 of the pin set's name and the lock (Ansible's file lookup strips the end).
        stack = stack_id(spec["name"], lock.read_text().rstrip("\n") + "\n")
        result = run_module(
            "release",
            {
                "root": str(self.releases),
                "wheel": wheel["wheel"],
                "stack": str(venv),
                "stack_id": stack,
                "arch": "cpu",
                "source_hash": wheel["source_hash"],
                "source_revision": wheel["revision"],
            },
        )
        self.say(
            "        release %s of overlay %s (%s)"
            % (result["release_id"], wheel["source_hash"][:12], wheel["revision"])
        )
        if self.keep_releases:
            # A stamp beside the releases (a release's own files never change): one unused for a while goes.
            pinset_env.stamp_and_prune(self.releases.with_name("releases-used") / result["release_id"], self.releases)
        return result["release_dir"]

    def state_root(self) -> dict:
        return {"state_root": str(self.records)} if self.records else {}

    def say_recorded(self, result: dict) -> None:
        if result.get("recorded"):
            self.say(
                "        a recorded pass: same venv, release, options and check code as a run that passed "
                "(DDTREE_PINSETS_RECHECK=1 checks again)"
            )

    def spec_verify(self, venv: Path, release: str, service: dict) -> dict:
        # As the role's verify: the launcher adds --api-key from the service's credential at start.
        flags = service_flags(service) + (["--api-key", "dry-parse-placeholder"] if service.get("api_key") else [])
        environment = service_environment(service)
        result = run_module(
            "spec_verify",
            dict(
                {"stack": str(venv), "release": release, "flags": flags, "environment": environment},
                **self.state_root(),
            ),
        )
        self.say_recorded(result)
        self.say("        " + "\n        ".join(result["matrix"]))
        self.say("        parsed: %s" % json.dumps(result.get("parsed")))
        return result


def production_pinsets(pinsets_dir: Path) -> list[tuple[Path, dict]]:
    found = []
    for directory in sorted(path for path in pinsets_dir.iterdir() if (path / "pinset.yml").is_file()):
        spec = yaml.safe_load((directory / "pinset.yml").read_text())
        if is_lab_pinset(spec):
            print("skip    %s: the lab's pin set (lab: true; Molecule builds it)" % spec["name"])
        else:
            found.append((directory, spec))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pinsets-dir",
        type=Path,
        default=REPO / "roles" / "sglang_stack" / "files" / "pinsets",
        help="where pin sets live (a scratch copy to try a change)",
    )
    parser.add_argument("--python", action="append", help="only these Python versions (default: every one locked)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="pairs checked at once (default: 2, or 1 on one core)",
    )
    options = parser.parse_args(argv)
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="pinsets-stage-") as work:
        if os.environ.get("DDTREE_PINSETS_RECHECK") == "1":
            stage = Stage(Path(work))
        else:
            stage = Stage(
                Path(work), records=pinset_env.cache_root() / "checks", releases=pinset_env.cache_root() / "releases"
            )
        pinsets = production_pinsets(options.pinsets_dir)
        if not pinsets:
            stage.problems.append("no production pin set (one without lab: true) in %s" % options.pinsets_dir)
        pairs = []
        for directory, spec in pinsets:
            pythons = locked_pythons([path.name for path in directory.iterdir()])
            locks = {python: (directory / lock_name(python)).read_text() for python in pythons}
            stage.step(
                spec["name"],
                "pinset.yml expect against %s" % ", ".join(lock_name(python) for python in pythons),
                lambda spec=spec, locks=locks: _no_problems(pinset_problems(spec, locks)),
            )
            pairs += [(directory, spec, python) for python in pythons if not options.python or python in options.python]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
            for lines in pool.map(lambda pair: stage.check_pair(*pair), pairs):
                print("\n".join(lines), flush=True)
        # Releases are read-only, as on a host: let the temporary directory go.
        subprocess.run(["chmod", "-R", "u+w", work], check=False)
    print("\npinsets stage: %.0f s" % (time.time() - start))
    for problem in stage.problems:
        print("PROBLEM " + problem.replace("\n", "\n        "))
    print("%d passed, %d failed" % (stage.passed, len(stage.problems)))
    return 1 if stage.problems else 0


def _no_problems(problems: list[str]) -> None:
    if problems:
        raise StepFailed("\n".join(problems))


if __name__ == "__main__":
    sys.exit(main())
