"""GitOps rollouts end to end: a local bare Git repository, the lab, the rollout entry point and ansible-pull.

The tests run in order and share one lab and one fleet repository (a copy of this checkout):
  1. commit A (good overlay, and a canary API key for ct200's service) rolls out on both hosts through
     scripts/rollout (plan, then rollout) at -vvv: ct200's DDTREE service onto A's release, ct129's NEXTN
     service onto its stack's base release, which no later overlay commit changes (docs/services.md,
     "Which release a service runs"); ct200's service refuses a request without the key and answers one
     with it;
  2. commit B (an overlay whose tree walk is broken: not lossless) fails the health gate on the canary,
     which is rolled back (also at -vvv); ct129 is never touched; the report says so; then the key is
     searched for everywhere on the controller and ct200 (secret_checks.py): only its own file holds it;
  3. the same through the pull-based timer's unit (its guard, ansible-pull and the guard again, as the
     rollout_pull role renders them): commit C (good) rolls out, a run with no new commit does nothing,
     and commit D (broken) meets issue 14's incident: the run is SIGKILLed as the canary's gate begins,
     the broken release current and running; the next tick rolls it back and the report says why;
  4. two triggers at once (commit E, C's tree again: no change to roll out): one refuses (lock timeout 0),
     one waits for the first to finish, nothing breaks.
Run by `scripts/test gitops`. Needs the lab (podman) and the controller venv on PATH.
"""

import json
import os
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import secret_checks
from conftest import ARTIFACTS, PULL_GUARD, REPO, copy_checkout, killed_at_task, on_lab_host, run

