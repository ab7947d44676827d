"""The guard after a rollout (docs/guard.md), end to end on a lab of its own: deploy ct200's DDTREE coder; a
watch keeps it; DDTREE's acceptance collapses after the rollout (the lab runtime's accept_collapse, planted in
the unit's environment file and declared in the service's environment, so the fallback keeps it too); the
next watch switches coder to DFLASH through the service role and its gate and records why in its history; a
second watch changes nothing (no flap).

`scripts/test guard` runs it alone, and the gitops stage with the rest. Its numbers and the guard's record go
to .cache/gitops-artifacts/guard.json.
"""

import json
import os
import re
import shutil
import time

import pytest
import yaml
from conftest import ARTIFACTS, REPO, on_lab_host, run

from ansible_collections.ddtree.sglang.plugins.module_utils.guard import unit_algorithm

pytestmark = [
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="needs podman and the controller venv (scripts/test guard)"
    ),
    pytest.mark.skipif(not os.environ.get("DDTREE_TEST_GUARD"), reason="a lab test: scripts/test guard (or gitops)"),
]

LAB_RUN = str(REPO / "lab" / "run")
DEPLOY = [LAB_RUN, "ansible-playbook", "site.yml", "-l", "blackwell"]
STATE = "/var/lib/sglang/coder"
ENV_FILE = "/etc/sglang/coder.env"
FAULT = "LAB_RUNTIME_FAULT"
NUMBERS = {}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("guard")
    env = dict(
        os.environ,
        DDTREE_LAB_ID="ddtree-guard-%d-%d" % (int(time.time()), os.getpid()),
        DDTREE_LOCK_DIR=str(base / "locks"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        DDTREE_ROLLOUT_REPORT_DIR=str(base / "reports"),
        DDTREE_ROLLOUT_REPORT_HISTORY="1",  # every run's report: the deploy, each watch, the switch
    )
    try:
        yield {"env": env, "base": base}
    finally:
        run([str(REPO / "lab" / "down")], env, check=False)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "guard.json").write_text(json.dumps(NUMBERS, indent=2) + "\n")
        # The reports of the deploy and of the guard's switch (rollout.md with its before/after charts).
        if (base / "reports").is_dir():
            shutil.copytree(base / "reports", ARTIFACTS / "guard-reports", dirs_exist_ok=True)


def faulted_inventory(lab):
    """A second inventory source: ct200's services as declared, coder's environment with the fault (host
    vars win over the lab's group files), so the fallback's unit keeps the fault and DFLASH alone recovers."""
    declared = yaml.safe_load((REPO / "inventories" / "example" / "group_vars" / "blackwell.yml").read_text())
    services = declared["sglang_services"]
    coder = next(service for service in services if service["name"] == "coder")
    coder["environment"] = dict(coder.get("environment") or {}, **{FAULT: "accept_collapse"})
    path = lab["base"] / "faulted.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": {"ct200": {"sglang_services": services}}}}))
    return path


