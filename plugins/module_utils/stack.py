# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A stack's ABI facts (gathered by a probe run with the stack's own python) and the rules that say
whether they contradict the pin set or the host.

The probe is plain Python source so it can run in any interpreter, with any (or no) torch installed;
the rules are plain functions of data, unit-tested on recorded facts.
"""

from __future__ import annotations

import re

# Run as `<stack>/bin/python -c PROBE_SOURCE '<json list of modules to import>'`; prints one JSON object.
PROBE_SOURCE = r"""
import glob, json, os, platform, re, subprocess, sys
try:
    from importlib import metadata
except ImportError:  # pragma: no cover
    metadata = None

DISTRIBUTIONS = ("torch", "sglang", "sglang-kernel", "flashinfer-python", "triton", "torchcodec", "transformers")


def error_text(exc):
    return ("%s: %s" % (type(exc).__name__, exc))[:600]


facts = {"python": platform.python_version(), "executable": sys.executable, "prefix": sys.prefix,
         "packages": {}, "imports": {}, "torch": None, "nvcc": None}
for name in DISTRIBUTIONS:
    try:
        facts["packages"][name] = metadata.version(name)
    except Exception:
        facts["packages"][name] = None

try:
    import torch
    info = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False,
            "device_count": 0, "arch_list": [], "capabilities": [], "error": None}
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            info["device_count"] = torch.cuda.device_count()
            info["arch_list"] = list(torch.cuda.get_arch_list())
            info["capabilities"] = ["%d.%d" % torch.cuda.get_device_capability(i) for i in range(info["device_count"])]
    except Exception as exc:
        info["error"] = error_text(exc)
    facts["torch"] = info
except Exception as exc:
    facts["torch"] = {"error": error_text(exc)}

for module in json.loads(sys.argv[1]) if len(sys.argv) > 1 else []:
    try:
        __import__(module)
        facts["imports"][module] = {"ok": True, "error": None}
    except BaseException as exc:
        facts["imports"][module] = {"ok": False, "error": error_text(exc)}

