"""scripts/pinset_env.py: finding a Python per version, and seeding a wheelhouse from earlier ones (no pip runs here)."""

import importlib.util
import os
import stat
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "pinset_env.py"


@pytest.fixture(scope="module")
def env():
    spec = importlib.util.spec_from_file_location("pinset_env", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_python(path, version):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho %s\n" % version)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_find_python_skips_shims_and_wrong_versions(env, tmp_path, monkeypatch):
    fake_python(tmp_path / "shims" / "python3.12", "3.12.9")
    fake_python(tmp_path / "bin" / "python3.12", "3.11.2")  # a misnamed interpreter is not taken
    pyenv = tmp_path / "pyenv"
    fake_python(pyenv / "versions" / "3.12.1" / "bin" / "python3.12", "3.12.1")
    fake_python(pyenv / "versions" / "3.12.10" / "bin" / "python3.12", "3.12.10")
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path / "shims", tmp_path / "bin"))
    monkeypatch.setenv("PYENV_ROOT", str(pyenv))
    monkeypatch.delenv("DDTREE_PYTHON_312", raising=False)
    assert env.find_python("3.12") == str(pyenv / "versions" / "3.12.10" / "bin" / "python3.12")
    monkeypatch.setenv("DDTREE_PYTHON_312", str(pyenv / "versions" / "3.12.1" / "bin" / "python3.12"))
    assert env.find_python("3.12") == str(pyenv / "versions" / "3.12.1" / "bin" / "python3.12")


def test_find_python_names_the_override_when_none_is_found(env, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "none"))
    with pytest.raises(RuntimeError, match="set DDTREE_PYTHON_39=/path/to/python3.9"):
        env.find_python("3.9")


def test_wheel_pin(env):
    assert env.wheel_pin("Mistral_Common-1.13.1-py3-none-any.whl") == ("mistral-common", "1.13.1")
    assert env.wheel_pin("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch", "2.14.1")


def test_seed_links_only_pinned_versions_from_complete_wheelhouses(env, tmp_path):
    old, partial, new = tmp_path / "old", tmp_path / "partial", tmp_path / "new"
    for directory in (old, partial, new):
        directory.mkdir()
    (old / ".complete").write_text("")
    for name in (
        "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl",
        "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl",
    ):
        (old / name).write_text(name)
    (partial / "sglang-0.5.23-py3-none-any.whl").write_text("x")
    pins = {"numpy": ("2.3.5", []), "torch": ("2.14.1", []), "sglang": ("0.5.23", [])}
    assert env.seed_from_siblings(new, pins, "3.11") == 1
    assert sorted(os.listdir(new)) == ["torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"]
    other = tmp_path / "py312"
    other.mkdir()
    assert env.seed_from_siblings(other, pins, "3.12") == 0  # a cp311 wheel is no use to 3.12


@pytest.mark.parametrize(
    "name, python, fits",
    [
        ("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "3.11", True),
        ("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "3.12", False),
        ("six-1.17.0-py2.py3-none-any.whl", "3.12", True),
        ("nvidia_cublas-13.1.1.3-py3-none-manylinux_2_27_x86_64.whl", "3.12", True),
        ("cryptography-46.0.1-cp311-abi3-manylinux_2_34_x86_64.whl", "3.12", True),
        ("cryptography-46.0.1-cp311-abi3-manylinux_2_34_x86_64.whl", "3.10", False),
        ("interegular-0.3.3-py37-none-any.whl", "3.12", True),
        ("multiprocess-0.70.19-py312-none-any.whl", "3.12", True),
        ("multiprocess-0.70.19-py312-none-any.whl", "3.11", False),
    ],
)
def test_wheel_fits_python(env, name, python, fits):
    assert env.wheel_fits_python(name, python) is fits


def test_stamped_entries_go_only_when_their_stamp_is_stale(env, tmp_path):
    """Releases are never written into: a stamp beside them says when each was last used."""
    releases, stamps = tmp_path / "releases", tmp_path / "releases-used"
    for name in ("used-now", "used-lately", "stale"):
        (releases / name / "site").mkdir(parents=True)
        (releases / name / "site" / "x.py").write_text("x = 1\n")
        (releases / name / "site").chmod(0o555)  # read-only, as a release is
    stamps.mkdir()
    for name, days in (("used-lately", 1), ("stale", env.STALE_DAYS + 1)):
        (stamps / name).touch()
        old = (stamps / name).stat().st_mtime - days * 86400
        os.utime(stamps / name, (old, old))
    env.stamp_and_prune(stamps / "used-now", releases)
    assert sorted(path.name for path in releases.iterdir()) == ["used-lately", "used-now"]
    assert sorted(path.name for path in stamps.iterdir()) == ["used-lately", "used-now"]
    assert not (releases / "used-now" / ".last-used").exists()  # nothing written into a release
