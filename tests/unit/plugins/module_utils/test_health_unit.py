"""The health gate's start watch: unit states, the diagnosis of a failed start, and StartWatch fed with times."""

import pytest
from health_samples import (
    AUTO_RESTART,
    BAD_FLAG,
    FAILED_EXIT_1,
    FAILED_EXIT_2,
    FAILED_KILL,
    FAILED_OOM,
    GOOD_START,
    KERNEL_OOM,
    OOM_KILL,
    PLUGIN_FAILURE,
    SCHEDULER_CRASH,
    UNIT,
    UNKNOWN_ALGORITHM,
    props,
)

from ansible_collections.ddtree.sglang.plugins.module_utils import health_unit
from ansible_collections.ddtree.sglang.plugins.module_utils.health_journal import match_signatures
from ansible_collections.ddtree.sglang.plugins.module_utils.health_unit import (
    StartWatch,
    classify_unit,
    diagnose_failure,
    kernel_oom_lines,
    parse_systemctl_show,
)


def test_parse_systemctl_show():
    text = "ActiveState=failed\nSubState=failed\nResult=oom-kill\nNRestarts=0\nInactiveExitTimestamp=Mon 2026-11-30 10:00:00 UTC\n"
    parsed = parse_systemctl_show(text)
    assert parsed["Result"] == "oom-kill" and parsed["InactiveExitTimestamp"] == "Mon 2026-11-30 10:00:00 UTC"


# ---- unit states ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "properties, phase, kind, alive",
    [
        (props(), "running", None, True),
        (props(ActiveState="activating", SubState="start-pre"), "starting", None, True),
        (FAILED_EXIT_2, "failed", "bad_flag", False),
        (FAILED_EXIT_1, "failed", "exited", False),
        (FAILED_KILL, "failed", "killed", False),
        (FAILED_OOM, "failed", "oom", False),
        (AUTO_RESTART, "restarting", "restarted", False),
        (props(NRestarts="2"), "restarting", "restarted", False),
        (props(ActiveState="failed", SubState="failed", Result="start-limit-hit"), "failed", "crash_loop", False),
        (
            props(
                ActiveState="deactivating",
                SubState="final-sigterm",
                Result="signal",
                ExecMainCode="2",
                ExecMainStatus="9",
            ),
            "stopping",
            "killed",
            False,
        ),
        (props(ActiveState="deactivating", SubState="stop-sigterm"), "stopping", "stopping", False),
        (
            props(ActiveState="inactive", SubState="dead", ExecMainCode="1", ExecMainStatus="0", MainPID="0"),
            "exited",
            "exited",
            False,
        ),
        (props(ActiveState="inactive", SubState="dead", ExecMainCode="0", MainPID="0"), "inactive", "inactive", False),
        (props(LoadState="not-found", ActiveState="inactive"), "missing", "unit_missing", False),
    ],
)
def test_classify_unit(properties, phase, kind, alive):
    verdict = classify_unit(properties)
    assert (verdict["phase"], verdict["kind"], verdict["alive"], verdict["fatal"]) == (phase, kind, alive, not alive)


def test_exit_texts_are_systemds():
    assert classify_unit(FAILED_KILL)["exit"]["text"] == "status=9/KILL"
    assert "status=2" in classify_unit(FAILED_EXIT_2)["reason"]
    assert classify_unit(AUTO_RESTART)["reason"] == (
        "it died and systemd is about to restart it (activating/auto-restart, NRestarts=0, last exit status=9/KILL)"
    )
    assert "systemd restarted it (NRestarts=2" in classify_unit(props(NRestarts="2"))["reason"]


# ---- diagnosis -----------------------------------------------------------------------------------


def diagnose(lines, properties, kernel=()):
    unit = classify_unit(properties)
    return diagnose_failure(
        unit, match_signatures(lines), lines, kernel_oom_lines(kernel, UNIT, [properties["ExecMainPID"]])
    )


def test_diagnose_bad_flag_quotes_the_parser():
    found = diagnose(BAD_FLAG, FAILED_EXIT_2)
    assert found["kind"] == "bad_flag" and "unrecognized arguments: --foo" in found["reason"]
    assert diagnose([], FAILED_EXIT_2)["kind"] == "bad_flag"  # exit status 2 alone says it too


def test_diagnose_self_kill_is_not_an_oom():
    found = diagnose(SCHEDULER_CRASH, FAILED_KILL, kernel=KERNEL_OOM[3:])  # an OOM of another process
    assert found["kind"] == "scheduler_exception" and found["oom"] is False
    assert "RuntimeError: DDTree verify" in found["reason"]
    assert (
        "status=9/KILL after 'Received sigquit' is SGLang killing its own process tree, not an OOM" in found["reason"]
    )


def test_diagnose_oom_from_result_and_from_the_kernel_log():
    assert diagnose(OOM_KILL, FAILED_OOM)["kind"] == "oom"
    found = diagnose(
        ["[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB"], FAILED_KILL, kernel=KERNEL_OOM
    )
    assert found["kind"] == "oom" and "oom-kill:constraint=CONSTRAINT_MEMCG" in found["reason"]


def test_kernel_oom_lines_keep_only_this_unit():
    lines = kernel_oom_lines(KERNEL_OOM, UNIT, ["4182"])
    assert len(lines) == 2 and all("4182" in line for line in lines)
    assert kernel_oom_lines(KERNEL_OOM, "sglang-other.service", ["9999"]) == []


