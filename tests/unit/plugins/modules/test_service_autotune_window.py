"""service_autotune_window: a service tuned on its own GPUs is stopped with the host's restore armed first, and
started again with it disarmed; a cut-short tuning's restore is cancelled, and a service that serves nothing is
left alone (docs/autotune.md, "Where it measures")."""

import pytest
from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune_trials import (
    window_start_commands,
    window_stop_commands,
)
from ansible_collections.ddtree.sglang.plugins.modules import service_autotune_window

RESTORE_TIMER = "sglang-coder-autotune-restore.timer"


def test_a_serving_service_is_stopped_after_its_restore_is_armed():
    plan = window_stop_commands("coder", unit_active=True, restore_active=False, restore_after=5400)
    assert plan["serving"] is True
    arm, stop = plan["commands"]
    assert arm[:5] == ["systemd-run", "--unit", "sglang-coder-autotune-restore", "--on-active", "5400s"]
    assert "ExecStartPre=-/bin/systemctl stop sglang-coder-autotune.service" in arm
    assert arm[-3:] == ["/bin/systemctl", "start", "sglang-coder.service"]
    assert stop == ["systemctl", "stop", "sglang-coder.service"]


def test_a_cut_short_tunings_restore_is_cancelled_and_armed_anew():
    plan = window_stop_commands("coder", unit_active=False, restore_active=True, restore_after=60)
    assert plan["serving"] is True  # it served before the run that stopped it died
    assert plan["commands"][0] == ["systemctl", "stop", RESTORE_TIMER]
    assert plan["commands"][1][0] == "systemd-run" and plan["commands"][2][1] == "stop"


def test_a_service_that_serves_nothing_is_left_alone():
    assert window_stop_commands("coder", False, False, 60) == {"serving": False, "commands": []}


def test_afterwards_the_restore_is_disarmed_and_the_service_started_unless_the_restore_did():
    assert window_start_commands("coder", unit_active=False, restore_active=True) == [
        ["systemctl", "stop", RESTORE_TIMER],
        ["systemctl", "start", "sglang-coder.service"],
    ]
    assert window_start_commands("coder", unit_active=True, restore_active=False) == []


class FakeSystemd:
    """AnsibleModule.run_command on a host whose units are in `states` (unit -> ActiveState)."""

    def __init__(self, states, fail=()):
        self.states, self.fail, self.ran = dict(states), set(fail), []

    def __call__(self, argv, **kwargs):
        if argv[:2] == ["systemctl", "show"]:
            return 0, self.states.get(argv[-1], "inactive") + "\n", ""
        self.ran.append(" ".join(argv[:3]))
        return (1, "", "boom") if argv[0] in self.fail else (0, "", "")


@pytest.fixture
def systemd(monkeypatch):
    def make(states, fail=()):
        fake = FakeSystemd(states, fail)
        # Set on the class, an instance that is not a function is not bound: it gets the command alone.
        monkeypatch.setattr("ansible.module_utils.basic.AnsibleModule.run_command", fake)
        return fake

    return make


def test_stop_and_start_through_main(systemd, capsys):
    fake = systemd({"sglang-coder.service": "active"})
    code, result = run_module(
        service_autotune_window, {"service": "coder", "state": "stopped", "restore_after": 300}, capsys
    )
    assert code == 0 and result["changed"] is True and result["serving"] is True
    assert fake.ran == ["systemd-run --unit sglang-coder-autotune-restore", "systemctl stop sglang-coder.service"]
    fake = systemd({RESTORE_TIMER: "active"})
    code, result = run_module(service_autotune_window, {"service": "coder", "state": "started"}, capsys)
    assert code == 0 and fake.ran == ["systemctl stop %s" % RESTORE_TIMER, "systemctl start sglang-coder.service"]


def test_check_mode_runs_nothing(systemd, capsys):
    fake = systemd({"sglang-coder.service": "active"})
    code, result = run_module(
        service_autotune_window,
        {"service": "coder", "state": "stopped", "restore_after": 300, "_ansible_check_mode": True},
        capsys,
    )
    assert code == 0 and result["changed"] is True and len(result["commands"]) == 2 and fake.ran == []


def test_a_failed_arming_fails_before_the_service_stops_and_says_it_serves(systemd, capsys):
    fake = systemd({"sglang-coder.service": "active"}, fail={"systemd-run"})
    code, result = run_module(
        service_autotune_window, {"service": "coder", "state": "stopped", "restore_after": 300}, capsys
    )
    assert code == 1 and result["serving"] is True and "systemd-run" in result["msg"]
    assert fake.ran == ["systemd-run --unit sglang-coder-autotune-restore"]  # never stopped without a restore


def test_a_restore_that_cannot_be_disarmed_still_starts_the_service(systemd, capsys):
    fake = systemd({RESTORE_TIMER: "active"}, fail={"systemctl"})
    code, result = run_module(service_autotune_window, {"service": "coder", "state": "started"}, capsys)
    # The start failed too (the fake fails every systemctl): the module fails on it, after trying it.
    assert code == 1 and fake.ran == ["systemctl stop %s" % RESTORE_TIMER, "systemctl start sglang-coder.service"]