WALK = "sglang_overlay/src/sglang_overlay/core/walk.py"
GOOD_MATCH = "(tree.tokens == want[:, None])"
BROKEN_MATCH = "(tree.tokens >= 0)"  # accepts any child: the output is no longer the target's own
# ct200's service's API key: a canary, fresh each run, searched for after the rollouts (issue 18).
API_KEY = "canary-" + secrets.token_hex(16)

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or shutil.which("ansible-pull") is None,
    reason="needs podman and the controller venv (scripts/test gitops)",
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A lab of its own (unique container names), locks and work directories of its own."""
    base = tmp_path_factory.mktemp("gitops")
    env = dict(
        os.environ,
        DDTREE_LAB_ID="ddtree-gitops-%d-%d" % (int(time.time()), os.getpid()),
        DDTREE_LOCK_DIR=str(base / "locks"),
        DDTREE_ROLLOUT_WORKDIR=str(base / "rollouts"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        # Where the API key search looks on the controller, besides the reports and locks.
        ANSIBLE_LOCAL_TEMP=str(base / "ansible-tmp"),
        DDTREE_ROLLOUT_REPORT_HISTORY="1",
    )
    env.pop("DDTREE_ROLLOUT_REPORT_DIR", None)
    run([str(REPO / "lab" / "up")], env)
    try:
        yield {"env": env, "base": base}
    finally:
        run([str(REPO / "lab" / "down")], env, check=False)


@pytest.fixture(scope="module")
def fleet(lab):
    """A bare repository holding this checkout (commit A), and a clone to make further commits in."""
    base, env = lab["base"], lab["env"]
    bare, work = base / "fleet.git", base / "work"
    run(["git", "init", "--quiet", "--bare", "--initial-branch=main", str(bare)], env)
    run(["git", "init", "--quiet", "--initial-branch=main", str(work)], env)
    copy_checkout(work, env)

    def commit(message, change=None):
        if change:
            change(work)
        run(["git", "-C", str(work), "add", "-A"], env)
        run(
            [
                "git",
                "-C",
                str(work),
                "-c",
                "user.name=ci",
                "-c",
                "user.email=ci@localhost",
                "commit",
                "--quiet",
                "-m",
                message,
            ],
            env,
        )
        run(["git", "-C", str(work), "push", "--quiet", str(bare), "HEAD:main"], env)
        return run(["git", "-C", str(work), "rev-parse", "HEAD"], env).stdout.strip()

    return {"bare": bare, "work": work, "commit": commit}


def break_walk(work):
    path = work / WALK
    text = path.read_text()
    assert GOOD_MATCH in text
    path.write_text(text.replace(GOOD_MATCH, BROKEN_MATCH))


def mend_walk(note):
    def change(work):
        path = work / WALK
        path.write_text(path.read_text().replace(BROKEN_MATCH, GOOD_MATCH).rstrip("\n") + "\n# %s\n" % note)

    return change


def on_host(lab, host, *command):
    return on_lab_host(lab["env"], host, *command)


def current_release(lab, host, service):
    return os.path.basename(on_host(lab, host, "readlink", "/opt/sglang/services/%s/current" % service))


def answers(lab, host):
    """The service on the host answers a chat completion with real text (ct200's: given its API key)."""
    if host == secret_checks.HOST:
        [(status, text)] = secret_checks.chat_statuses(lab["env"], API_KEY, keys=["key"])
        assert status == 200, status
        return text
    code = (
        "import json, urllib.request; body = json.dumps({'model': 'any', 'max_tokens': 12, 'temperature': 0, "
        "'messages': [{'role': 'user', 'content': 'Name three rivers.'}]}).encode(); "
        "req = urllib.request.Request('http://127.0.0.1:30000/v1/chat/completions', body, {'Content-Type': 'application/json'}); "
        "print(json.load(urllib.request.urlopen(req, timeout=60))['choices'][0]['message']['content'])"
    )
    return on_host(lab, host, "python3", "-c", code)


def rollout(lab, fleet, report_dir, *extra, check=True):
    return run(
        [
            str(REPO / "scripts" / "rollout"),
            "--repo",
            str(fleet["bare"]),
            "--revision",
            "main",
            "--report-dir",
            str(report_dir),
            "--trigger",
            "gitops test",
            *extra,
        ],
        lab["env"],
        check=check,
    )


def load(path):
    return json.loads(Path(path).read_text())


def keep(path, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / name)


def services(report):
    return {
        (row["host"], service["name"]): dict(service, status=row["status"])
        for row in report["hosts"]
        for service in row["services"]
    }


STATE = {}


def test_commit_a_rolls_out_on_both_hosts(lab, fleet):
    commit_a = fleet["commit"](
        "A: this checkout, and a canary API key for ct200's service", secret_checks.plant_key(API_KEY)
    )
    reports = lab["base"] / "reports-a"
    # -vvv: every module's arguments and results printed, where a key passed through a task would show.
    STATE["output_a"] = rollout(lab, fleet, reports, "--", "-vvv")
    STATE["reports_a"] = reports
    plan, report = load(reports / "plan.json"), load(reports / "rollout.json")
    assert plan["verdict"] == "planned" and plan["revision"] == commit_a
    assert {row["host"]: row["status"] for row in plan["hosts"]} == {"ct200": "would change", "ct129": "would change"}
    assert report["verdict"] == "succeeded" and report["revision"] == commit_a and report["trigger"] == "gitops test"
    rows = services(report)
    assert {key: row["status"] for key, row in rows.items()} == {
        ("ct200", "coder"): "updated",
        ("ct129", "chat"): "updated",
    }
    release_a, base = rows[("ct200", "coder")]["after_release_id"], rows[("ct129", "chat")]["after_release_id"]
    assert base != release_a and all(row["gate"]["passed"] for row in rows.values())
    assert rows[("ct129", "chat")]["release_choice"]["follows"] == "base"
    assert current_release(lab, "ct200", "coder") == release_a and current_release(lab, "ct129", "chat") == base
    assert len(set(answers(lab, "ct200"))) > 3 and len(set(answers(lab, "ct129"))) > 3
    # The key reached the server: it refuses a request without it.
    assert secret_checks.chat_statuses(lab["env"], API_KEY, keys=[None])[0][0] == 401
    STATE["release_a"], STATE["base"] = release_a, base


def test_commit_b_fails_on_the_canary_which_is_rolled_back_and_the_fleet_stays_on_a(lab, fleet):
    release_a = STATE["release_a"]
    commit_b = fleet["commit"]("B: the tree walk accepts any child (not lossless)", break_walk)
    reports = lab["base"] / "reports-b"
    # The plan step is proven with commit A; here the rollout itself is the subject.
    proc = rollout(lab, fleet, reports, "--skip-plan", "--", "-vvv", check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    keep(reports / "rollout.md", "failed-rollout.md")
    keep(reports / "rollout.json", "failed-rollout.json")
    report = load(reports / "rollout.json")
    assert report["verdict"] == "failed" and report["revision"] == commit_b
    rows = services(report)
    coder, chat = rows[("ct200", "coder")], rows[("ct129", "chat")]
    assert coder["status"] == "rolled back" and coder["before_release_id"] == coder["after_release_id"] == release_a
    assert (
        coder["rollback"]["failed_release_id"] not in (None, release_a)
        and coder["rollback"]["rolled_back_to_release_id"] == release_a
    )
    assert coder["gate"]["passed"] is False and coder["gate"]["stage"] in ("degenerate", "baseline")
    assert coder["rollback"]["gate"]["passed"] is True
    base = STATE["base"]
    assert chat["status"] == "not reached" and chat["after_release_id"] == base
    markdown = (reports / "rollout.md").read_text()
    assert "| ct200 | coder | `%s` | `%s` | rolled back |" % (release_a[:12], release_a[:12]) in markdown
    # Not reached: the run made no release choice there, so the row shows the links only (no "(base, ...)" mark).
    assert "| ct129 | chat | `%s` | `%s` | not reached |" % (base[:12], base[:12]) in markdown
    # The hosts themselves: ct200 still on A, ct129 on its base release, both answering.
    assert current_release(lab, "ct200", "coder") == release_a and current_release(lab, "ct129", "chat") == base
    assert len(set(answers(lab, "ct200"))) > 3 and len(set(answers(lab, "ct129"))) > 3
    history = on_host(lab, "ct200", "tail", "-n", "1", "/var/lib/sglang/coder/history.jsonl")
    assert json.loads(history)["rolled_back_to_release_id"] == release_a
    # A rollout and a rollback at -vvv, the journal excerpts of a failed gate in history and reports: the
    # key is nowhere but in its own file.
    output_a = STATE["output_a"]
    secret_checks.assert_the_key_is_only_in_its_file(
        lab["env"],
        API_KEY,
        {
            "rollout A (plan and rollout, -vvv)": output_a.stdout + output_a.stderr,
            "rollout B (rolled back, -vvv)": proc.stdout + proc.stderr,
        },
        [STATE["reports_a"], reports],
    )


def pull_unit(lab, fleet):
    """The pull timer's unit, rendered by the rollout_pull role on a lab host; its commands are run here
    (the rollout node), where the lab's hosts are reachable."""
    env = lab["env"]
    home = lab["base"] / "pull-node"
    home.mkdir(exist_ok=True)
    run(
        [
            "ansible-playbook",
            "-i",
            "inventories/lab/hosts.yml",
            "tests/gitops/pull-node.yml",
            "-l",
            "ct129",
            "-e",
            json.dumps({"rollout_pull_repo_url": str(fleet["bare"]), "rollout_pull_home": str(home)}),
        ],
        env,
    )
    unit = on_host(lab, "ct129", "systemctl", "cat", "ddtree-rollout-pull.service").splitlines()

    def command(key):
        return shlex.split(next(line for line in unit if line.startswith(key + "="))[len(key) + 1 :])

    argv = command("ExecStart")
    assert argv[1:] == [
        "--url",
        str(fleet["bare"]),
        "--checkout",
        "main",
        "--directory",
        str(home / "checkout"),
        "--only-if-changed",
        "--inventory",
        "inventories/lab/hosts.yml",
        "--limit",
        "all",
        "site.yml",
    ]
    guard_start, guard_stop = command("ExecStartPre"), command("ExecStopPost")
    assert guard_start[1] == "start" and guard_stop[1] == "stop" and guard_start[2:] == guard_stop[2:]
    environment = dict(
        item.strip('"').split("=", 1)
        for item in (line[len("Environment=") :] for line in unit if line.startswith("Environment="))
    )
    assert environment["DDTREE_ROLLOUT_TRIGGER"] == "pull timer"
    # The timer is installed, enabled and scheduled on the node.
    assert on_host(lab, "ct129", "systemctl", "is-enabled", "ddtree-rollout-pull.timer") == "enabled"
    assert on_host(lab, "ct129", "systemctl", "is-active", "ddtree-rollout-pull.timer") == "active"
    assert environment["DDTREE_LOCK_DIR"] == env["DDTREE_LOCK_DIR"]
    return {
        "command": [shutil.which("ansible-pull")] + argv[1:],
        "guard_args": guard_start[2:],
        "home": home,
        "env": dict(env, **{key: value for key, value in environment.items() if key != "HOME"}),
    }


def tick(pull, kill_at=None):
    """One run of the pull unit as systemd runs it: ExecStartPre (the guard), ExecStart (ansible-pull),
    ExecStopPost (the guard, told how ExecStart ended). kill_at: the task at whose start the run is
    SIGKILLed with its whole process group. Returns ansible-pull's process and what the guard said first."""
    env, home = pull["env"], pull["home"]
    said = run([str(PULL_GUARD), "start", *pull["guard_args"]], env, cwd=home).stdout
    marker = home / "killed"
    proc = run(
        pull["command"],
        killed_at_task(env, kill_at, marker) if kill_at else env,
        cwd=home,
        check=False,
        new_session=kill_at is not None,
    )
    if kill_at:
        assert proc.returncode == -9 and marker.exists(), "the run was not killed at %r (rc %d)\n%s" % (
            kill_at,
            proc.returncode,
            proc.stdout[-4000:],
        )
        marker.unlink()
    ended = {0: ("success", "0")}.get(
        proc.returncode, ("signal", "KILL") if proc.returncode < 0 else ("exit-code", str(proc.returncode))
    )
    run(
        [str(PULL_GUARD), "stop", *pull["guard_args"]],
        dict(env, SERVICE_RESULT=ended[0], EXIT_STATUS=ended[1]),
        cwd=home,
    )
    return proc, said


def verdict(lab, release):
    text = on_host(lab, "ct200", "cat", "/var/lib/sglang/coder/verdicts.json")
    return (json.loads(text)["verdicts"].get(release) or {}).get("verdict")


def test_the_pull_timer_rolls_out_a_good_commit_and_keeps_the_fleet_off_a_broken_one(lab, fleet):
    pull = pull_unit(lab, fleet)
    reports = Path(pull["env"]["DDTREE_ROLLOUT_REPORT_DIR"])
    commit_c = fleet["commit"]("C: the tree walk mended", mend_walk("mended in C"))
    walk_c = (fleet["work"] / WALK).read_text()
    proc = tick(pull)[0]
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = load(reports / "rollout.json")
    assert report["verdict"] == "succeeded" and report["revision"] == commit_c and report["trigger"] == "pull timer"
    rows = services(report)
    release_c = rows[("ct200", "coder")]["after_release_id"]
    # A DDTree-only change: ct200's DDTREE service is updated, ct129's NEXTN service is left as it was.
    assert release_c != STATE["release_a"] and rows[("ct129", "chat")]["after_release_id"] == STATE["base"]
    assert {key: row["status"] for key, row in rows.items()} == {
        ("ct200", "coder"): "updated",
        ("ct129", "chat"): "unchanged",
    }
    assert len(list((reports / "history").glob("*-rollout.json"))) == 1

    # No new commit: ansible-pull does not run the playbook at all.
    proc = tick(pull)[0]
    assert proc.returncode == 0 and "Repository has not changed" in proc.stdout + proc.stderr
    assert len(list((reports / "history").glob("*-rollout.json"))) == 1

    # Issue 14's incident: the controller dies as the canary's gate begins. ct200 is left current on D's
    # broken release, restarted and running, with no verdict: only a gate may settle it.
    commit_d = fleet["commit"]("D: broken again", break_walk)
    tick(pull, kill_at="Gate each service on its release")
    release_d = current_release(lab, "ct200", "coder")
    assert release_d != release_c and verdict(lab, release_d) is None
    assert on_host(lab, "ct200", "systemctl", "is-active", "sglang-coder.service") == "active"
    # The next tick: the guard saw the dead run and made the checkout fresh, so the playbook runs; the gate
    # fails the release it finds current, and the canary is rolled back.
    proc, said = tick(pull)
    assert "did not finish" in said and "Repository has not changed" not in proc.stdout + proc.stderr
    assert proc.returncode == 2, proc.stdout[-4000:]
    report = load(reports / "rollout.json")
    keep(reports / "rollout.md", "failed-pull-rollout.md")
    assert report["verdict"] == "failed" and report["revision"] == commit_d
    rows = services(report)
    coder = rows[("ct200", "coder")]
    assert coder["status"] == "rolled back" and coder["after_release_id"] == release_c
    assert coder["rollback"]["failed_release_id"] == release_d and "interrupted rollout" in coder["recovery"]["note"]
    assert rows[("ct129", "chat")]["status"] == "not reached"
    assert (
        current_release(lab, "ct200", "coder") == release_c and current_release(lab, "ct129", "chat") == STATE["base"]
    )
    assert verdict(lab, release_d) == "failed" and verdict(lab, release_c) == "passed"
    STATE["release_c"] = release_c
    # E puts back C's exact tree: its release is C's (the release id is the content's), which the hosts
    # already run, so the next test's rollouts are no-ops and its subject, the lock, is all they exercise.
    fleet["commit"]("E: back to C", lambda work: (work / WALK).write_text(walk_c))


def test_two_triggers_at_once_one_refuses_one_waits_nothing_breaks(lab, fleet):
    env = lab["env"]
    first_reports, refused_reports, waiting_reports = (
        lab["base"] / name for name in ("race-1", "race-refused", "race-wait")
    )
    base_command = [
        str(REPO / "scripts" / "rollout"),
        "--repo",
        str(fleet["bare"]),
        "--revision",
        "main",
        "--skip-plan",
    ]
    first = subprocess.Popen(
        base_command + ["--report-dir", str(first_reports), "--trigger", "first"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Wait until the first holds the lock (its holder wrote the lock files).
    lock_file = Path(env["DDTREE_LOCK_DIR"]) / ("%s-ct200.lock" % env["DDTREE_LAB_ID"])
    deadline = time.monotonic() + 600
    while (
        '"trigger": "first"' not in (lock_file.read_text() if lock_file.exists() else "")
        and time.monotonic() < deadline
    ):
        assert first.poll() is None, first.stdout.read()[-3000:]
        time.sleep(0.5)
    refused = run(
        base_command + ["--report-dir", str(refused_reports), "--trigger", "refused", "--lock-timeout", "0"],
        env,
        check=False,
    )
    waiting = subprocess.Popen(
        base_command + ["--report-dir", str(waiting_reports), "--trigger", "waiting", "--lock-timeout", "900"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first_out = first.communicate(timeout=1800)[0]
    waiting_out = waiting.communicate(timeout=1800)[0]

    assert refused.returncode == 75, refused.stdout[-3000:] + refused.stderr[-3000:]
    report = load(refused_reports / "rollout.json")
    assert report["verdict"] == "refused" and report["lock"]["holder"]["trigger"] == "first"
    assert "Nothing was changed" in (refused_reports / "rollout.md").read_text()

    assert first.returncode == 0, first_out[-4000:]
    assert waiting.returncode == 0, waiting_out[-4000:]
    assert "is held by rollout pid" in waiting_out
    first_report, waiting_report = load(first_reports / "rollout.json"), load(waiting_reports / "rollout.json")
    # The waiting one started its work only after the first had finished.
    assert waiting_report["lock"]["waited_s"] > 0 and waiting_report["finished"] >= first_report["finished"]
    assert (
        {row["status"] for row in first_report["hosts"]}
        == {row["status"] for row in waiting_report["hosts"]}
        == {"unchanged"}
    )
    release = services(first_report)[("ct200", "coder")]["after_release_id"]
    assert current_release(lab, "ct200", "coder") == release == STATE["release_c"]
    assert current_release(lab, "ct129", "chat") == STATE["base"]
    assert len(set(answers(lab, "ct200"))) > 3 and len(set(answers(lab, "ct129"))) > 3
