"""Lock a pin set (see scripts/lock-pinset): resolve, then install the candidate lock as the role does and
write it only when it installs, passes `pip check` and satisfies pinset.yml's `expect`."""

import hashlib
import json
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections"))
from ansible_collections.ddtree.sglang.plugins.module_utils.pinset import (
    expect_lock_problems,
    lock_name,
    lock_pins,
    wheel_platforms,
)  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pinset_env  # noqa: E402


def resolve(requirements, python, glibc, no_deps, extra_args, interpreter):
    """pip's resolution of the requirement lines: [(name, version, sha256)].

    pip runs under `interpreter` (--python), a real CPython of the target version: --python-version
    only selects wheels, while environment markers (numpy<2.4; python_version <= "3.12") are evaluated
    against the interpreter that runs the resolver.
    """
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp, "req.txt")
        req.write_text("\n".join(requirements) + "\n")
        report = Path(tmp, "report.json")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            interpreter,
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "--only-binary=:all:",
            "--python-version",
            python,
            "--implementation",
            "cp",
            "--target",
            str(Path(tmp, "target")),
            "-r",
            str(req),
        ]
        for platform in wheel_platforms(glibc):
            cmd += ["--platform", platform]
        if no_deps:
            cmd.append("--no-deps")
        subprocess.run(cmd + extra_args, check=True)
        locked = []
        for item in json.loads(report.read_text())["install"]:
            meta, info = item["metadata"], item["download_info"]
            sha = (info.get("archive_info", {}).get("hashes") or {}).get("sha256")
            if sha is None:  # a local file from find-links: hash it ourselves
                path = urllib.parse.unquote(urllib.parse.urlparse(info["url"]).path)
                sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            locked.append((meta["name"], meta["version"], sha))
        return locked


def verify(candidate, spec, python, interpreter):
    """Why the candidate lock must not be written: [] when it installs like the role installs it, passes
    `pip check` (unless the pin set installs packages without their dependencies) and matches `expect`."""
    try:
        problems = expect_lock_problems(spec, lock_pins(candidate.read_text()), python)
    except ValueError as error:
        problems = [str(error)]
    wheels = pinset_env.wheelhouse(candidate, python, spec["glibc"], spec["name"])
    venv = pinset_env.stack_venv(candidate, interpreter, wheels, spec["name"])
    if spec.get("install_without_dependencies"):
        print(
            "pip check skipped: %s installed without dependencies (as the role does)"
            % ", ".join(spec["install_without_dependencies"])
        )
    else:
        passed, output = pinset_env.pip_check(venv)
        print("pip check (Python %s, %s):\n%s" % (python, venv, output))
        if not passed:
            problems.append("pip check fails in a venv installed from it:\n%s" % output)
    return problems


def main(pinset_dir, python):
    pinset_dir = Path(pinset_dir)
    interpreter = pinset_env.find_python(python)
    spec = yaml.safe_load((pinset_dir / "pinset.yml").read_text())
    lines = [
        line.strip()
        for line in (pinset_dir / "requirements.in").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    no_deps = set(spec.get("install_without_dependencies", []))
    extra = []
    for url in spec.get("lock_extra_index_urls", []):
        extra += ["--extra-index-url", url]
    with_deps = [line for line in lines if line.split("==")[0].split("[")[0] not in no_deps]
    without_deps = [line for line in lines if line.split("==")[0].split("[")[0] in no_deps]
    locked = {}
    for requirements, flag in ((with_deps, False), (without_deps, True)):
        if requirements:
            for name, version, sha in resolve(requirements, python, spec["glibc"], flag, extra, interpreter):
                locked[name.lower()] = (name, version, sha)
    out = pinset_dir / lock_name(python)
    header = [
        "# Pin set %s for CPython %s on x86_64 Linux with glibc >= %s, locked by scripts/lock-pinset from "
        "requirements.in." % (spec["name"], python, spec["glibc"]),
        "# Install with: pip install --require-hashes --no-deps --only-binary=:all: -r %s" % out.name,
        "# %s" % ", ".join(sorted(no_deps)) + " resolved without their dependencies (see pinset.yml)."
        if no_deps
        else "#",
    ]
    body = [
        "%s==%s \\\n    --hash=sha256:%s" % (name, version, sha)
        for name, version, sha in sorted(locked.values(), key=lambda v: v[0].lower())
    ]
    text = "\n".join(header + body) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        candidate = Path(tmp, out.name)
        candidate.write_text(text)
        try:
            problems = verify(candidate, spec, python, interpreter)
        except RuntimeError as error:
            problems = [str(error)]
    if problems:
        sys.exit(
            "%s NOT written; the resolved lock:\n- %s\nFix requirements.in (a constraint) or pinset.yml and lock again."
            % (out, "\n- ".join(problems))
        )
    out.write_text(text)
    print("%s: %d packages, installed and checked with %s" % (out, len(locked), interpreter))


if __name__ == "__main__":
    main(*sys.argv[1:])
