"""The tour (docs/tour.md), end to end, with its own commands: deploy; lab/up again keeps the hosts; a re-run
changes nothing; a lossy release (lab/plant-lossy) is rolled back by the gate, with the summary first; restore;
then a blank host (its container removed, as a re-imaged host) whose lossy first release is rolled back
against the fleet's baseline, and whose good one passes against it.

A stage of its own (`scripts/test tour`, about 10 minutes on two cores); the commands are the tour's, run
in this checkout with a lab of their own (DDTREE_LAB_ID). Its numbers go to
.cache/gitops-artifacts/tour.json (the no-op run's time, container ids, the rollback's summary).
"""

import json
import os
import re
import shutil
import time

import pytest
from conftest import ARTIFACTS, REPO, on_lab_host, run

from ansible_collections.ddtree.sglang.plugins.plugin_utils.cache import cache_dir

pytestmark = [
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="needs podman and the controller venv (scripts/test tour)"
    ),
    pytest.mark.skipif(not os.environ.get("DDTREE_TEST_TOUR"), reason="a stage of its own: scripts/test tour"),
]

DEPLOY = [str(REPO / "lab" / "run"), "ansible-playbook", "site.yml", "-l", "blackwell"]
SERVICE_LINKS = "/opt/sglang/services/coder"
STATE = "/var/lib/sglang/coder"
NUMBERS = {}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("tour")
    env = dict(
        os.environ,
        DDTREE_LAB_ID="ddtree-tour-%d-%d" % (int(time.time()), os.getpid()),
        DDTREE_LOCK_DIR=str(base / "locks"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        DDTREE_ROLLOUT_REPORT_DIR=str(base / "reports"),
    )
    try:
        yield {"env": env, "base": base}
    finally:
        run([str(REPO / "lab" / "down")], env, check=False)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "tour.json").write_text(json.dumps(NUMBERS, indent=2) + "\n")


def timed(command, env, check=True):
    start = time.monotonic()
    proc = run(command, env, check=check)
    return proc, round(time.monotonic() - start, 1)


