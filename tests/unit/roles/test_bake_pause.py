"""The bake's pause, played for real: the role's bake entry point with a host that cannot be reached.

An ansible-playbook run on this machine (about 10 s): one host of the batch runs the bake, whose re-check
of an updated host (an SSH port nobody listens on) is inconclusive. The run must pause - no rollback, the
play fails, the report says "paused", names the host and gives the command to resume - and the re-check
must have been delegated to that host (the report attributes it there).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = """
- name: A batch whose bake re-checks a host that cannot be reached
  hosts: all
  gather_facts: false
  tasks:
    - name: The facts the sglang_service role leaves on a host it deployed
      ansible.builtin.set_fact:
        sglang_service_plan:
          services:
            - {name: coder, unit: sglang-coder.service, host: 127.0.0.1, port: 30000, served_model_name: coder, gpus: [0],
               gate: {start_timeout: 5, no_progress_timeout: 5}}
        sglang_service_since: {stdout: "2026-11-30 10:00:00"}
        sglang_service_release: {release_id: new}
        sglang_service_gate_results: [{passed: true}]

    - name: Bake
      ansible.builtin.include_role:
        name: ddtree.sglang.sglang_service
        tasks_from: bake
      vars:
        sglang_service_bake_time_s: 1
        sglang_service_bake_hosts: [gone]
        sglang_service_bake_inconclusive: pause
"""


# Port 9 (discard) on loopback: nothing listens there, the connection is refused at once.
UNREACHABLE = {
    "ansible_connection": "ssh",
    "ansible_port": 9,
    "ansible_ssh_common_args": "-o ConnectTimeout=3 -o StrictHostKeyChecking=no",
}


def play_bake(tmp_path, bake_hosts, hosts, group_vars=None):
    """Run PLAYBOOK's bake from "batch" (a local host) over bake_hosts; return (run, output, reports dir)."""
    (tmp_path / "bake.yml").write_text(PLAYBOOK.replace("[gone]", json.dumps(bake_hosts)))
    batch = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text(
        json.dumps({"all": {"vars": group_vars or {}, "hosts": dict({"batch": batch}, **hosts)}})
    )
    reports = tmp_path / "reports"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        DDTREE_ROLLOUT_REPORT_DIR=str(reports),
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    )
    run = subprocess.run(
        ["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "bake.yml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return run, run.stdout + run.stderr, reports


@pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs an ssh client")
def test_an_unreachable_host_pauses_the_rollout_with_its_resume_command(tmp_path):
    run, output, reports = play_bake(tmp_path, ["gone"], {"gone": dict(UNREACHABLE, ansible_host="127.0.0.1")})
    assert run.returncode == 2, output[-3000:]
    assert "PAUSED: the bake's re-check was inconclusive for gone coder (unreachable" in output
    assert "Roll back" not in output and "Stop the failed release" not in output
    report = json.loads((reports / "rollout.json").read_text())
    assert report["verdict"] == "paused" and "stopped" not in report
    rows = {row["host"]: row for row in report["hosts"]}
    assert rows["gone"]["status"] == "inconclusive" and rows["gone"]["failure"] is None
    assert rows["batch"]["failure"] is None  # the pause ran on it; it is not its failure
    assert "ansible-playbook -i %s" % (tmp_path / "hosts.yml") in report["command"]["argv"]
    markdown = (reports / "rollout.md").read_text()
    assert "rollout: PAUSED" in markdown and "cd %s && " % tmp_path in markdown
    assert "| gone | coder | inconclusive |" in markdown


@pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs an ssh client")
def test_each_re_check_connects_to_its_own_host_when_ansible_host_is_a_template(tmp_path):
    """An inventory that builds ansible_host from inventory_hostname (the lab's does; so do many fleets').

    Delegated from "batch", a re-check's connection variables are templated as batch's: without the bake's own
    ansible_host, both re-checks below connected to 127.0.0.1 (batch's address), the 24-host lab's bug.
    """
    hosts = {"host-2": UNREACHABLE, "host-3": UNREACHABLE}
    run, output, _reports = play_bake(
        tmp_path,
        ["host-2", "host-3"],
        hosts,
        group_vars={"ansible_host": "127.0.0.{{ inventory_hostname[-1] | replace('h', '1') }}"},
    )
    assert run.returncode == 2, output[-3000:]
    assert "connect to host 127.0.0.2 port 9" in output and "connect to host 127.0.0.3 port 9" in output, output[-3000:]
    assert "connect to host 127.0.0.1 port 9" not in output
