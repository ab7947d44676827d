"""A service across hosts, rolled out and rolled back as one (docs/services.md, "Services across hosts").

The lab: ct200 and ct129 serve one service, `kimi`, as rank 0 (the head, HTTP) and rank 1
(tests/gitops/multinode-inventory; ct129 shares ct200's network namespace, where the ranks meet over TCP).
In order, each test starting from the state the one before left:

1. a healthy rollout: both nodes on the same release, its verdict passed on both, the head answers, and
   rank 1 joined the head;
2. bad declarations refused before anything changes, naming the host, the field and the fix (an interface
   the host lacks; the nodes in two rollout batches);
3. a release whose rank 1 crashes after the join (lab fault crash_rank:1): the gate fails naming ct129's
   rank and its journal, and both nodes roll back to the release before;
4. the controller killed mid-switch (rank 1 restarted on the new release, the head not yet): the re-run
   converges, both nodes on the new release, passed;
5. a second run changes nothing (changed=0 on both nodes).

Each step writes both nodes' releases before and after, and the run's report, to ARTIFACTS (multinode-*.json).
Run by `scripts/test multinode` (DDTREE_TEST_MULTINODE=1).
"""

import json
import os
import shutil
import time

import pytest
from conftest import ARTIFACTS, REPO, copy_checkout, killed_at_task, on_lab_host, run

INVENTORY = "tests/gitops/multinode-inventory/hosts.yml"
HOSTS = ("ct200", "ct129")
NOTE_FILE = "sglang_overlay/src/sglang_overlay/__init__.py"
FAULT_MODULE = "sglang_overlay/src/sglang_overlay/release_fault.py"
SERVICES = "/opt/sglang/services/kimi"
VERDICTS = "/var/lib/sglang/kimi/verdicts.json"
# Both nodes in one batch: a service across hosts switches on all its nodes at once.
ONE_BATCH = json.dumps({"ddtree_rollout_policy": {"batches": ["100%"]}})