# nvcc: the pip wheel's (inside the stack) first, then CUDA_HOME, /usr/local/cuda, PATH.
site_packages = os.path.join(sys.prefix, "lib", "python*", "site-packages")
candidates = sorted(glob.glob(os.path.join(site_packages, "nvidia", "*", "bin", "nvcc")))
candidates += sorted(glob.glob(os.path.join(site_packages, "nvidia", "cuda_nvcc", "bin", "nvcc")))
candidates += [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"), "/usr/local/cuda/bin/nvcc"]
for path in os.environ.get("PATH", "").split(os.pathsep):
    candidates.append(os.path.join(path, "nvcc"))
for nvcc in candidates:
    if os.access(nvcc, os.X_OK):
        try:
            out = subprocess.run(
                [nvcc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60
            ).stdout.decode()
            match = re.search(r"release (\d+\.\d+)", out)
            facts["nvcc"] = {"path": nvcc, "version": match.group(1) if match else None}
        except Exception as exc:
            facts["nvcc"] = {"path": nvcc, "version": None, "error": error_text(exc)}
        break
print(json.dumps(facts))
"""


def _release(version):
    """'2.14.1+cu130' -> '2.14.1'."""
    return None if version is None else str(version).split("+", 1)[0]


def _major_minor(version):
    match = re.match(r"(\d+)\.(\d+)", str(version or ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def arch_runs_capability(arch_list, capability):
    """Whether code in torch's arch list can run on a GPU of this compute capability.

    sm_XY machine code runs on the same major at an equal or higher minor (sm_80 on an 8.6 GPU);
    compute_XY (PTX) is compiled by the driver for any GPU of capability >= X.Y.
    """
    gpu = _major_minor(capability)
    for arch in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)a?", arch)
        if not match:
            continue
        built = (int(match.group(2)), int(match.group(3)))
        if match.group(1) == "sm" and built[0] == gpu[0] and built[1] <= gpu[1]:
            return True
        if match.group(1) == "compute" and built <= gpu:
            return True
    return False


def _torch_contradictions(torch: dict, expected: dict) -> list:
    """torch imports, at the pin set's version, a CUDA build of the pin set's CUDA (or CPU-only)."""
    problems = []
    if "version" not in torch:
        problems.append("torch does not import: %s" % torch.get("error"))
    else:
        if expected.get("torch") and _release(torch["version"]) != _release(expected["torch"]):
            problems.append("torch %s in the stack, the pin set has %s" % (torch["version"], expected["torch"]))
        want_cuda = expected.get("torch_cuda")
        if want_cuda is None and torch.get("cuda"):
            problems.append("torch %s is a CUDA %s build; the pin set is CPU-only" % (torch["version"], torch["cuda"]))
        elif want_cuda is not None and torch.get("cuda") is None:
            problems.append("torch %s is a CPU build; the pin set needs CUDA %s" % (torch["version"], want_cuda))
        elif want_cuda is not None and _major_minor(torch["cuda"]) != _major_minor(want_cuda):
            problems.append(
                "torch %s is a CUDA %s build; the pin set needs CUDA %s" % (torch["version"], torch["cuda"], want_cuda)
            )
    return problems


def _import_contradictions(facts: dict, expected: dict) -> list:
    """Each module the pin set names imports in the stack, with a hint for the usual causes."""
    problems = []
    for module in expected.get("imports") or []:
        result = facts["imports"].get(module)
        if result is None:
            problems.append("%s was not probed" % module)
        elif not result["ok"]:
            hint = ""
            if module.startswith("torchcodec"):
                hint = " (torchcodec needs one complete FFmpeg release 4-8 on the host)"
            elif module.startswith("sgl_kernel"):
                hint = " (its kernels need a CUDA %s torch and a GPU it was built for)" % (
                    expected.get("torch_cuda") or "?"
                )
            problems.append("%s cannot load: %s%s" % (module, result["error"], hint))
    return problems


def stack_contradictions(facts, expected, host=None):
    """Every way the stack's facts contradict the pin set (expected) or the host; [] when none.

    expected: {"python": "3.11", "gpu": bool, "torch": "2.14.1", "torch_cuda": "13.0" or None,
               "nvcc": "13.0" (optional), "packages": {dist: version}, "imports": [module, ...]}
    host:     {"gpu_capabilities": ["12.0", ...], "driver_cuda_version": "13.0"} (GPU pin sets only)
    Each message names both sides.
    """
    problems = []
    host = host or {}
    if expected.get("python") and _major_minor(facts["python"]) != _major_minor(expected["python"]):
        problems.append("python %s in the stack, the pin set is locked for %s" % (facts["python"], expected["python"]))

    torch = facts.get("torch") or {}
    problems.extend(_torch_contradictions(torch, expected))

    for dist, version in sorted((expected.get("packages") or {}).items()):
        found = facts["packages"].get(dist)
        if found is None:
            problems.append("%s is not installed; the pin set has %s" % (dist, version))
        elif _release(found) != _release(version):
            problems.append("%s %s in the stack, the pin set has %s" % (dist, found, version))

    problems.extend(_import_contradictions(facts, expected))

    if expected.get("nvcc"):
        nvcc = facts.get("nvcc") or {}
        if not nvcc.get("version"):
            problems.append(
                "nvcc not found in the stack, CUDA_HOME, /usr/local/cuda or PATH; the pin set needs nvcc %s for "
                "SGLang's JIT" % expected["nvcc"]
            )
        elif _major_minor(nvcc["version"]) != _major_minor(expected["nvcc"]):
            problems.append(
                "nvcc %s (%s); the pin set needs %s" % (nvcc["version"], nvcc.get("path"), expected["nvcc"])
            )

    if expected.get("gpu") and "version" in torch:
        problems.extend(_gpu_contradictions(torch, host))
    return problems


def _gpu_contradictions(torch, host):
    problems = []
    capabilities = host.get("gpu_capabilities") or []
    if not torch.get("cuda_available"):
        problems.append(
            "torch %s sees no GPU (torch.cuda.is_available() is false%s) on a host with %d GPU(s)"
            % (torch["version"], ": " + torch["error"] if torch.get("error") else "", len(capabilities))
        )
        return problems
    if capabilities and torch.get("device_count") != len(capabilities):
        problems.append("torch sees %s GPU(s), nvidia-smi lists %d" % (torch.get("device_count"), len(capabilities)))
    for index, capability in enumerate(capabilities):
        if not arch_runs_capability(torch.get("arch_list") or [], capability):
            problems.append(
                "GPU %d has compute capability %s (sm_%s), which torch %s's arch list %s cannot run"
                % (
                    index,
                    capability,
                    capability.replace(".", ""),
                    torch["version"],
                    " ".join(torch.get("arch_list") or []),
                )
            )
    driver_cuda = host.get("driver_cuda_version")
    if driver_cuda and torch.get("cuda") and _major_minor(driver_cuda) < _major_minor(torch["cuda"]):
        problems.append(
            "the driver supports CUDA %s, older than the CUDA %s torch %s is built for"
            % (driver_cuda, torch["cuda"], torch["version"])
        )
    return problems
