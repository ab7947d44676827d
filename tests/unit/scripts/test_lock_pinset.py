"""scripts/lock_pinset.py writes a lock only when it installs, passes pip check and matches expect (pip and venvs mocked)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "lock_pinset.py"
PINSET = """name: demo
python: "3.11"
glibc: "2.35"
install_without_dependencies: []
expect:
  python: "3.11"
  gpu: false
  torch: 2.13.0
  torch_cuda: null
  packages: {numpy: 2.3.5}
"""


@pytest.fixture
def lock_pinset(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("lock_pinset_cli", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = module.pinset_env
    monkeypatch.setattr(env, "find_python", lambda version: "/usr/bin/python" + version)
    monkeypatch.setattr(env, "wheelhouse", lambda lock, python, glibc, label: tmp_path / "wheels")
    monkeypatch.setattr(env, "stack_venv", lambda lock, interpreter, wheels, label: tmp_path / "venv")
    monkeypatch.setattr(env, "pip_check", lambda venv: (True, "No broken requirements found."))
    pinset = tmp_path / "demo"
    pinset.mkdir()
    (pinset / "pinset.yml").write_text(PINSET)
    (pinset / "requirements.in").write_text("torch==2.13.0+cpu\nnumpy==2.3.5\n")
    return module, pinset


def resolved(numpy):
    return lambda requirements, python, glibc, no_deps, extra, interpreter: [
        ("numpy", numpy, "a" * 64),
        ("torch", "2.13.0+cpu", "b" * 64),
    ]


def test_a_lock_that_passes_is_written(lock_pinset, monkeypatch):
    module, pinset = lock_pinset
    monkeypatch.setattr(module, "resolve", resolved("2.3.5"))
    module.main(str(pinset), "3.11")
    text = (pinset / "requirements-py311.lock").read_text()
    assert "numpy==2.3.5 \\\n    --hash=sha256:" + "a" * 64 in text


def test_a_lock_that_fails_pip_check_is_not_written(lock_pinset, monkeypatch):
    module, pinset = lock_pinset
    monkeypatch.setattr(module, "resolve", resolved("2.3.5"))
    message = (
        'mistral-common 1.13.1 has requirement numpy<2.4,>=1.25; python_version <= "3.12", but you have numpy 2.4.6.'
    )
    monkeypatch.setattr(module.pinset_env, "pip_check", lambda venv: (False, message))
    with pytest.raises(SystemExit) as exit_info:
        module.main(str(pinset), "3.11")
    assert "requirements-py311.lock NOT written" in str(exit_info.value) and message in str(exit_info.value)
    assert not (pinset / "requirements-py311.lock").exists()


def test_a_lock_that_contradicts_expect_is_not_written(lock_pinset, monkeypatch):
    module, pinset = lock_pinset
    monkeypatch.setattr(module, "resolve", resolved("2.4.6"))
    with pytest.raises(SystemExit) as exit_info:
        module.main(str(pinset), "3.11")
    assert "expect has numpy 2.3.5, the lock has numpy==2.4.6" in str(exit_info.value)
    assert not (pinset / "requirements-py311.lock").exists()
