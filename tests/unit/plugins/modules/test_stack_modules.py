"""stack_verify, stack_prune and wheelhouse driven through main()."""

import os
import sys

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.modules import stack_prune, stack_verify, wheelhouse


def fake_stack(tmp_path):
    """A 'stack' whose bin/python is this interpreter: the probe really runs."""
    os.makedirs(tmp_path / "stack" / "bin")
    os.symlink(sys.executable, tmp_path / "stack" / "bin" / "python")
    return str(tmp_path / "stack")


def test_stack_verify_reports_probe_facts_and_contradictions(tmp_path, capsys):
    expected = {
        "python": "%d.%d" % sys.version_info[:2],
        "gpu": False,
        "packages": {"sglang": "0.5.23"},
        "imports": ["json", "no_such_module_xyz"],
    }
    code, result = run_module(stack_verify, {"stack": fake_stack(tmp_path), "expected": expected}, capsys)
    assert code == 1
    assert result["facts"]["imports"]["json"]["ok"] is True
    assert "sglang is not installed; the pin set has 0.5.23" in result["contradictions"]
    assert any(
        problem.startswith("no_such_module_xyz cannot load: ModuleNotFoundError")
        for problem in result["contradictions"]
    )
    assert "contradicts its pin set or this host: " in result["msg"]


def test_stack_verify_requires_torch_to_import(tmp_path, capsys):
    expected = {"python": "%d.%d" % sys.version_info[:2], "gpu": False, "imports": ["json"]}
    # No torch in the controller venv: expecting a torch would be a contradiction, so expect none.
    code, result = run_module(stack_verify, {"stack": fake_stack(tmp_path), "expected": expected}, capsys)
    assert result["facts"]["torch"].get("error", "").startswith("ModuleNotFoundError")
    assert code == 1 and result["contradictions"] == ["torch does not import: " + result["facts"]["torch"]["error"]]


def test_stack_verify_unbuilt_stack(tmp_path, capsys):
    code, result = run_module(stack_verify, {"stack": str(tmp_path / "nope"), "expected": {}}, capsys)
    assert code == 1 and "has no executable bin/python; is it built?" in result["msg"]


def proven_stack(tmp_path, monkeypatch):
    """A complete stand-in stack whose probe passes as a CPU stack (a stand-in torch on PYTHONPATH)."""
    stack = fake_stack(tmp_path)
    (tmp_path / "stack" / ".ddtree-stack-complete").write_text("{}\n")
    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(
        "import types\n__version__ = '2.9.0+cpu'\nversion = types.SimpleNamespace(cuda=None)\n"
        "cuda = types.SimpleNamespace(is_available=lambda: False)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    expected = {"python": "%d.%d" % sys.version_info[:2], "gpu": False, "torch": "2.9.0", "imports": ["json"]}
    return {"stack": stack, "expected": expected, "state_root": str(tmp_path / "state")}


def test_stack_verify_records_a_pass_and_does_not_probe_again(tmp_path, monkeypatch, capsys):
    args = proven_stack(tmp_path, monkeypatch)
    code, first = run_module(stack_verify, args, capsys)
    assert code == 0 and first["recorded"] is False and first["facts"]["torch"]["version"] == "2.9.0+cpu", first.get(
        "msg"
    )
    monkeypatch.delenv("PYTHONPATH")  # a probe now would find no torch and fail
    code, second = run_module(stack_verify, args, capsys)
    assert code == 0 and second["recorded"] is True and second["changed"] is False and second["facts"] == first["facts"]
    # Another host (other GPUs) or expectation is another key: probed, and fails here.
    code, third = run_module(stack_verify, dict(args, gpu_capabilities=["9.0"]), capsys)
    assert code == 1 and third["contradictions"][0].startswith("torch does not import")


def test_stack_verify_records_no_failure_no_unfinished_stack_nor_in_check_mode(tmp_path, monkeypatch, capsys):
    args = proven_stack(tmp_path, monkeypatch)
    code, result = run_module(stack_verify, dict(args, expected=dict(args["expected"], torch="2.10.0")), capsys)
    assert code == 1 and not (tmp_path / "state").exists()
    code, result = run_module(stack_verify, dict(args, _ansible_check_mode=True), capsys)
    assert code == 0 and result["recorded"] is False and not (tmp_path / "state").exists()
    os.unlink(tmp_path / "stack" / ".ddtree-stack-complete")  # an interrupted build: proven, never recorded
    code, result = run_module(stack_verify, args, capsys)
    assert code == 0 and "record" not in result and not (tmp_path / "state").exists()


def test_stack_prune_check_mode_and_diff(tmp_path, capsys):
    for stack in ("keepme", "old"):
        os.makedirs(tmp_path / "stacks" / stack)
    args = {
        "root": str(tmp_path / "stacks"),
        "keep": ["keepme"],
        "services_root": str(tmp_path / "services"),
        "releases_root": str(tmp_path / "releases"),
        "wheelhouse_root": str(tmp_path / "wh"),
    }
    code, result = run_module(stack_prune, dict(args, _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert code == 0 and result["changed"] and result["removed"] == ["old"]
    assert result["diff"]["before"] == "keepme\nold\n" and result["diff"]["after"] == "keepme\n"
    assert (tmp_path / "stacks" / "old").is_dir()
    code, result = run_module(stack_prune, args, capsys)
    assert not (tmp_path / "stacks" / "old").exists() and (tmp_path / "stacks" / "keepme").is_dir()
    code, result = run_module(stack_prune, args, capsys)
    assert result["changed"] is False


def test_wheelhouse_is_a_no_op_once_complete(tmp_path, capsys):
    lock = tmp_path / "requirements-py311.lock"
    lock.write_text("six==1.16.0 --hash=sha256:00\n")
    args = {"lock": str(lock), "dest": str(tmp_path / "wh"), "python_version": "3.11", "glibc": "2.36"}
    code, result = run_module(wheelhouse, dict(args, _ansible_check_mode=True), capsys)
    assert code == 0 and result["changed"] is True and not (tmp_path / "wh").exists()
    os.makedirs(tmp_path / "wh")
    open(result["marker"], "w").close()
    code, result = run_module(wheelhouse, args, capsys)
    assert code == 0 and result["changed"] is True and result["archive"] == str(tmp_path / "wh") + ".tar"
    code, result = run_module(wheelhouse, args, capsys)
    assert code == 0 and result["changed"] is False


def test_wheelhouse_reports_pip_failure(tmp_path, capsys):
    lock = tmp_path / "requirements-py311.lock"
    lock.write_text("six==1.16.0 --hash=sha256:0000\n")  # a wrong hash: pip must refuse
    args = {"lock": str(lock), "dest": str(tmp_path / "wh"), "python_version": "3.11", "glibc": "2.36"}
    code, result = run_module(wheelhouse, args, capsys)
    assert code == 1 and result["msg"].startswith("pip download of %s failed" % lock)
    assert not any(name.startswith(".complete-") for name in os.listdir(tmp_path / "wh"))