pytestmark = [
    pytest.mark.skipif(
        shutil.which("podman") is None or shutil.which("ansible-playbook") is None,
        reason="needs podman and the controller venv (scripts/test multinode)",
    ),
    pytest.mark.skipif(
        os.environ.get("DDTREE_TEST_MULTINODE") != "1",
        reason="the two-node rollout runs in its own stage: scripts/test multinode",
    ),
]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    """ct200 and ct129 of their own, and a copy of this checkout to vary the overlay in."""
    base = tmp_path_factory.mktemp("multinode")
    env = dict(
        os.environ,
        DDTREE_LAB_ID=os.environ.get("DDTREE_MULTINODE_LAB_ID") or "ddtree-mn-%d-%d" % (int(time.time()), os.getpid()),
        DDTREE_LAB_INVENTORY=INVENTORY,
        DDTREE_LOCK_DIR=str(base / "locks"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    for name in ("DDTREE_ROLLOUT_REPORT", "DDTREE_ROLLOUT_REPORT_DIR", "DDTREE_KILL_AT_TASK", "DDTREE_KILL_AFTER_S"):
        env.pop(name, None)
    work = base / "work"
    copy_checkout(work, env)
    reuse = os.environ.get("DDTREE_MULTINODE_REUSE_LAB") == "1"
    if not reuse:
        run([str(REPO / "lab" / "up")], env, REPO)
    try:
        yield {"env": env, "base": base, "work": work}
    finally:
        if not reuse and os.environ.get("DDTREE_MULTINODE_KEEP_LAB") != "1":
            run([str(REPO / "lab" / "down")], env, REPO, check=False)


def release(bed, note, fault=None):
    """Make the copy's overlay a new release (a comment), carrying a lab fault when asked."""
    path = bed["work"] / NOTE_FILE
    path.write_text((REPO / NOTE_FILE).read_text().rstrip("\n") + "\n# %s (%d)\n" % (note, time.time()))
    module = bed["work"] / FAULT_MODULE
    if fault:
        module.write_text('"""Planted by tests/gitops/test_multinode.py."""\n\nFAULT = %r\n' % fault)
    elif module.exists():
        module.unlink()


def node_state(env, host):
    """One node's kimi: current and previous release, the unit's state, the verdict of current."""
    script = (
        "echo current=$(readlink %s/current); echo previous=$(readlink %s/previous); "
        "systemctl show -p ActiveState sglang-kimi.service; echo ---; cat %s 2>/dev/null || echo '{}'"
    ) % (SERVICES, SERVICES, VERDICTS)
    out = on_lab_host(env, host, "/bin/sh", "-c", script, check=False) + "\n"
    head, _sep, text = out.partition("---\n")
    props = dict(line.partition("=")[::2] for line in head.splitlines() if "=" in line)
    current, previous = (os.path.basename(props.get(name, "")) or None for name in ("current", "previous"))
    verdicts = json.loads(text or "{}").get("verdicts") or {}
    return {
        "current": current,
        "previous": previous,
        "unit": props.get("ActiveState"),
        "verdict": (verdicts.get(current) or {}).get("verdict"),
        "verdicts": {rel: record.get("verdict") for rel, record in verdicts.items()},
        "failed_msgs": [record.get("msg") for record in verdicts.values() if record.get("verdict") == "failed"],
    }


def nodes(bed):
    return {host: node_state(bed["env"], host) for host in HOSTS}


def head_health(bed):
    command = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:30000/health', timeout=30).status)"
    return on_lab_host(bed["env"], "ct200", "python3", "-c", command, check=False)


def rollout(bed, name, playbook="playbooks/services.yml", one_batch=True, kill_at=None, extra=()):
    """One run; its reports and both nodes' releases before and after land in ARTIFACTS/multinode-NAME.*."""
    reports = bed["base"] / ("reports-%s" % name)
    env = dict(bed["env"], DDTREE_ROLLOUT_REPORT_DIR=str(reports), DDTREE_ROLLOUT_TRIGGER="multinode test: %s" % name)
    marker = bed["base"] / ("killed-%s" % name)
    if kill_at:
        env = killed_at_task(env, kill_at, marker)
    command = ["ansible-playbook", "-i", INVENTORY, playbook, *extra]
    if one_batch:
        command += ["-e", ONE_BATCH]
    before = nodes(bed)
    proc = run(command, env, bed["work"], check=False, timeout=3600, new_session=bool(kill_at))
    after = nodes(bed)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for suffix in ("json", "md"):
        if (reports / ("rollout.%s" % suffix)).exists():
            shutil.copyfile(reports / ("rollout.%s" % suffix), ARTIFACTS / ("multinode-%s-report.%s" % (name, suffix)))
    record = {"run": name, "rc": proc.returncode, "before": before, "after": after, "stdout_tail": proc.stdout[-3000:]}
    (ARTIFACTS / ("multinode-%s.json" % name)).write_text(json.dumps(record, indent=1))
    print("[multinode] %s: rc %d\n  before %s\n  after  %s" % (name, proc.returncode, before, after), flush=True)
    if kill_at:
        assert proc.returncode == -9 and marker.exists(), "the kill point %r was not reached (rc %d)\n%s" % (
            kill_at,
            proc.returncode,
            proc.stdout[-4000:],
        )
    return proc, before, after


def test_1_a_healthy_rollout_puts_both_nodes_on_one_release(bed):
    release(bed, "healthy 1")
    proc, _before, after = rollout(bed, "healthy", playbook="site.yml")
    assert proc.returncode == 0, proc.stdout[-6000:]
    head, worker = after["ct200"], after["ct129"]
    assert head["current"] and head["current"] == worker["current"], after
    assert head["verdict"] == worker["verdict"] == "passed", after
    assert head["unit"] == worker["unit"] == "active", after
    assert head_health(bed) == "200"
    journal = on_lab_host(bed["env"], "ct129", "journalctl", "-u", "sglang-kimi.service", "-o", "cat", "--no-pager")
    assert "Rank 1 joined: the group is formed" in journal and "Uvicorn running" not in journal
    bed["good"] = head["current"]


def test_2_bad_declarations_are_refused_naming_host_field_and_fix(bed):
    if "good" not in bed:
        pytest.skip("the healthy rollout did not pass")
    wrong_interface = {
        "sglang_services": [
            {
                "name": "kimi",
                "model_path": "/models/Qwen3-Coder-30B-A3B-Instruct",
                "draft_model_path": "/models/Qwen3-Coder-30B-A3B-DFlash",
                "gpus": [0, 1],
                "tp_size": 4,
                "port": 30000,
                "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8},
                "nodes": {"hosts": ["ct200", "ct129"], "dist_init_addr": "127.0.0.1", "interface": "ib0"},
            }
        ]
    }
    proc, before, after = rollout(bed, "bad-interface", extra=["-e", json.dumps(wrong_interface)])
    assert proc.returncode != 0
    assert "ct129: sglang_services[0] (kimi): nodes.interface ib0 does not exist on ct129" in proc.stdout, proc.stdout[
        -4000:
    ]
    assert "set the interface of the network between the nodes" in proc.stdout
    assert after == before
    # The default policy's canary is one host: the two nodes would switch in two batches.
    proc, before, after = rollout(bed, "two-batches", one_batch=False)
    assert proc.returncode != 0
    assert "ct129 not in the same rollout batch as the others" in proc.stdout, proc.stdout[-4000:]
    assert after == before


def test_3_a_rank_1_crash_fails_the_gate_and_rolls_back_both_nodes(bed):
    if "good" not in bed:
        pytest.skip("the healthy rollout did not pass")
    release(bed, "rank 1 crashes", fault="crash_rank:1:2")
    proc, before, after = rollout(bed, "rank-crash")
    assert proc.returncode != 0
    head, worker = after["ct200"], after["ct129"]
    assert head["current"] == worker["current"] == bed["good"], after
    assert head["verdict"] == worker["verdict"] == "passed", after
    assert head["unit"] == worker["unit"] == "active", after
    assert head_health(bed) == "200"
    failed = [rel for rel, verdict in head["verdicts"].items() if verdict == "failed"]
    assert failed and all(worker["verdicts"].get(rel) == "failed" for rel in failed), after
    message = " ".join(head["failed_msgs"])
    assert "rank 1 on ct129 failed" in message and "journal of sglang-kimi.service on ct129" in message, message
    release(bed, "healthy again")


def test_4_a_controller_killed_mid_switch_converges_on_the_rerun(bed):
    if "good" not in bed:
        pytest.skip("the healthy rollout did not pass")
    release(bed, "healthy 4")
    # Rank 1 restarted on the new release; the head not yet (it ended cleanly with rank 1's goodbye).
    rollout(bed, "killed", kill_at="Restart the services whose unit, environment")
    proc, before, after = rollout(bed, "rerun")
    assert proc.returncode == 0, proc.stdout[-6000:]
    head, worker = after["ct200"], after["ct129"]
    assert head["current"] == worker["current"] != bed["good"], after
    assert head["verdict"] == worker["verdict"] == "passed", after
    assert head["unit"] == worker["unit"] == "active", after
    assert head_health(bed) == "200"


def test_5_a_second_run_changes_nothing(bed):
    if "good" not in bed:
        pytest.skip("the healthy rollout did not pass")
    proc, before, after = rollout(bed, "no-op")
    assert proc.returncode == 0, proc.stdout[-6000:]
    recap = [line for line in proc.stdout.splitlines() if line.startswith(HOSTS) and "changed=" in line]
    assert len(recap) == 2 and all(" changed=0 " in line for line in recap), recap
    assert after == before