def recap(proc, host="ct200"):
    """The PLAY RECAP numbers of a host: {"ok": ..., "changed": ..., "failed": ...}."""
    line = re.search(r"^%s\s+:\s+(.*)$" % host, proc.stdout, re.MULTILINE).group(1)
    return {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", line)}


def summary(proc):
    """The ROLLOUT SUMMARY block the callback prints at the end."""
    return proc.stdout.split("ROLLOUT SUMMARY", 1)[1]


def container_id(lab, host="ct200"):
    return run(
        ["podman", "inspect", "--format", "{{.Id}}", "%s-%s" % (lab["env"]["DDTREE_LAB_ID"], host)], lab["env"]
    ).stdout.strip()


def host_state(lab):
    """What the lab must keep: the container, the service's links, its verdicts and baselines."""
    env = lab["env"]
    return {
        "container": container_id(lab),
        "current": on_lab_host(env, "ct200", "readlink", SERVICE_LINKS + "/current"),
        "previous": on_lab_host(env, "ct200", "sh", "-c", "readlink %s/previous || true" % SERVICE_LINKS),
        "verdicts": json.loads(on_lab_host(env, "ct200", "cat", STATE + "/verdicts.json"))["verdicts"],
        "baselines": json.loads(on_lab_host(env, "ct200", "cat", STATE + "/baseline.json"))["baselines"],
    }


def verdict(state, release):
    return state["verdicts"][os.path.basename(release)]


def test_0_the_plain_images_lab_comes_up_twice_on_the_same_containers(lab):
    # The README's lab is the plain image (no volumes), whatever image the test stage chose for the rest.
    env = dict(lab["env"], DDTREE_LAB_ID=lab["env"]["DDTREE_LAB_ID"] + "-plain")
    env.pop("DDTREE_LAB_IMAGE", None)
    try:
        first = run([str(REPO / "lab" / "up")], env)
        ids = [container_id({"env": env}, host) for host in ("ct200", "ct129")]
        second = run([str(REPO / "lab" / "up")], env)
        again = [container_id({"env": env}, host) for host in ("ct200", "ct129")]
    finally:
        run([str(REPO / "lab" / "down")], env, check=False)
    assert len(re.findall(r": created \(id ", first.stderr)) == 2, first.stderr[-2000:]
    assert len(re.findall(r": kept \(id ", second.stderr)) == 2, second.stderr[-2000:]
    NUMBERS["plain_container_ids"] = [[container[:12] for container in ids], [container[:12] for container in again]]
    assert again == ids


def test_1_deploy(lab):
    proc, seconds = timed(DEPLOY, lab["env"])
    NUMBERS["deploy_s"] = seconds
    state = host_state(lab)
    assert verdict(state, state["current"])["verdict"] == "passed"
    assert "ct200 coder: updated, release none -> " in summary(proc)
    lab["good"] = state


def test_2_lab_up_again_keeps_the_hosts(lab):
    before = lab["good"]
    proc = run([str(REPO / "lab" / "up")], lab["env"])
    assert re.search(r"ct200 \(container \S+\): kept \(id %s\)" % before["container"][:12], proc.stderr), proc.stderr[
        -2000:
    ]
    after = host_state(lab)
    assert after == before
    NUMBERS["container_ids"] = [before["container"][:12], after["container"][:12]]


def test_3_a_rerun_changes_nothing_and_takes_seconds(lab):
    proc, seconds = timed(DEPLOY, lab["env"])
    NUMBERS["noop_s"], NUMBERS["noop_recap"] = seconds, recap(proc)
    assert recap(proc)["changed"] == 0 and recap(proc)["failed"] == 0, proc.stdout[-3000:]
    assert "ct200 coder: unchanged" in summary(proc)
    assert host_state(lab) == lab["good"]


def plant(lab):
    return run([str(REPO / "lab" / "plant-lossy"), str(lab["base"] / "lossy-overlay")], lab["env"]).stdout.strip()


def test_4_a_lossy_release_is_rolled_back_and_the_summary_says_so_first(lab):
    good = lab["good"]
    proc, seconds = timed(DEPLOY + ["-e", "sglang_service_overlay_source=" + plant(lab)], lab["env"], check=False)
    NUMBERS["lossy_s"] = seconds
    assert proc.returncode != 0
    text = summary(proc)
    NUMBERS["lossy_summary"] = text.strip().splitlines()
    assert re.search(
        r"ct200 coder: rolled back, release %s -> %s" % (good["current"][-12:], good["current"][-12:]), text
    ), text
    assert "failed at baseline (baseline_mismatch)" in text and "differ from this host's baseline" in text
    # The summary leads the failure: what failed, why, what was done, what to do - before the task output.
    assert "what to do:" in text
    state = host_state(lab)
    assert state["current"] == good["current"] and state["container"] == good["container"]
    failed = [release for release, record in state["verdicts"].items() if record["verdict"] == "failed"]
    assert len(failed) == 1 and state["verdicts"][failed[0]]["measurements"]["baseline_mismatches"] >= 1


def test_5_restore_and_run_once_more(lab):
    proc, seconds = timed(DEPLOY, lab["env"])
    NUMBERS["restore_s"], NUMBERS["restore_recap"] = seconds, recap(proc)
    assert host_state(lab)["current"] == lab["good"]["current"]
    assert recap(proc)["failed"] == 0


def test_6_a_blank_hosts_lossy_first_release_is_rolled_back_against_the_fleets_baseline(lab):
    env = lab["env"]
    fleet = json.loads(open(cache_dir("fleet-baselines", "lab-%s.json" % env["DDTREE_LAB_ID"], environ=env)).read())
    assert fleet["baselines"], "the good release's gate added nothing to the fleet's baselines"
    run(["podman", "rm", "-f", "-t", "5", "%s-ct200" % env["DDTREE_LAB_ID"]], env)
    proc, seconds = timed(DEPLOY + ["-e", "sglang_service_overlay_source=" + plant(lab)], env, check=False)
    NUMBERS["blank_lossy_s"] = seconds
    assert proc.returncode != 0
    assert re.search(r"ct200 \(container \S+\): created", proc.stderr), proc.stderr[-2000:]
    text = summary(proc)
    NUMBERS["blank_lossy_summary"] = text.strip().splitlines()
    assert (
        "differ from the fleet's baseline (recorded on ct200 by release %s" % os.path.basename(lab["good"]["current"])
        in proc.stdout
    )
    assert "baseline_mismatch" in text
    # Nothing to go back to on a blank host: the lossy release does not keep serving.
    assert on_lab_host(env, "ct200", "systemctl", "is-active", "sglang-coder.service", check=False) != "active"
    failed = json.loads(on_lab_host(env, "ct200", "cat", STATE + "/verdicts.json"))["verdicts"]
    assert [record["verdict"] for record in failed.values()] == ["failed"]


def test_7_the_blank_hosts_good_release_passes_against_the_fleets_baseline(lab):
    proc, seconds = timed(DEPLOY, lab["env"])
    NUMBERS["blank_restore_s"] = seconds
    state = host_state(lab)
    assert os.path.basename(state["current"]) == os.path.basename(lab["good"]["current"])
    assert verdict(state, state["current"])["verdict"] == "passed"
    assert verdict(state, state["current"])["measurements"]["baseline_reference"] == "fleet"
    assert "outputs compared with the fleet's baseline: this host had none" in summary(proc)
