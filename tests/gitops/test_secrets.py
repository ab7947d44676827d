"""Secrets stay secret: a rollout and a rollback with a canary API key at -vvv, then a search for the key
everywhere a key could leak (issue 18, docs/services.md "The API key").

On a lab of its own (test_gitops.py's fixtures), ct200's service gets a fresh random API key in the fleet
repository (as a vault variable would put it there), and:
  1. commit A rolls out through scripts/rollout at -vvv, plan (check + diff) first; the service then
     refuses a request without the key and answers one with it (the key did reach the server);
  2. commit B (a release whose server crashes at start, after printing its server_args) fails the gate
     and is rolled back, also at -vvv;
  3. the key is searched for in the controller's output of both runs, the reports (JSON, Markdown,
     history), Ansible's local temp files, the rollout lock files; on the host in every file (unit files
     and drop-ins, releases, state: gate results, baselines, history), every process's argv and
     environment, every journal field, every unit's loaded configuration.
The only place it may be: the service's secret file (/etc/sglang/coder.api-key, 0600 root).
Run by `scripts/test secrets` (DDTREE_TEST_SECRETS=1; not part of `scripts/test`: about 10 minutes).
"""

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

import secret_search
# The fixtures (lab, fleet) and the skip rule (pytestmark) are used by pytest, by name.
from test_gitops import ARTIFACTS, REPO, fleet, lab, on_host, run, services  # noqa: F401 pylint: disable=unused-import
from test_gitops import pytestmark as gitops_pytestmark

# A lab of its own and two rollouts at -vvv: about 10 minutes on two cores, so a stage of its own
# (`scripts/test secrets`), outside the suite's 15 minutes until it rides on test_gitops.py's rollouts.
pytestmark = [gitops_pytestmark, pytest.mark.skipif(os.environ.get("DDTREE_TEST_SECRETS") != "1",
                                                    reason="the secrets search runs in its own stage: scripts/test secrets")]

SERVICE, HOST = "coder", "ct200"
SECRET_FILE = "/etc/sglang/coder.api-key"
GROUP_VARS = "inventories/example/group_vars/blackwell.yml"  # the lab's blackwell group links here
FAULT = "sglang_overlay/src/sglang_overlay/release_fault.py"  # lab/runtime/.../faults.py: a fault inside a release
# Where a leak could be written on the host ("/" less pseudo file systems would work too, but takes minutes).
HOST_ROOTS = ["/etc", "/opt/sglang", "/var/lib/sglang", "/var/log", "/var/tmp", "/tmp", "/run", "/root", "/home"]


def plant_key(key):
    def change(work):
        path = work / GROUP_VARS
        data = yaml.safe_load(path.read_text())
        next(service for service in data["sglang_services"] if service["name"] == SERVICE)["api_key"] = key
        path.unlink()  # the checkout's file may be a link: write a file of the fleet's own
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return change


def crash_at_start(work):
    (work / FAULT).write_text('FAULT = "crash_at_start"\n')


def rollout(lab, fleet, report_dir, *extra, check=True):
    return run([str(REPO / "scripts" / "rollout"), "--repo", str(fleet["bare"]), "--revision", "main", "--limit", HOST,
                "--report-dir", str(report_dir), "--trigger", "secrets test", *extra, "--", "-vvv"],
               lab["env"], check=check)


def on_host_with_stdin(lab, stdin, *command):
    """A command on the host, given stdin: the key never goes into an argv, here or there."""
    argv = ["podman", "exec", "-i", "%s-%s" % (lab["env"]["DDTREE_LAB_ID"], HOST), *command]
    proc = subprocess.run(argv, env=lab["env"], input=stdin, text=True, capture_output=True, timeout=600, check=False)
    assert proc.returncode == 0, "%s exited %d: %s" % (argv[:6], proc.returncode, proc.stderr[-3000:])
    return proc.stdout


def status_without_and_with(lab, key):
    """HTTP status of a chat completion without, then with, the key (the key travels on stdin, not in argv)."""
    code = ("import json, sys, urllib.error, urllib.request\n"
            "key = sys.stdin.readline().strip()\n"
            "body = json.dumps({'model': 'any', 'max_tokens': 4, 'messages': [{'role': 'user', 'content': 'Hi'}]}).encode()\n"
            "for headers in ({}, {'Authorization': 'Bearer ' + key}):\n"
            "    request = urllib.request.Request('http://127.0.0.1:30000/v1/chat/completions', body,\n"
            "                                     dict(headers, **{'Content-Type': 'application/json'}))\n"
            "    try:\n"
            "        print(urllib.request.urlopen(request, timeout=60).status)\n"
            "    except urllib.error.HTTPError as error:\n"
            "        print(error.code)\n")
    return on_host_with_stdin(lab, key + "\n", "python3", "-c", code).split()


