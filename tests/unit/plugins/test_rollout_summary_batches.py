"""The rollout report of a batched run that stops early lists every targeted host, the later batches'
as "not reached" (issue 15's 24-host rollout found them missing: ansible-playbook restricts the inventory to
each `serial` batch, and the callback read the play's hosts under that restriction).

An ansible-playbook run on this machine (about 5 s): four local hosts, `serial: 1`, the second fails.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = """
- name: A rollout in batches of one whose second host fails
  hosts: all
  gather_facts: false
  serial: 1
  max_fail_percentage: 0
  tasks:
    - name: The release each service runs before the rollout (what playbooks/lock.yml records; it makes a report)
      ansible.builtin.set_fact:
        ddtree_rollout_release_ids_at_start: {coder: {release_id: "0123456789ab"}}

    - name: Deploy
      ansible.builtin.fail:
        msg: planted failure
      when: inventory_hostname == 'host-2'
"""


def test_a_stopped_batched_rollout_reports_the_hosts_it_never_reached(tmp_path):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"host-%d" % n: local for n in range(1, 6)}}}))
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
        ["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"), "-l", "all:!host-5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 2, (run.stdout + run.stderr)[-3000:]
    report = json.loads((reports / "rollout.json").read_text())
    statuses = {row["host"]: row["status"] for row in report["hosts"]}
    # host-5 is outside --limit: not targeted, not listed. (host-1 ran none of the collection's modules, so
    # the report has nothing on it beyond its release at the start.)
    assert sorted(statuses) == ["host-1", "host-2", "host-3", "host-4"], statuses
    assert statuses["host-2"] == "failed" and statuses["host-3"] == statuses["host-4"] == "not reached", statuses
    assert report["verdict"] == "failed"
    markdown = (reports / "rollout.md").read_text()
    assert "host-3" in markdown and "host-4" in markdown and "host-5" not in markdown