def watch(lab, inventory=None):
    sources = ["-i", str(REPO / "inventories" / "lab" / "hosts.yml")] + (["-i", str(inventory)] if inventory else [])
    start = time.monotonic()
    # Results as JSON: the guard's line is one string, however long (YAML folds it over lines).
    env = dict(lab["env"], ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    proc = run([LAB_RUN, "ansible-playbook", "playbooks/watch.yml", "-l", "blackwell"] + sources, env, check=False)
    return proc, round(time.monotonic() - start, 1)


def decided(proc):
    """The guard's 'coder: <action> - <reasons>' line."""
    match = re.search(r'"msg": "coder: (\w+) - ((?:[^"\\]|\\.)*)"', proc.stdout)
    assert match, proc.stdout[-4000:]
    return match.group(1), json.loads('"%s"' % match.group(2))


def recap(proc):
    line = re.search(r"^ct200\s+:\s+(.*)$", proc.stdout, re.MULTILINE).group(1)
    return {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", line)}


def running(lab):
    """The algorithm coder's unit runs (its flags: SGLang's /server_info says DFLASH for DDTREE too)."""
    exec_start = on_lab_host(
        lab["env"], "ct200", "systemctl", "show", "-p", "ExecStart", "--value", "sglang-coder.service"
    )
    return unit_algorithm(exec_start)


def history(lab):
    text = on_lab_host(lab["env"], "ct200", "sh", "-c", "cat %s/history.jsonl 2>/dev/null || true" % STATE)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _healthy(env, health):
    argv = ["podman", "exec", "%s-ct200" % env["DDTREE_LAB_ID"], "python3", "-c", health]
    return run(argv, env, check=False).returncode == 0


def main_pid(lab):
    return on_lab_host(lab["env"], "ct200", "systemctl", "show", "-p", "MainPID", "--value", "sglang-coder.service")


def test_1_deploy_and_a_watch_keeps_a_healthy_ddtree(lab):
    start = time.monotonic()
    run(DEPLOY, lab["env"])
    NUMBERS["deploy_s"] = round(time.monotonic() - start, 1)
    assert running(lab) == "DDTREE"
    proc, seconds = watch(lab)
    NUMBERS["healthy_watch_s"] = seconds
    assert proc.returncode == 0, proc.stdout[-4000:]
    action, reasons = decided(proc)
    NUMBERS["healthy"] = {"action": action, "reasons": reasons}
    assert action == "keep" and "DDTREE holds up" in reasons
    assert recap(proc)["changed"] == 0
    assert [line for line in history(lab) if line.get("event") == "guard"] == []


def test_2_a_collapsed_ddtree_is_switched_to_dflash_through_the_gate_and_recorded(lab):
    env = lab["env"]
    # After the rollout, DDTREE's drafts stop fitting: the fault in the unit's environment file, and a restart.
    on_lab_host(
        env,
        "ct200",
        "sh",
        "-c",
        "echo '%s=\"accept_collapse\"' >> %s && systemctl restart sglang-coder.service" % (FAULT, ENV_FILE),
    )
    health = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/health', timeout=30)"
    for _attempt in range(60):
        if _healthy(env, health):
            break
        time.sleep(2)
    inventory = faulted_inventory(lab)
    lab["inventory"] = inventory
    proc, seconds = watch(lab, inventory)
    NUMBERS["switch_watch_s"] = seconds
    assert proc.returncode == 0, proc.stdout[-6000:]
    action, reasons = decided(proc)
    NUMBERS["collapsed"] = {"action": action, "reasons": reasons}
    assert action == "switch", reasons
    assert "collapsed below 50% of the" in reasons and "this release's gate recorded" in reasons
    # Through the service role: the plan, the unit, the switch and the health gate, which passed.
    assert "Gate each service on its release" in proc.stdout or "sglang_health" in proc.stdout
    assert running(lab) == "DFLASH"
    assert '%s="accept_collapse"' % FAULT in on_lab_host(env, "ct200", "cat", ENV_FILE)
    records = [line for line in history(lab) if line.get("event") == "guard"]
    assert len(records) == 1
    record = records[0]
    NUMBERS["history_record"] = record
    assert record["switched"] is True and record["failure"] is None
    assert record["from"]["algorithm"] == "DDTREE" and record["to"] == {"algorithm": "DFLASH"}
    assert any("collapsed" in reason for reason in record["reasons"])
    assert record["live"]["accept_length"] < record["recorded"]["release"]["accept_length"] / 2
    guard_state = json.loads(on_lab_host(env, "ct200", "cat", STATE + "/guard.json"))
    assert guard_state["last_switch"]["to"] == {"algorithm": "DFLASH"}
    verdicts = json.loads(on_lab_host(env, "ct200", "cat", STATE + "/verdicts.json"))["verdicts"]
    current = os.path.basename(on_lab_host(env, "ct200", "readlink", "/opt/sglang/services/coder/current"))
    assert verdicts[current]["verdict"] == "passed"
    NUMBERS["dflash_release"] = current
    lab["pid"] = main_pid(lab)


def test_3_a_second_watch_does_not_flap(lab):
    proc, seconds = watch(lab, lab["inventory"])
    NUMBERS["second_watch_s"] = seconds
    assert proc.returncode == 0, proc.stdout[-4000:]
    action, reasons = decided(proc)
    NUMBERS["second"] = {"action": action, "reasons": reasons}
    assert action == "keep" and "runs DFLASH, not DDTREE (the guard switched it at" in reasons
    assert recap(proc)["changed"] == 0
    assert main_pid(lab) == lab["pid"]
    assert running(lab) == "DFLASH"
    assert len([line for line in history(lab) if line.get("event") == "guard"]) == 1


def test_4_a_rollout_of_the_same_declaration_keeps_the_guards_dflash(lab):
    # service_plan reads guard.json: the declaration the guard switched away from is planned as DFLASH, so the
    # rollout leaves the service as the guard left it (no restart) and says why.
    sources = ["-i", str(REPO / "inventories" / "lab" / "hosts.yml"), "-i", str(lab["inventory"])]
    start = time.monotonic()
    proc = run(DEPLOY + sources, lab["env"], check=False)
    NUMBERS["rollout_after_switch_s"] = round(time.monotonic() - start, 1)
    assert proc.returncode == 0, proc.stdout[-6000:]
    NUMBERS["rollout_after_switch_recap"] = recap(proc)
    assert "stays on DFLASH until its speculative settings change" in proc.stderr  # service_plan's warning
    assert recap(proc)["changed"] == 0
    assert running(lab) == "DFLASH"
    assert main_pid(lab) == lab["pid"]