def search_host(lab, key):
    script = Path(secret_search.__file__).read_text()
    return json.loads(on_host_with_stdin(lab, key + "\n", "python3", "-c", script, *HOST_ROOTS))


def search_controller(lab, key, outputs, report_dirs):
    """The key in the runs' output, the reports, and what the runs left on the controller."""
    needle = key.encode()
    env = lab["env"]
    found = {"output": [name for name, text in outputs.items() if needle in text.encode()]}
    workdir = Path(env["DDTREE_ROLLOUT_WORKDIR"])
    # The fleet repository's mirror and checkouts hold the key by design (the inventory, as a vault would).
    roots = [str(path) for path in report_dirs] + [env["ANSIBLE_LOCAL_TEMP"], env["DDTREE_LOCK_DIR"], str(workdir)]
    found["files"] = [hit["path"] for hit in secret_search.search_files(
        [root for root in roots if Path(root).exists()], needle, skip=[str(workdir / "mirror.git"), str(workdir / "trees")])]
    return found


def assert_the_key_is_only_in_its_file(lab, key, outputs, report_dirs):
    """Search everywhere (the controller: outputs, report_dirs, what the runs left; the host) and fail
    listing every place but the service's secret file where the key is. Also writes the search's
    result to the artifacts (secrets-search.json). Reusable by a test that ran the rollouts itself."""
    found = {"controller": search_controller(lab, key, outputs, report_dirs), HOST: search_host(lab, key)}
    allowed = [hit for hit in found[HOST]["files"] if hit["path"] == SECRET_FILE]
    found[HOST]["files"] = [hit for hit in found[HOST]["files"] if hit not in allowed]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "secrets-search.json").write_text(json.dumps({"found": found, "allowed": allowed}, indent=2) + "\n")
    leaks = {where: {kind: hits for kind, hits in places.items() if hits} for where, places in found.items()}
    assert leaks == {"controller": {}, HOST: {}}, "the API key leaked:\n" + json.dumps(leaks, indent=2)
    # Its one place: the secret file, root's alone.
    assert allowed == [{"path": SECRET_FILE, "mode": "0600", "uid": 0, "gid": 0}], allowed


def test_a_rollout_and_a_rollback_leave_the_key_only_in_its_secret_file(lab, fleet):
    key = "canary-" + secrets.token_hex(16)
    lab["env"].update(ANSIBLE_LOCAL_TEMP=str(lab["base"] / "ansible-tmp"), DDTREE_ROLLOUT_REPORT_HISTORY="1")
    fleet["commit"]("A: a canary API key for %s on %s" % (SERVICE, HOST), plant_key(key))
    reports_a, reports_b = lab["base"] / "reports-a", lab["base"] / "reports-b"
    proc_a = rollout(lab, fleet, reports_a)
    release_a = services(json.loads((reports_a / "rollout.json").read_text()))[(HOST, SERVICE)]["after_release_id"]
    # The key reached the server: it refuses a request without it and answers one with it.
    assert status_without_and_with(lab, key) == ["401", "200"]

    fleet["commit"]("B: a release that crashes at start", crash_at_start)
    proc_b = rollout(lab, fleet, reports_b, "--skip-plan", check=False)
    outputs = {"rollout A (plan and rollout, -vvv)": proc_a.stdout + proc_a.stderr,
               "rollout B (rolled back, -vvv)": proc_b.stdout + proc_b.stderr}
    try:
        # B was a rollback, and the service is back on A, with its key.
        assert proc_b.returncode == 1, proc_b.stdout[-3000:] + proc_b.stderr[-3000:]
        service_b = services(json.loads((reports_b / "rollout.json").read_text()))[(HOST, SERVICE)]
        assert service_b["status"] == "rolled back" and service_b["after_release_id"] == release_a, service_b
        assert status_without_and_with(lab, key) == ["401", "200"]
    finally:
        # Searched also when B went wrong: where the key is matters most then.
        assert_the_key_is_only_in_its_file(lab, key, outputs, [reports_a, reports_b])
