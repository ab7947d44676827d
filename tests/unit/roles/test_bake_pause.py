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


@pytest.mark.skipif(not os.path.exists("/usr/bin/ssh"), reason="needs an ssh client")
def test_an_unreachable_host_pauses_the_rollout_with_its_resume_command(tmp_path):
    (tmp_path / "bake.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {
        "batch": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        # Port 9 (discard) on localhost: nothing listens there, the connection is refused at once.
        "gone": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9,
                 "ansible_ssh_common_args": "-o ConnectTimeout=3 -o StrictHostKeyChecking=no"}}}}))
    reports = tmp_path / "reports"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), DDTREE_ROLLOUT_REPORT_DIR=str(reports),
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_HOME=str(tmp_path / "ansible-home"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    run = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "bake.yml")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = run.stdout + run.stderr
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
