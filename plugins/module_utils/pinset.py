# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pin sets: which wheels fit a host, and the pip commands that fetch and install exactly a lock."""

from __future__ import annotations

import hashlib
import re

PIP_NO_RESOLVE = ["--require-hashes", "--no-deps", "--only-binary=:all:"]


def wheel_platforms(glibc):
    """Wheel platform tags an x86_64 host with this glibc (e.g. "2.36") accepts, newest first."""
    major, minor = (int(part) for part in str(glibc).split(".")[:2])
    if major != 2 or minor < 17:
        raise ValueError("glibc %r: expected a version like 2.36 (2.17 or later)" % (glibc,))
    tags = ["manylinux_2_%d_x86_64" % value for value in range(minor, 16, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def lock_name(python):
    """'3.11' or '3.11.2' -> 'requirements-py311.lock'."""
    major, minor = str(python).split(".")[:2]
    return "requirements-py%s%s.lock" % (major, minor)


def stack_id(pinset, lock_text):
    """A stack's id: the short sha256 of its pin set's name and resolved lock (so, of every pin and hash)."""
    return hashlib.sha256(("%s\n%s" % (pinset, lock_text)).encode("utf-8")).hexdigest()[:12]


def download_command(python_executable, lock, dest, python, glibc, index_url=None, extra_index_urls=()):
    """pip download of exactly the lock's files for the target Python and glibc."""
    command = [python_executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet"] + PIP_NO_RESOLVE
    command += ["--python-version", python, "--implementation", "cp", "--dest", dest, "-r", lock]
    for platform in wheel_platforms(glibc):
        command += ["--platform", platform]
    if index_url:
        command += ["--index-url", index_url]
    for url in extra_index_urls:
        command += ["--extra-index-url", url]
    return command


def install_command(stack_python, lock, wheelhouse=None, index_url=None, extra_index_urls=()):
    """pip install of exactly the lock into a stack: offline from a wheelhouse, or from indexes."""
    command = [stack_python, "-m", "pip", "install", "--disable-pip-version-check", "--no-cache-dir"] + PIP_NO_RESOLVE
    if wheelhouse:
        command += ["--no-index", "--find-links", wheelhouse]
    else:
        if index_url:
            command += ["--index-url", index_url]
        for url in extra_index_urls:
            command += ["--extra-index-url", url]
    return command + ["-r", lock]


# A lock line starts "name==version"; its hashes follow as "--hash=sha256:<hex>" (same or next lines).
_LOCK_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_LOCK_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_LOCK_FILE = re.compile(r"^requirements-py(\d)(\d+)\.lock$")
# CUDA runtime wheels, one per CUDA generation, that PyPI's torch depends on (CUDA 13 dropped the suffix).
_CUDA_RUNTIMES = (
    "nvidia-cuda-runtime",
    "nvidia-cuda-runtime-cu13",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-runtime-cu11",
)


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them: 'Mistral_Common' -> 'mistral-common'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str) -> dict[str, tuple[str, list[str]]]:
    """{canonical name: (version, [sha256, ...])} of a lock's text, in the format scripts/lock-pinset writes."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LOCK_PIN.match(stripped)
        if match:
            current = canonical_name(match.group(1))
            if current in pins:
                raise ValueError("%s is pinned twice in the lock" % match.group(1))
            pins[current] = (match.group(2), [])
        elif current is None:
            raise ValueError("lock line %r is not a 'name==version' pin" % stripped)
        pins[current][1].extend(_LOCK_HASH.findall(stripped))
    return pins


def locked_pythons(filenames: list[str]) -> list[str]:
    """The Python versions a pin set is locked for, from its files: ['requirements-py311.lock'] -> ['3.11']."""
    found = []
    for name in filenames:
        match = _LOCK_FILE.match(name)
        if match:
            found.append((int(match.group(1)), int(match.group(2))))
    return ["%d.%d" % version for version in sorted(found)]


def is_lab_pinset(spec: dict) -> bool:
    """Whether a pin set (its pinset.yml) is the lab's; every other pin set is production and tested as such."""
    return spec.get("lab") is True


def _major_minor(version: str) -> str:
    return ".".join(str(version).split("+", 1)[0].split(".")[:2])


def lock_torch_cuda(pins: dict[str, tuple[str, list[str]]]) -> tuple[str | None, str]:
    """torch's CUDA build as the lock decides it, and the evidence: ('13.0', 'nvidia-cuda-runtime==13.0.96').

    torch's local label says it when there is one (+cpu, +cu128); PyPI's torch has none and brings its
    CUDA runtime as a wheel, whose version is the CUDA build. Raises ValueError when the lock has no torch
    or nothing tells its build.
    """
    if "torch" not in pins:
        raise ValueError("the lock has no torch")
    version = pins["torch"][0]
    label = version.split("+", 1)[1] if "+" in version else ""
    if label == "cpu":
        return None, "torch==%s" % version
    match = re.fullmatch(r"cu(\d+)(\d)", label)
    if match:
        return "%s.%s" % (match.group(1), match.group(2)), "torch==%s" % version
    for runtime in _CUDA_RUNTIMES:
        if runtime in pins:
            return _major_minor(pins[runtime][0]), "%s==%s" % (runtime, pins[runtime][0])
    raise ValueError(
        "torch==%s has no local label (+cpu, +cuXYZ) and the lock has no CUDA runtime wheel (%s)"
        % (version, ", ".join(_CUDA_RUNTIMES))
    )


def expect_lock_problems(spec: dict, pins: dict[str, tuple[str, list[str]]], python: str) -> list[str]:
    """Every way a pin set's `expect` (pinset.yml) disagrees with what its lock for `python` installs; [] when none.

    stack_verify proves `expect` on the host; this proves, before any host, that the lock can satisfy it.
    """
    lock = lock_name(python)
    expect = spec.get("expect") or {}
    problems = []
    pinned = dict(expect.get("packages") or {})
    if expect.get("torch") is not None:
        pinned["torch"] = expect["torch"]
    for dist, version in sorted(pinned.items()):
        found = pins.get(canonical_name(dist))
        if found is None:
            problems.append("%s: expect has %s %s, the lock does not install %s" % (lock, dist, version, dist))
        elif found[0].split("+", 1)[0] != str(version).split("+", 1)[0]:
            problems.append(
                "%s: expect has %s %s, the lock has %s==%s; make pinset.yml and requirements.in agree, then re-lock"
                % (lock, dist, version, dist, found[0])
            )
    if "torch" in pins:
        try:
            cuda, evidence = lock_torch_cuda(pins)
        except ValueError as error:
            problems.append("%s: %s" % (lock, error))
        else:
            want = expect.get("torch_cuda")
            if (want is None) != (cuda is None) or (want is not None and _major_minor(want) != cuda):
                problems.append(
                    "%s: expect has torch_cuda %s, the lock's torch is a %s build (%s)"
                    % (lock, want, "CPU" if cuda is None else "CUDA %s" % cuda, evidence)
                )
    if bool(expect.get("gpu")) != (expect.get("torch_cuda") is not None):
        problems.append(
            "expect has gpu %s with torch_cuda %s: a GPU pin set needs a CUDA torch, a CPU one a CPU torch"
            % (expect.get("gpu"), expect.get("torch_cuda"))
        )
    if expect.get("nvcc"):
        nvcc = pins.get("nvidia-cuda-nvcc")
        if nvcc is None:
            problems.append(
                "%s: expect has nvcc %s, the lock has no nvidia-cuda-nvcc (nvcc then must come from the host)"
                % (lock, expect["nvcc"])
            )
        elif _major_minor(nvcc[0]) != _major_minor(expect["nvcc"]):
            problems.append(
                "%s: expect has nvcc %s, the lock has nvidia-cuda-nvcc==%s" % (lock, expect["nvcc"], nvcc[0])
            )
    for name, (version, hashes) in sorted(pins.items()):
        if not hashes:
            problems.append("%s: %s==%s has no --hash; the role installs with --require-hashes" % (lock, name, version))
    return problems


def pinset_problems(spec: dict, locks: dict[str, str]) -> list[str]:
    """Every problem of a pin set (its pinset.yml as data) with its locks ({python: lock text}); [] when none."""
    name = spec.get("name", "?")
    problems = []
    if not locks:
        return ["pin set %s has no requirements-py3XY.lock; lock it with scripts/lock-pinset" % name]
    for key in ("python", "expect.python"):
        value = spec.get("python") if key == "python" else (spec.get("expect") or {}).get("python")
        if value is not None and _major_minor(value) not in locks:
            problems.append(
                "pin set %s: pinset.yml %s is %s, but it is locked only for %s"
                % (name, key, value, ", ".join(sorted(locks)))
            )
    try:
        wheel_platforms(spec.get("glibc"))
    except (ValueError, TypeError) as error:
        problems.append("pin set %s: pinset.yml glibc: %s" % (name, error))
    for python, text in sorted(locks.items()):
        try:
            pins = lock_pins(text)
        except ValueError as error:
            problems.append("pin set %s: %s: %s" % (name, lock_name(python), error))
            continue
        problems.extend("pin set %s: %s" % (name, problem) for problem in expect_lock_problems(spec, pins, python))
    return problems
