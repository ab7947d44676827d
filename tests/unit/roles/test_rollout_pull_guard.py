"""The pull timer's guard: a run that died is rolled out again by the next tick, a finished one is not."""

import os
import subprocess
from pathlib import Path

import pytest

ROLE = Path(__file__).resolve().parents[3] / "roles" / "rollout_pull"
GUARD = ROLE / "files" / "ddtree-rollout-pull-guard"


@pytest.fixture
def node(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    marker = tmp_path / "run-in-progress"

    def guard(action, **env):
        return subprocess.run(
            [str(GUARD), action, str(checkout), str(marker)],
            env=dict(os.environ, **env),
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    return checkout, marker, guard


@pytest.mark.parametrize("result, status", [("success", "0"), ("exit-code", "2")])
def test_a_run_that_finished_leaves_the_checkout_for_only_if_changed(node, result, status):
    checkout, marker, guard = node
    guard("start")
    assert marker.exists() and checkout.exists()
    guard("stop", SERVICE_RESULT=result, EXIT_STATUS=status)
    assert not marker.exists()
    guard("start")
    assert checkout.exists()


@pytest.mark.parametrize("result, status", [("signal", "KILL"), ("exit-code", "1"), ("timeout", ""), (None, None)])
def test_a_run_that_died_is_rolled_out_again_from_a_fresh_checkout(node, result, status):
    checkout, marker, guard = node
    guard("start")
    # ExecStopPost after a kill (or nothing at all, after a reboot).
    if result:
        assert "the next run rolls out again" in guard("stop", SERVICE_RESULT=result, EXIT_STATUS=status)
    assert marker.exists()
    assert "did not finish" in guard("start")
    assert not checkout.exists() and marker.exists()


def test_never_removes_a_directory_that_is_not_a_checkout(node, tmp_path):
    checkout, marker, guard = node
    (checkout / ".git").rmdir()
    marker.write_text("2026-11-30T10:00:00Z\n")
    guard("start")
    assert checkout.exists()


def test_the_unit_runs_the_guard_around_ansible_pull():
    unit = (ROLE / "templates" / "ddtree-rollout-pull.service.j2").read_text()
    assert (
        unit.index("ExecStartPre={{ ([rollout_pull_guard, 'start']")
        < unit.index("ExecStart={{")
        < unit.index("ExecStopPost={{ ([rollout_pull_guard, 'stop']")
    )
    tasks = (ROLE / "tasks" / "main.yml").read_text()
    # Installed before the unit, whose validation (systemd-analyze verify) needs it to exist.
    assert tasks.index("src: ddtree-rollout-pull-guard") < tasks.index("src: ddtree-rollout-pull.service.j2")
