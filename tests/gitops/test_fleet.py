"""A 24-host lab rollout (issue 15): the rollout policy's batches on a fleet, one host planted to fail in
the second batch, a crash and an unreachable host during a bake (rolled back; paused, then resumed), and the
controller's time per host at several fork counts.

The lab: 24 containers like ct200 (tests/gitops/fleet-inventory/hosts.yml: fleet-01 .. fleet-24, each with
the blackwell group's `coder` service on the lab runtime), from the lab image with stacks. One copy of this
checkout whose overlay is varied per release, as test_interrupted.py does. Every rollout is
`playbooks/services.yml` (the batched play; preflight and stacks have nothing to do after the first
converge), with the policy as extra vars, and writes its JSON and Markdown reports.

Run by `scripts/test fleet` (not part of `scripts/test`: the first converge alone deploys 24 hosts). Writes
.cache/gitops-artifacts/fleet-*.{json,md}: the reports and the timings.
"""

import json
import os
import resource
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import ARTIFACTS, REPO, copy_checkout, on_lab_host, run

INVENTORY = "tests/gitops/fleet-inventory/hosts.yml"
HOSTS = ["fleet-%02d" % number for number in range(1, 25)]
PLANTED = "fleet-02"  # the one host of the second batch of [1, '5%', '25%', '100%'] over 24 hosts
POLICY = {"batches": [1, "5%", "25%", "100%"], "bake_time_s": 5, "max_failures_per_batch": 0, "inconclusive": "pause"}
FAULT_MODULE = "sglang_overlay/src/sglang_overlay/release_fault.py"
NOTE_FILE = "sglang_overlay/src/sglang_overlay/core/walk.py"
SERVICES = "/opt/sglang/services/coder"
VERDICTS = "/var/lib/sglang/coder/verdicts.json"

