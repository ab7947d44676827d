"""Install a pin set's lock the way roles/sglang_stack installs it, with caches (scripts/lock-pinset, tests/pinsets).

- find_python("3.11"): an interpreter of that version (the system's first, then pyenv's).
- wheelhouse(...): the lock's wheels, downloaded once per lock with hashes checked (the wheelhouse
  module's command), under $DDTREE_CACHE/pinsets/wheelhouse/.
- stack_venv(...): a venv made by `python -m venv` and the role's install command (--no-index
  --require-hashes --no-deps --only-binary from the wheelhouse), cached by (lock sha256, interpreter,
  install recipe) under $DDTREE_CACHE/pinsets/venv/.
- pip_check(venv): the role's consistency check.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections"))
from ansible_collections.ddtree.sglang.plugins.module_utils.pinset import (  # noqa: E402
    canonical_name,
    download_command,
    install_command,
    lock_pins,
)

# Caches unused for this long are removed when another one of their kind is used (a re-lock leaves the
# old 4 GB wheelhouse and 10 GB venv behind).
STALE_DAYS = 14
# pip warns once per package for local index directories named in this machine's pip config that do
# not exist; the warning says nothing about the install.
PIP_NOISE = re.compile(r"is ignored: it is neither a file nor a directory")


def log(message: str) -> None:
    print("==> %s" % message, file=sys.stderr, flush=True)


def cache_root() -> Path:
    """$DDTREE_CACHE/pinsets (the cache folder's rule lives once, in plugin_utils/cache.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections"))
    from ansible_collections.ddtree.sglang.plugins.plugin_utils.cache import cache_dir  # pylint: disable=import-outside-toplevel

    return Path(cache_dir("pinsets"))


def run(command: list[str], what: str, env: dict | None = None) -> str:
    """Run a command; on failure raise RuntimeError naming what failed with the output's tail."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, check=False)
    output = "\n".join(line for line in done.stdout.splitlines() if not PIP_NOISE.search(line))
    if done.returncode != 0:
        raise RuntimeError("%s failed (exit %d):\n%s" % (what, done.returncode, output.strip()[-4000:]))
    return output


def interpreter_version(python: str) -> str | None:
    """'3.11.2' when python runs, can make venvs and is not itself in a venv (a host's python never is), else None."""
    try:
        done = subprocess.run(
            [
                python,
                "-c",
                "import ensurepip, sys, venv; assert sys.prefix == sys.base_prefix; "
                "print('%d.%d.%d' % sys.version_info[:3])",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python(version: str) -> str:
    """An interpreter of this major.minor that can make venvs: DDTREE_PYTHON_<XY>, then PATH (without
    pyenv's shims, which run whatever pyenv selects), then pyenv's versions, newest patch first."""
    short = version.replace(".", "")
    candidates = [os.environ.get("DDTREE_PYTHON_%s" % short, "")]
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if directory and "shims" not in Path(directory).parts:
            candidates.append(os.path.join(directory, "python%s" % version))
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    patches = sorted(
        pyenv.glob("%s.*" % version), key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)], reverse=True
    )
    candidates += [str(path / "bin" / ("python%s" % version)) for path in patches]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            found = interpreter_version(candidate)
            if found and found.rsplit(".", 1)[0] == version:
                return candidate
    raise RuntimeError(
        "no Python %s that can make venvs found (looked at DDTREE_PYTHON_%s, python%s on PATH, %s/%s.*); "
        "install it or set DDTREE_PYTHON_%s=/path/to/python%s"
        % (version, short, version, pyenv, version, short, version)
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def touch_and_prune(current: Path) -> None:
    """Mark a cache entry used now; remove its siblings unused for STALE_DAYS."""
    (current / ".last-used").touch()
    for other in current.parent.iterdir():
        if other == current or not other.is_dir():
            continue
        stamp = other / ".last-used"
        if unused_for_long(stamp if stamp.exists() else other):
            remove_entry(other)


def stamp_and_prune(stamp: Path, entries: Path) -> None:
    """The same for entries that must not be written into (releases): `stamp` is a file of its own, beside
    the others in its folder, named as its entry in `entries`; a stale stamp's entry goes, then the stamp."""
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    for other in stamp.parent.iterdir():
        if other != stamp and unused_for_long(other):
            remove_entry(entries / other.name)
            other.unlink(missing_ok=True)


def unused_for_long(path: Path) -> bool:
    return time.time() - path.stat().st_mtime > STALE_DAYS * 86400


def remove_entry(entry: Path) -> None:
    log("removing %s (unused for %d days)" % (entry, STALE_DAYS))
    make_writable(entry)
    shutil.rmtree(entry, ignore_errors=True)


def make_writable(path: Path) -> None:
    subprocess.run(["chmod", "-R", "u+w", str(path)], check=False)


class Locked:
    """An exclusive flock on <path>.lock for one builder of a cache entry at a time."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".lock")

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.handle.close()


def wheel_pin(filename: str) -> tuple[str, str]:
    """('torch', '2.14.1') of 'torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl'."""
    name, version = filename.split("-")[:2]
    return canonical_name(name), version


def wheel_fits_python(filename: str, python: str) -> bool:
    """Whether CPython `python` ('3.12') accepts a wheel's Python tag, as pip does: py3, py3X or cp3X-abi3
    with X <= 12, cp312."""
    python_tags, abi_tags = filename[: -len(".whl")].split("-")[-3:-1]
    target = int(python.split(".")[1])
    for tag in python_tags.split("."):
        match = re.fullmatch(r"(py|cp)3(\d*)", tag)
        if not match:
            continue
        minor = int(match.group(2)) if match.group(2) else None
        if match.group(1) == "py" and (minor is None or minor <= target):
            return True
        if (
            match.group(1) == "cp"
            and minor is not None
            and (minor == target or ("abi3" in abi_tags.split(".") and minor <= target))
        ):
            return True
    return False


def seed_from_siblings(dest: Path, pins: dict, python: str) -> int:
    """Hard-link wheels this lock pins from other complete wheelhouses (a re-lock changes few wheels).

    pip download checks the hash of every file already in dest (--require-hashes) and fetches again any
    that does not match, so a seeded file is as trusted as a downloaded one.
    """
    linked = 0
    for other in sorted(dest.parent.iterdir()):
        if other == dest or not (other / ".complete").exists():
            continue
        for wheel in other.glob("*.whl"):
            pin = wheel_pin(wheel.name)
            target = dest / wheel.name
            if pins.get(pin[0], ("",))[0] == pin[1] and wheel_fits_python(wheel.name, python) and not target.exists():
                try:
                    os.link(wheel, target)
                except OSError:
                    shutil.copy2(wheel, target)
                linked += 1
    return linked


def wheelhouse(lock: Path, python: str, glibc: str, label: str) -> Path:
    """The lock's wheels for CPython `python` and this glibc, downloaded once (hash-checked) and cached."""
    pins = lock_pins(lock.read_text())
    dest = cache_root() / "wheelhouse" / ("%s-py%s-%s" % (label, python.replace(".", ""), file_sha256(lock)[:16]))
    with Locked(dest):
        if not (dest / ".complete").exists():
            dest.mkdir(parents=True, exist_ok=True)
            seeded = seed_from_siblings(dest, pins, python)
            start = time.time()
            log(
                "downloading %d wheels of %s for Python %s into %s (%d already here from other wheelhouses)"
                % (len(pins), lock, python, dest, seeded)
            )
            run(download_command(sys.executable, str(lock), str(dest), python, glibc), "pip download of %s" % lock)
            size = sum(path.stat().st_size for path in dest.glob("*.whl"))
            log(
                "wheelhouse %s: %d wheels, %.2f GB, %.0f s"
                % (dest.name, len(list(dest.glob("*.whl"))), size / 1e9, time.time() - start)
            )
            (dest / ".complete").write_text(str(lock) + "\n")
        touch_and_prune(dest)
    return dest


def install_recipe() -> list[str]:
    """The role's steps with placeholders: part of the venv cache key, so a changed recipe rebuilds."""
    return [
        ["PYTHON", "-m", "venv", "STACK"],
        install_command("STACK/bin/python", "STACK/ddtree-stack.lock", wheelhouse="WHEELHOUSE"),
    ]


def stack_venv(lock: Path, interpreter: str, wheels: Path, label: str) -> Path:
    """A venv holding exactly the lock, installed as roles/sglang_stack/tasks/build.yml installs it; cached."""
    version = interpreter_version(interpreter)
    key = hashlib.sha256(
        json.dumps([file_sha256(lock), os.path.realpath(interpreter), version, install_recipe()]).encode()
    ).hexdigest()
    venv = cache_root() / "venv" / ("%s-py%s-%s" % (label, version.replace(".", "")[:3], key[:16]))
    with Locked(venv):
        if not (venv / ".complete").exists():
            start = time.time()
            if venv.exists():
                log("removing %s (an interrupted install)" % venv)
                make_writable(venv)
                shutil.rmtree(venv)
            log("installing %s with %s (Python %s) into %s" % (lock, interpreter, version, venv))
            run([interpreter, "-m", "venv", str(venv)], "creating the venv %s" % venv)
            shutil.copyfile(lock, venv / "ddtree-stack.lock")
            run(
                install_command(str(venv / "bin" / "python"), str(venv / "ddtree-stack.lock"), wheelhouse=str(wheels)),
                "installing %s offline from %s" % (lock, wheels),
            )
            # The marker is written last, so a half-built venv is never reused. (The role also makes the
            # stack read-only; the checks here run with PYTHONDONTWRITEBYTECODE=1 and write nothing.)
            (venv / ".complete").write_text("%s\n%s\n" % (lock, interpreter))
            log("installed in %.0f s" % (time.time() - start))
        # The role's completion marker too: the recorded checks record nothing for a stack without one. (Also
        # for a venv cached before this marker was written here.)
        from ansible_collections.ddtree.sglang.plugins.module_utils.layout import STACK_MARKER  # pylint: disable=import-outside-toplevel

        marker = venv / STACK_MARKER
        if not marker.exists():
            marker.write_text(
                json.dumps({"lock": lock.name, "lock_sha256": file_sha256(lock), "interpreter": interpreter}) + "\n"
            )
        touch_and_prune(venv)
    return venv


def pip_check(venv: Path) -> tuple[bool, str]:
    """The role's `pip check`: (passed, its output)."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "check", "--disable-pip-version-check"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1"),
        check=False,
    )
    return done.returncode == 0, done.stdout.strip()
