"""Every pin set's `expect` (what stack_verify proves on a host) agrees with what its locks install."""

from pathlib import Path

import pytest
import yaml

from ansible_collections.ddtree.sglang.plugins.module_utils import pinset

PINSETS = Path(__file__).resolve().parents[4] / "roles" / "sglang_stack" / "files" / "pinsets"
HASH = "--hash=sha256:" + "0" * 64


def read_pinset(directory):
    spec = yaml.safe_load((directory / "pinset.yml").read_text())
    files = sorted(path.name for path in directory.iterdir())
    locks = {python: (directory / pinset.lock_name(python)).read_text() for python in pinset.locked_pythons(files)}
    return spec, locks


@pytest.mark.parametrize("directory", sorted(PINSETS.iterdir()), ids=lambda path: path.name)
def test_every_shipped_pinset_expects_what_its_locks_install(directory):
    spec, locks = read_pinset(directory)
    assert spec["name"] == directory.name
    assert locks, "%s has no lock" % directory.name
    assert pinset.pinset_problems(spec, locks) == []


def test_there_is_a_production_pinset_and_a_lab_one():
    kinds = {path.name: pinset.is_lab_pinset(read_pinset(path)[0]) for path in PINSETS.iterdir()}
    assert kinds["lab-cpu"] is True and kinds["cu130"] is False


def lock(*pins):
    return "# header\n" + "".join("%s \\\n    %s\n" % (pin, HASH) for pin in pins)


CUDA_SPEC = {
    "name": "x",
    "python": "3.11",
    "glibc": "2.35",
    "expect": {
        "python": "3.11",
        "gpu": True,
        "torch": "2.14.1",
        "torch_cuda": "13.0",
        "nvcc": "13.0",
        "packages": {"sglang": "0.5.23", "flashinfer-python": "0.7.2"},
    },
}
CUDA_LOCK = lock(
    "flashinfer_python==0.7.2",
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "sglang==0.5.23",
    "torch==2.14.1",
)


def test_lock_pins_reads_names_versions_and_hashes():
    pins = pinset.lock_pins(CUDA_LOCK)
    assert pins["flashinfer-python"] == ("0.7.2", ["0" * 64])
    assert pins["torch"][0] == "2.14.1"


def test_lock_pins_rejects_a_package_pinned_twice():
    with pytest.raises(ValueError, match="pinned twice"):
        pinset.lock_pins(lock("numpy==2.3.5", "NumPy==2.4.6"))


def test_locked_pythons_from_file_names():
    assert pinset.locked_pythons(
        ["pinset.yml", "requirements-py312.lock", "requirements.in", "requirements-py311.lock"]
    ) == ["3.11", "3.12"]


@pytest.mark.parametrize(
    "pins, cuda",
    [
        ({"torch": ("2.13.0+cpu", [])}, None),
        ({"torch": ("2.7.0+cu128", [])}, "12.8"),
        ({"torch": ("2.14.1", []), "nvidia-cuda-runtime": ("13.0.96", [])}, "13.0"),
        ({"torch": ("2.8.0", []), "nvidia-cuda-runtime-cu12": ("12.8.90", [])}, "12.8"),
    ],
)
def test_lock_torch_cuda(pins, cuda):
    assert pinset.lock_torch_cuda(pins)[0] == cuda


def test_lock_torch_cuda_unknown_build_is_an_error():
    with pytest.raises(ValueError, match="no CUDA runtime wheel"):
        pinset.lock_torch_cuda({"torch": ("2.14.1", [])})


def test_a_consistent_pinset_has_no_problems():
    assert pinset.pinset_problems(CUDA_SPEC, {"3.11": CUDA_LOCK}) == []


def test_a_version_that_drifted_is_named_with_both_sides():
    drifted = CUDA_LOCK.replace("sglang==0.5.23", "sglang==0.5.24")
    assert pinset.pinset_problems(CUDA_SPEC, {"3.11": drifted}) == [
        "pin set x: requirements-py311.lock: expect has sglang 0.5.23, the lock has sglang==0.5.24; "
        "make pinset.yml and requirements.in agree, then re-lock"
    ]


def test_a_missing_package_and_a_wrong_cuda_build_are_named():
    cu128 = lock(
        "flashinfer_python==0.7.2", "nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-runtime-cu12==12.8.90", "torch==2.14.1"
    )
    problems = pinset.pinset_problems(CUDA_SPEC, {"3.11": cu128})
    assert "pin set x: requirements-py311.lock: expect has sglang 0.5.23, the lock does not install sglang" in problems
    assert (
        "pin set x: requirements-py311.lock: expect has torch_cuda 13.0, the lock's torch is a CUDA 12.8 build "
        "(nvidia-cuda-runtime-cu12==12.8.90)"
    ) in problems


def test_a_cpu_torch_in_a_gpu_pinset_and_the_wrong_nvcc():
    cpu = CUDA_LOCK.replace("torch==2.14.1", "torch==2.14.1+cpu").replace(
        "nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-nvcc==13.2.51"
    )
    problems = pinset.pinset_problems(CUDA_SPEC, {"3.11": cpu})
    assert problems == [
        "pin set x: requirements-py311.lock: expect has torch_cuda 13.0, the lock's torch is a CPU build (torch==2.14.1+cpu)",
        "pin set x: requirements-py311.lock: expect has nvcc 13.0, the lock has nvidia-cuda-nvcc==13.2.51",
    ]


def test_a_pin_without_hash_and_a_python_without_lock():
    spec = dict(CUDA_SPEC, python="3.12")
    no_hash = CUDA_LOCK.replace("sglang==0.5.23 \\\n    %s\n" % HASH, "sglang==0.5.23\n")
    problems = pinset.pinset_problems(spec, {"3.11": no_hash})
    assert problems == [
        "pin set x: pinset.yml python is 3.12, but it is locked only for 3.11",
        "pin set x: requirements-py311.lock: sglang==0.5.23 has no --hash; the role installs with --require-hashes",
    ]


def test_gpu_claim_must_match_the_cuda_build():
    spec = dict(CUDA_SPEC, expect=dict(CUDA_SPEC["expect"], gpu=False))
    assert pinset.pinset_problems(spec, {"3.11": CUDA_LOCK}) == [
        "pin set x: expect has gpu False with torch_cuda 13.0: a GPU pin set needs a CUDA torch, a CPU one a CPU torch"
    ]


def test_no_lock_at_all():
    assert pinset.pinset_problems(CUDA_SPEC, {}) == [
        "pin set x has no requirements-py3XY.lock; lock it with scripts/lock-pinset"
    ]