pytestmark = [
    pytest.mark.skipif(
        shutil.which("podman") is None or shutil.which("ansible-playbook") is None,
        reason="needs podman and the controller venv (scripts/test fleet)",
    ),
    pytest.mark.skipif(
        os.environ.get("DDTREE_TEST_FLEET") != "1",
        reason="the 24-host rollout runs in its own stage: scripts/test fleet",
    ),
]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    """24 lab hosts of their own and a copy of this checkout to vary the overlay in."""
    base = tmp_path_factory.mktemp("fleet")
    env = dict(
        os.environ,
        DDTREE_LAB_ID=os.environ.get("DDTREE_FLEET_LAB_ID") or "ddtree-fleet-%d-%d" % (int(time.time()), os.getpid()),
        DDTREE_LAB_INVENTORY=INVENTORY,
        DDTREE_LOCK_DIR=str(base / "locks"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    for name in ("DDTREE_ROLLOUT_REPORT", "DDTREE_ROLLOUT_REPORT_DIR", "DDTREE_KILL_AT_TASK", "DDTREE_KILL_AFTER_S"):
        env.pop(name, None)
    work = base / "work"
    copy_checkout(work, env)
    reuse = os.environ.get("DDTREE_FLEET_REUSE_LAB") == "1"  # a lab an earlier run left up (with DDTREE_FLEET_LAB_ID)
    if not reuse:
        started = time.monotonic()
        run([str(REPO / "lab" / "up")], env, REPO)
        print("[fleet] 24 hosts up in %.0f s" % (time.monotonic() - started), flush=True)
    timings = {}
    try:
        yield {"env": env, "base": base, "work": work, "timings": timings, "reuse": reuse}
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "fleet-timings.json").write_text(json.dumps(timings, indent=1))
        if not reuse and os.environ.get("DDTREE_FLEET_KEEP_LAB") != "1":
            run([str(REPO / "lab" / "down")], env, REPO, check=False)


def release(bed, note, planted=False):
    """Make the copy's overlay a new release (a comment), with a fault that fires on PLANTED only when asked:
    a release that breaks on one host of the fleet, as a kernel that fails on one machine."""
    path = bed["work"] / NOTE_FILE
    # The time makes every call a release of its own, also when a test is run again on a lab kept up.
    path.write_text((REPO / NOTE_FILE).read_text().rstrip("\n") + "\n# %s (%d)\n" % (note, time.time()))
    fault = bed["work"] / FAULT_MODULE
    if planted:
        fault.write_text(
            '"""Planted by tests/gitops/test_fleet.py: degenerate output on %s only."""\nimport socket\n\n'
            'FAULT = "degenerate" if socket.gethostname() == "%s" else ""\n' % (PLANTED, PLANTED)
        )
    elif fault.exists():
        fault.unlink()


def host_state(env, host):
    """One host's coder: current and previous release, the unit's state and start, the verdict of current."""
    script = (
        "echo current=$(readlink %s/current); echo previous=$(readlink %s/previous); systemctl show -p ActiveState "
        "-p ExecMainStartTimestamp sglang-coder.service; echo ---; cat %s 2>/dev/null || echo '{}'"
    ) % (SERVICES, SERVICES, VERDICTS)
    out = on_lab_host(env, host, "/bin/sh", "-c", script, check=False) + "\n"
    head, _sep, text = out.partition("---\n")
    props = dict(line.partition("=")[::2] for line in head.splitlines() if "=" in line)
    current, previous = (os.path.basename(props.get(name, "")) or None for name in ("current", "previous"))
    verdicts = {rel: record.get("verdict") for rel, record in (json.loads(text or "{}").get("verdicts") or {}).items()}
    return {
        "current": current,
        "previous": previous,
        "unit": props.get("ActiveState"),
        "started": props.get("ExecMainStartTimestamp"),
        "verdict": verdicts.get(current),
        "verdicts": verdicts,
    }


def fleet_state(bed):
    with ThreadPoolExecutor(8) as pool:
        return dict(zip(HOSTS, pool.map(lambda host: host_state(bed["env"], host), HOSTS)))


def machine_busy_s():
    """CPU seconds the whole machine has spent busy (every process: controller, SSH, the 24 hosts)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def rollout(bed, name, forks, policy=None, playbook="playbooks/services.yml"):
    """One rollout over the fleet; its reports land in ARTIFACTS/fleet-NAME.{json,md}. -> (proc, report, timing)."""
    reports = bed["base"] / ("reports-%s" % name)
    env = dict(bed["env"], DDTREE_ROLLOUT_REPORT_DIR=str(reports), DDTREE_ROLLOUT_TRIGGER="fleet test: %s" % name)
    command = ["ansible-playbook", "-i", INVENTORY, playbook, "--forks", str(forks)]
    if policy:
        command += ["-e", json.dumps({"ddtree_rollout_policy": policy})]
    before, busy, started = resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_s(), time.monotonic()
    proc = run(command, env, bed["work"], check=False, timeout=5400)
    wall, after, busy = (
        time.monotonic() - started,
        resource.getrusage(resource.RUSAGE_CHILDREN),
        machine_busy_s() - busy,
    )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for suffix in ("json", "md"):
        if (reports / ("rollout.%s" % suffix)).exists():
            shutil.copyfile(reports / ("rollout.%s" % suffix), ARTIFACTS / ("fleet-%s.%s" % (name, suffix)))
    report = json.loads((reports / "rollout.json").read_text()) if (reports / "rollout.json").exists() else {}
    timing = {
        "forks": forks,
        "policy": policy,
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "controller_cpu_s": round(cpu, 1),
        "hosts": len(HOSTS),
        "wall_s_per_host": round(wall / len(HOSTS), 2),
        "controller_cpu_s_per_host": round(cpu / len(HOSTS), 2),
        "machine_cpu_s": round(busy, 1),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    bed["timings"][name] = timing
    print("[fleet] %s: %s" % (name, timing), flush=True)
    return proc, report, timing


def by_host(report):
    return {entry["host"]: entry for entry in report.get("hosts", [])}


def test_the_fleet_converges(bed):
    """The first rollout: every host gets coder on the same release, canary first, and passes its gate."""
    if bed["reuse"]:
        state = fleet_state(bed)
        assert all(s["unit"] == "active" and s["verdict"] == "passed" for s in state.values()), state
        bed["good"] = state[HOSTS[0]]["current"]
        return
    release(bed, "fleet 0")
    proc, report, _timing = rollout(bed, "converge", forks=10, playbook="site.yml")
    assert proc.returncode == 0, proc.stdout[-6000:]
    state = fleet_state(bed)
    releases = {s["current"] for s in state.values()}
    assert len(releases) == 1 and all(s["unit"] == "active" and s["verdict"] == "passed" for s in state.values()), state
    assert sorted(by_host(report)) == HOSTS, report.get("hosts")
    bed["good"] = releases.pop()


def test_a_host_failing_in_the_second_batch_stops_the_rollout(bed):
    """[1, '5%', '25%', '100%'] over 24 hosts is batches of 1, 1, 6 and 16. A release that breaks on fleet-02
    (the second batch): the canary is updated, fleet-02 fails its gate and is rolled back, the rollout stops,
    and the 22 hosts of the later batches are untouched (same release, same process)."""
    if "good" not in bed:
        pytest.skip("the fleet did not converge")
    good, before = bed["good"], fleet_state(bed)
    release(bed, "fleet planted", planted=True)
    proc, report, _timing = rollout(bed, "planted-failure", forks=10, policy=POLICY)
    after = fleet_state(bed)
    hosts = by_host(report)
    assert proc.returncode != 0, proc.stdout[-4000:]
    canary, planted = after[HOSTS[0]], after[PLANTED]
    new = canary["current"]
    assert new != good and canary["verdict"] == "passed" and canary["unit"] == "active", canary
    assert planted["current"] == good and planted["verdict"] == "passed" and planted["unit"] == "active", planted
    assert planted["verdicts"].get(new) == "failed", planted
    assert hosts[PLANTED]["status"] == "rolled back", hosts[PLANTED]
    for host in HOSTS[2:]:
        assert (
            after[host]["current"] == before[host]["current"] and after[host]["started"] == before[host]["started"]
        ), (host, before[host], after[host])
    # The report lists all 24, readably: the canary updated, fleet-02 rolled back, the rest not reached.
    assert sorted(hosts) == HOSTS, sorted(hosts)
    assert all(hosts[host]["status"] == "not reached" for host in HOSTS[2:]), [
        (h, hosts[h]["status"]) for h in HOSTS[2:]
    ]
    markdown = (ARTIFACTS / "fleet-planted-failure.md").read_text()
    assert all(host in markdown for host in HOSTS)
    bed["good"] = good


@pytest.mark.parametrize("forks", [5, 10, 20])
def test_rollout_time_by_forks(bed, forks):
    """A healthy release over the whole fleet at `forks`: every host updated; the wall and controller CPU per
    host go into fleet-timings.json (docs/rollout-policy.md has the arithmetic for 200 hosts)."""
    if "good" not in bed:
        pytest.skip("the fleet did not converge")
    release(bed, "fleet forks %d" % forks)
    proc, report, _timing = rollout(bed, "forks-%d" % forks, forks=forks, policy=dict(POLICY, bake_time_s=0))
    assert proc.returncode == 0, proc.stdout[-6000:]
    state = fleet_state(bed)
    releases = {s["current"] for s in state.values()}
    assert len(releases) == 1 and releases != {bed["good"]}, releases
    assert all(s["verdict"] == "passed" and s["unit"] == "active" for s in state.values()), state
    assert all(entry["status"] == "updated" for entry in report["hosts"]), [
        (e["host"], e["status"]) for e in report["hosts"]
    ]
    bed["good"] = releases.pop()


def rollout_beside(bed, name, watch, args, cleanup=None):
    """A healthy release's rollout with a bake of 40 s, while watch(*args, stop, log) does something to the fleet
    beside it; cleanup() after both. -> (proc, report, log: what the watcher did)."""
    stop, log = threading.Event(), []
    watcher = threading.Thread(target=watch, args=tuple(args) + (stop, log), daemon=True)
    watcher.start()
    try:
        proc, report, _timing = rollout(bed, name, forks=10, policy=dict(POLICY, bake_time_s=40))
    finally:
        stop.set()
        watcher.join(60)
        if cleanup:
            cleanup()
    return proc, report, log


BAKED = "fleet-03"  # a host of the third batch (fleet-03 .. fleet-08)


def kill_once_gated(env, host, old, stop, log):
    """When `host` has recorded a passed verdict for a release other than `old` (its deploy is done and its
    batch is baking), SIGKILL its service: a crash minutes after a good start, which only the bake sees."""
    while not stop.wait(2):
        state = host_state(env, host)
        if state["current"] not in (None, old) and state["verdict"] == "passed":
            on_lab_host(env, host, "systemctl", "kill", "-s", "KILL", "sglang-coder.service", check=False)
            log.append({"killed": state["current"], "at": time.strftime("%H:%M:%S")})
            return


def test_a_crash_during_the_bake_rolls_that_host_back_and_stops_the_rollout(bed):
    """A healthy release with a bake of 40 s: fleet-03's service is killed once its gate has passed, while its
    batch bakes. The bake's re-check finds it, fleet-03 is rolled back, the rollout stops before the fourth
    batch; the hosts updated before it keep the new release, the 16 of the fourth batch are untouched."""
    if "good" not in bed:
        pytest.skip("the fleet did not converge")
    before = fleet_state(bed)
    release(bed, "fleet bake")
    proc, report, log = rollout_beside(
        bed, "bake-failure", kill_once_gated, (bed["env"], BAKED, before[BAKED]["current"])
    )
    after, hosts = fleet_state(bed), by_host(report)
    assert log, "fleet-03 never recorded a passed verdict for the new release, so nothing was killed"
    new = log[0]["killed"]
    assert proc.returncode != 0, proc.stdout[-4000:]
    baked = after[BAKED]
    assert (
        baked["current"] == before[BAKED]["current"] and baked["unit"] == "active" and baked["verdict"] == "passed"
    ), baked
    assert hosts[BAKED]["status"] == "rolled back", hosts[BAKED]
    assert hosts[BAKED]["services"][0]["bake"]["verdict"] == "failed", hosts[BAKED]
    for host in HOSTS[:8]:
        if host != BAKED:
            assert after[host]["current"] == new and after[host]["verdict"] == "passed", (host, after[host])
    for host in HOSTS[8:]:
        assert (
            after[host]["current"] == before[host]["current"] and after[host]["started"] == before[host]["started"]
        ), host
        assert hosts[host]["status"] == "not reached", (host, hosts[host]["status"])
    assert sorted(hosts) == HOSTS


UNREACHABLE = "fleet-05"  # a host of the third batch (fleet-03 .. fleet-08), not its first
SSHD = "/usr/sbin/sshd"  # the lab's ProxyCommand execs it per connection: without its x bit, the host is unreachable
# ...once the connection ControlPersist keeps open is gone: its sshd is killed too.
CUT_OFF = "chmod 0644 %s && pkill -KILL -x sshd; true" % SSHD


def cut_off_once_baking(env, batch, host, old, stop, log):
    """When every host of `batch` has a passed verdict for a release other than `old` (the batch is deployed
    and its bake's 40 s wait has begun), make `host` unreachable: SSH into it fails (no sshd to exec, the kept
    connection killed), the host and its service stay up."""
    while not stop.wait(2):
        states = [host_state(env, member) for member in batch]
        if all(state["current"] not in (None, old) and state["verdict"] == "passed" for state in states):
            time.sleep(8)  # past the batch's last tasks, into the bake's wait
            on_lab_host(env, host, "/bin/sh", "-c", CUT_OFF)
            log.append({"cut off": host, "release": states[0]["current"], "at": time.strftime("%H:%M:%S")})
            return


def test_an_unreachable_host_during_the_bake_pauses_and_the_printed_command_resumes(bed):
    """A healthy release with a bake of 40 s; fleet-05 becomes unreachable while the third batch bakes. The
    bake's re-check of it is inconclusive: the rollout pauses (nothing rolled back, the fourth batch not
    reached, the report "paused" with the command to resume). fleet-05 comes back; the report's resume command,
    run as printed, finishes the rollout: the hosts already updated are not restarted, the other 16 are."""
    if "good" not in bed:
        pytest.skip("the fleet did not converge")
    env, before = bed["env"], fleet_state(bed)
    release(bed, "fleet pause")
    proc, report, log = rollout_beside(
        bed,
        "bake-paused",
        cut_off_once_baking,
        (env, HOSTS[2:8], UNREACHABLE, before[UNREACHABLE]["current"]),
        cleanup=lambda: on_lab_host(env, UNREACHABLE, "chmod", "0755", SSHD, check=False),
    )
    assert log, "the third batch never had passed verdicts for the new release, so no host was cut off"
    new, hosts, paused = log[0]["release"], by_host(report), fleet_state(bed)
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert "PAUSED: the bake's re-check was inconclusive for %s coder" % UNREACHABLE in proc.stdout, proc.stdout[-4000:]
    assert report["verdict"] == "paused", report.get("verdict")
    assert hosts[UNREACHABLE]["status"] == "inconclusive", hosts[UNREACHABLE]
    for host in HOSTS[:8]:  # nothing rolled back: all of the first three batches run the new release, passed
        assert (
            paused[host]["current"] == new and paused[host]["verdict"] == "passed" and paused[host]["unit"] == "active"
        ), (host, paused[host])
    for host in HOSTS[8:]:
        assert (
            paused[host]["current"] == before[host]["current"] and paused[host]["started"] == before[host]["started"]
        ), host
        assert hosts[host]["status"] == "not reached", (host, hosts[host]["status"])
    markdown = (ARTIFACTS / "fleet-bake-paused.md").read_text()
    resume = [line.strip() for line in markdown.splitlines() if line.strip().startswith("cd %s && " % bed["work"])]
    assert len(resume) == 1, markdown

    # The resume: the command the report printed, as an operator would paste it.
    reports = bed["base"] / "reports-bake-resumed"
    started = time.monotonic()
    proc = run(
        ["bash", "-c", resume[0]],
        dict(env, DDTREE_ROLLOUT_REPORT_DIR=str(reports), DDTREE_ROLLOUT_TRIGGER="fleet test: resumed"),
        bed["work"],
        check=False,
        timeout=5400,
    )
    bed["timings"]["bake-resumed"] = {"rc": proc.returncode, "wall_s": round(time.monotonic() - started, 1)}
    for suffix in ("json", "md"):
        shutil.copyfile(reports / ("rollout.%s" % suffix), ARTIFACTS / ("fleet-bake-resumed.%s" % suffix))
    assert proc.returncode == 0, proc.stdout[-6000:]
    resumed, after = json.loads((reports / "rollout.json").read_text()), fleet_state(bed)
    assert resumed["verdict"] != "paused" and sorted(by_host(resumed)) == HOSTS, resumed.get("verdict")
    assert all(
        after[host]["current"] == new and after[host]["verdict"] == "passed" and after[host]["unit"] == "active"
        for host in HOSTS
    ), after
    for host in HOSTS[:8]:  # already on the release: re-checked, not restarted
        assert after[host]["started"] == paused[host]["started"], (host, paused[host], after[host])
    for host in HOSTS[8:]:
        assert after[host]["started"] != paused[host]["started"], host
    bed["good"] = new
