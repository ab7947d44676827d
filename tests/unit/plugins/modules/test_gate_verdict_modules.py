"""Gate verdicts through the modules' main(): sglang_health records them, service_gate_status reads them
with the links and the unit, service_link keeps previous on a release that passed."""

import json
import os
import stat
import time

import pytest
import test_sglang_health
from conftest import run_module
from test_release_modules import link_args, make_release, target
from test_sglang_health import args

# The fake host (systemctl, journalctl and an SGLang HTTP surface) of the gate's own tests.
host = test_sglang_health.host

from ansible_collections.ddtree.sglang.plugins.modules import service_gate_status, service_link, sglang_health  # noqa: E402 - after the fake host it reads

PROMPT = "List the first ten prime numbers, separated by commas."


def verdicts(path):
    return json.loads(path.read_text())["verdicts"]


def test_the_gate_records_its_verdict_pass_or_fail(host, tmp_path, capsys):
    host.server.listen()
    verdict_file = tmp_path / "state" / "verdicts.json"
    code, result = run_module(
        sglang_health, args(host, tmp_path, prompts=[PROMPT], release_id="r1", verdict_file=str(verdict_file)), capsys
    )
    assert code == 0 and result["recorded"]["verdict"] is True
    record = verdicts(verdict_file)["r1"]
    assert (
        record["verdict"] == "passed"
        and record["stage"] == "performance"
        and record["measurements"]["baseline"] == "recorded"
    )
    # r2 answers differently: its gate fails at the baseline, and says so on the host.
    baseline = json.loads((tmp_path / "state" / "baseline.json").read_text())
    (key,) = baseline["baselines"]  # the one key the gate recorded under (model, family, TP, SGLang version)
    baseline["baselines"][key]["64"][PROMPT]["text"] = "2, 3, 5, 7, 11, 13, 17, 19, 23, 31"
    (tmp_path / "state" / "baseline.json").write_text(json.dumps(baseline))
    code, result = run_module(
        sglang_health, args(host, tmp_path, prompts=[PROMPT], release_id="r2", verdict_file=str(verdict_file)), capsys
    )
    assert code == 1 and result["recorded"]["verdict"] is True
    record = verdicts(verdict_file)["r2"]
    assert (
        record["verdict"] == "failed" and record["failure_kind"] == "baseline_mismatch" and "baseline" in record["msg"]
    )
    assert verdicts(verdict_file)["r1"]["verdict"] == "passed"
    # Check mode records nothing; a verdict needs the release it is about.
    code, result = run_module(
        sglang_health,
        args(host, tmp_path, prompts=[], release_id="r3", verdict_file=str(verdict_file), _ansible_check_mode=True),
        capsys,
    )
    assert code == 0 and "r3" not in verdicts(verdict_file)
    code, result = run_module(sglang_health, args(host, tmp_path, verdict_file=str(verdict_file)), capsys)
    assert code == 1 and "release_id" in result["msg"]


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """Releases, links, a state root and a systemctl that answers from a file."""
    root = str(tmp_path)
    for release in ("old", "new"):
        make_release(root, release)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text('#!/bin/sh\ncat "%s"\n' % (tmp_path / "props"))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))

    def unit(active="active", started=None, restarts=0):
        stamp = "@%d" % started if started is not None else ""
        (tmp_path / "props").write_text(
            "ActiveState=%s\nNRestarts=%d\nExecMainStartTimestamp=%s\n" % (active, restarts, stamp)
        )

    def status(capsys):
        code, result = run_module(
            service_gate_status,
            {
                "services": ["coder"],
                "services_root": os.path.join(root, "services"),
                "state_root": os.path.join(root, "state"),
            },
            capsys,
        )
        assert code == 0, result
        return result["services"]["coder"]

    def record(release, verdict):
        path = tmp_path / "state" / "coder" / "verdicts.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        document = json.loads(path.read_text()) if path.exists() else {"format": 1, "verdicts": {}}
        document["verdicts"][release] = {
            "verdict": verdict,
            "recorded_at": "2026-11-30T10:00:00Z",
            "stage": "baseline",
            "msg": "m",
        }
        path.write_text(json.dumps(document))
        return str(path)

    return {"root": root, "unit": unit, "status": status, "record": record}


def test_status_after_each_interruption(layout, capsys):
    root = layout["root"]
    run_module(service_link, link_args(root, release_id="old"), capsys)
    verdict_file = layout["record"]("old", "passed")
    layout["unit"](started=time.time() + 5)
    assert layout["status"](capsys)["action"] == "none"
    # The switch to new happened, the process predates it (died before the restart): restart, then gate.
    run_module(service_link, link_args(root, release_id="new", verdicts_file=verdict_file), capsys)
    layout["unit"](started=time.time() - 60)
    status = layout["status"](capsys)
    assert (status["action"], status["reason"], status["release_id"], status["previous_release_id"]) == (
        "restart",
        "interrupted",
        "new",
        "old",
    )
    assert status["previous_verdict"]["verdict"] == "passed" and status["unit_state"]["started_after_switch"] is False
    # Restarted after the switch, died before the verdict: gate it as it runs.
    layout["unit"](started=time.time() + 5)
    assert layout["status"](capsys)["action"] == "gate"
    # Its gate failed and the run died before the rollback: roll back.
    layout["record"]("new", "failed")
    status = layout["status"](capsys)
    assert (status["action"], status["reason"]) == ("rollback", "failed_verdict") and status["verdict"][
        "stage"
    ] == "baseline"
    # The unit down (died during the rollback, after the stop) and no verdict: restart, then gate.
    os.remove(verdict_file)
    layout["unit"](active="inactive")
    assert (layout["status"](capsys)["action"], layout["status"](capsys)["reason"]) == ("restart", "no_verdicts_yet")


def test_status_refuses_an_unreadable_verdicts_file_and_says_how_to_recover(layout, capsys):
    run_module(service_link, link_args(layout["root"], release_id="old"), capsys)
    path = layout["record"]("old", "passed")
    with open(path, "w") as handle:
        handle.write("{half")
    layout["unit"]()
    code, result = run_module(
        service_gate_status,
        {
            "services": ["coder"],
            "services_root": os.path.join(layout["root"], "services"),
            "state_root": os.path.join(layout["root"], "state"),
        },
        capsys,
    )
    assert code == 1 and path in result["msg"] and "Move the file aside" in result["msg"]


def test_switch_keeps_previous_on_the_last_release_that_passed(layout, capsys):
    root = layout["root"]
    make_release(root, "next")
    run_module(service_link, link_args(root, release_id="old"), capsys)
    verdict_file = layout["record"]("old", "passed")
    run_module(service_link, link_args(root, release_id="new", verdicts_file=verdict_file), capsys)
    assert target(root, "previous") == "../../releases/old"
    # new never passed (the run died): switching on to next keeps old as the fallback, not new.
    code, result = run_module(service_link, link_args(root, release_id="next", verdicts_file=verdict_file), capsys)
    assert code == 0 and (result["release_id"], result["previous_release_id"]) == ("next", "old")
    assert target(root, "previous") == "../../releases/old"