def test_diagnose_sigkill_from_outside():
    found = diagnose(["[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB"], FAILED_KILL)
    assert found["kind"] == "killed" and "no 'Received sigquit'" in found["reason"]


def test_diagnose_plugin_failure_is_the_cause_of_the_unknown_algorithm():
    found = diagnose(PLUGIN_FAILURE, FAILED_EXIT_1)
    assert found["kind"] == "plugin"
    assert "ModuleNotFoundError: No module named 'sglang_overlay.adapter'" in found["reason"]
    assert diagnose(UNKNOWN_ALGORITHM, FAILED_EXIT_1)["kind"] == "unknown_algorithm"


def test_diagnose_auto_restart_without_journal_evidence():
    found = diagnose([], AUTO_RESTART)
    assert found["kind"] == "restarted" and "systemd is about to restart it" in found["reason"]


# ---- the start watch (no sleeping: times are fed) ---------------------------------------------------


def feed_all(watch, timeline):
    """timeline: [(t, props, lines, port_open)] -> the last state."""
    state = None
    for moment, properties, lines, port in timeline:
        state = watch.feed(moment, properties, lines, port)
        if state["state"] in ("failed", "ready"):
            break
    return state


def test_watch_good_start_is_ready_when_the_port_answers():
    watch = StartWatch(started_at=100.0, no_progress_timeout=120, start_timeout=900, settle_seconds=2)
    state = feed_all(
        watch,
        [
            (100.0, props(ActiveState="activating", SubState="start-pre"), [], False),
            (102.0, props(), GOOD_START[:5], False),  # weights begin loading
            (200.0, props(), GOOD_START[5:12], False),  # 98 s later: weights loaded (deadline reset at 102)
            (300.0, props(), GOOD_START[12:20], False),  # graphs captured (reset at 200), uvicorn up
            (301.0, props(), GOOD_START[20:], True),
        ],
    )
    assert state == {"state": "ready"}
    assert watch.first_progress_at == 102.0 and watch.port_at == 301.0
    assert watch.progress[-1]["marker"] == "fired_up"


def test_watch_no_progress_deadline():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900)
    assert watch.feed(0.0, props(), GOOD_START[:5])["state"] == "starting"  # Load weight begin at 0
    assert (
        watch.feed(119.0, props(), ["Loading safetensors checkpoint shards:  40% Completed | 2/5"])["state"]
        == "starting"
    )
    state = watch.feed(120.5, props(), [])
    assert state["state"] == "failed" and state["kind"] == "no_progress"
    assert "'load_weight_begin'" in state["reason"] and "active/running" in state["reason"]


def test_watch_start_timeout_caps_steady_progress():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=300)
    moment = 0.0
    state = None
    while moment <= 400:
        state = watch.feed(moment, props(), ["[..] Load weight begin. avail mem=93.12 GB"])
        if state["state"] == "failed":
            break
        moment += 100
    assert state["kind"] == "start_timeout" and moment == 300


def test_watch_fails_on_a_signature_after_the_settle_poll_with_the_whole_traceback():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900, settle_seconds=2)
    assert watch.feed(1.0, props(), SCHEDULER_CRASH[:3])["state"] == "failing"  # "Scheduler hit an exception"
    assert watch.feed(2.0, props(), SCHEDULER_CRASH[3:8])["state"] == "failing"
    state = watch.feed(3.0, FAILED_KILL, SCHEDULER_CRASH[8:])
    assert state["state"] == "failed" and state["kind"] == "scheduler_exception"
    assert "RuntimeError: DDTree verify" in state["reason"] and "not an OOM" in state["reason"]
    assert watch.feed(4.0, props(), [])["state"] == "failed"  # sticky


def test_watch_bad_flag_fails_at_once_without_settle():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900, settle_seconds=0)
    state = watch.feed(0.5, FAILED_EXIT_2, BAD_FLAG)
    assert state["state"] == "failed" and state["kind"] == "bad_flag"


def test_watch_oom_refined_by_the_kernel_log():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900)
    state = watch.feed(5.0, FAILED_KILL, ["[2026-11-30 10:00:06 TP0] Load weight begin. avail mem=93.12 GB"])
    assert state["kind"] == "killed" and health_unit.wants_kernel_log(watch.unit)
    assert watch.refine(kernel_oom_lines(KERNEL_OOM, UNIT, ["4182"]))["kind"] == "oom"


def test_watch_port_open_with_a_fatal_line_is_not_ready():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900, settle_seconds=1)
    assert watch.feed(0.0, props(), GOOD_START + ["Traceback (most recent call last):"], True)["state"] == "failing"


def test_watch_after_ready_still_catches_crashes():
    watch = StartWatch(started_at=0.0, no_progress_timeout=1, start_timeout=2)
    assert watch.feed(0.5, props(), GOOD_START, True)["state"] == "ready"
    assert watch.feed(50.0, props(), [])["state"] == "ready"  # no deadlines after ready
    state = watch.feed(51.0, AUTO_RESTART, SCHEDULER_CRASH[2:])
    assert state["state"] == "failed" and state["kind"] == "scheduler_exception"


def test_watch_excerpt_is_the_tail():
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900)
    watch.feed(0.0, props(), ["line %d" % i for i in range(200)])
    assert watch.excerpt(tail=3) == ["line 197", "line 198", "line 199"]
