"""AWX / Automation Platform: the execution environment's pins, and a playbook run the way AWX runs it.

AWX runs a job with ansible-runner: a private data directory (inventory/, env/, the project), extra
vars, and artifacts (the job events, stdout, status, rc). This runs playbooks/lock.yml (the rollout's
first play: the lock and each service's release, which starts the report) against localhost under
ansible-runner, and checks that the rollout_summary callback wrote the same reports as under
ansible-playbook. About 5 s. docs/awx.md.
"""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ansible_runner = pytest.importorskip("ansible_runner")


def pins(path):
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", path.read_text(), flags=re.M))


def test_the_execution_environment_pins_equal_the_controllers():
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert ee["version"] == 3
    controller = pins(REPO / "requirements" / "controller.txt")
    for key, package in (("ansible_core", "ansible-core"), ("ansible_runner", "ansible-runner")):
        assert ee["dependencies"][key]["package_pip"] == "%s==%s" % (package, controller[package]), key
    # The collection depends on no other collection (galaxy.yml): the EE installs none.
    assert "galaxy" not in ee["dependencies"]
    assert yaml.safe_load((REPO / "galaxy.yml").read_text())["dependencies"] == {}


def test_a_playbook_under_ansible_runner_writes_the_rollout_reports(tmp_path):
    private = tmp_path / "private"
    (private / "inventory").mkdir(parents=True)
    (private / "inventory" / "hosts").write_text(
        "localhost ansible_connection=local ansible_python_interpreter=%s\n" % sys.executable
    )
    reports = tmp_path / "reports"
    result = ansible_runner.run(
        private_data_dir=str(private),
        project_dir=str(REPO),
        playbook="playbooks/lock.yml",
        extravars={
            "sglang_services": [],
            "sglang_service_root": str(tmp_path / "opt"),
            "ddtree_rollout_lock_timeout": 0,
        },
        envvars={
            "DDTREE_ROLLOUT_REPORT_DIR": str(reports),
            "DDTREE_LOCK_DIR": str(tmp_path / "locks"),
            "DDTREE_CACHE": str(tmp_path / "cache"),
            "DDTREE_ROLLOUT_TRIGGER": "awx job 42",
            "DDTREE_ROLLOUT_REVISION": "c" * 40,
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        },
        quiet=True,
    )
    assert (result.status, result.rc) == ("successful", 0), result.stdout.read()[-3000:]
    # AWX's side: the job's artifacts (events, status, rc) under the private data dir.
    artifacts = Path(result.config.artifact_dir)
    assert (artifacts / "rc").read_text() == "0" and (artifacts / "status").read_text() == "successful"
    assert any(event.get("event") == "playbook_on_stats" for event in result.events)
    # Ours: the same reports as under ansible-playbook.
    report = json.loads((reports / "rollout.json").read_text())
    assert report["kind"] == "rollout" and report["verdict"] == "succeeded"
    assert report["trigger"] == "awx job 42" and report["revision"] == "c" * 40
    assert [row["host"] for row in report["hosts"]] == ["localhost"]
    assert report["lock"]["refused"] is False
    assert "## ddtree.sglang rollout: succeeded" in (reports / "rollout.md").read_text()
