"""The journal rules on real SGLang 0.5.23 journals from the H200 (tests/fixtures/sglang-journals/)."""

import pathlib

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import health_journal
from ansible_collections.ddtree.sglang.plugins.module_utils.health_journal import (
    PROGRESS_MARKERS,
    exception_summary,
    match_progress,
    match_signatures,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.health_unit import StartWatch

JOURNALS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "sglang-journals"
HEALTHY = ["start-none-graph.log", "start-dflash-graph.log", "start-ddtree-graph.log", "start-ddtree-graph-tp2.log"]
RUNNING = {
    "LoadState": "loaded",
    "ActiveState": "active",
    "SubState": "running",
    "Result": "success",
    "NRestarts": "0",
    "ExecMainCode": "0",
    "ExecMainStatus": "0",
    "MainPID": "758",
}
KILLED = dict(
    RUNNING, ActiveState="failed", SubState="failed", Result="signal", ExecMainCode="2", ExecMainStatus="9", MainPID="0"
)


def journal(name):
    return (JOURNALS / name).read_text().splitlines()


def diagnose(name, props):
    """What the start watch concludes from a whole journal and the unit's final state."""
    watch = StartWatch(started_at=0.0, no_progress_timeout=120, start_timeout=900)
    watch.feed(1.0, props, journal(name), port_open=False)
    return watch.feed(2.0, props, (), port_open=False)


@pytest.mark.parametrize("name", HEALTHY)
def test_a_healthy_real_start_has_no_fatal_signature(name):
    # They hold "ModuleNotFoundError: No module named 'openai_harmony'" (the Responses API is off),
    # "Fail to set RLIMIT_NOFILE", "Ignore import error ... deep_gemm": none of them is fatal.
    assert match_signatures(journal(name)) == []


@pytest.mark.parametrize("name", HEALTHY)
def test_a_healthy_real_start_shows_the_progress_markers_in_launch_order(name):
    seen = [match_progress(line) for line in journal(name)]
    seen = [marker for marker in seen if marker]
    order = [marker for _pattern, marker in PROGRESS_MARKERS]
    assert seen[0] == "init_parallel_begin" and seen[-1] == "fired_up"
    firsts = [order.index(marker) for marker in dict.fromkeys(seen)]
    assert firsts == sorted(firsts), seen


def test_every_progress_marker_occurs_in_a_real_journal():
    lines = [line for name in HEALTHY for line in journal(name)]
    for pattern, marker in PROGRESS_MARKERS:
        assert any(pattern.lower() in line.lower() for line in lines), marker


def test_a_gap_between_real_markers_is_short_on_a_healthy_start():
    # Seconds between consecutive markers of the real DDTREE start (journal timestamps): the longest is
    # far below the default no_progress_timeout (120 s).
    import datetime

    stamps = []
    for line in journal("start-ddtree-graph.log"):
        if match_progress(line) and line.startswith("["):
            stamps.append(datetime.datetime.strptime(line[1:20], "%Y-%m-%d %H:%M:%S"))
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
    assert len(stamps) >= 10 and max(gaps) < 60


@pytest.mark.parametrize(
    "name, props, kind, exception_line",
    [
        ("crash-no-cutlass-none.log", KILLED, "scheduler_exception", "ModuleNotFoundError: No module named 'cutlass'"),
        (
            "crash-no-flashinfer-dflash.log",
            KILLED,
            "scheduler_exception",
            "RuntimeError: Cannot find flashinfer package. Please install flashinfer to getthe required headers for JIT compilation.",
        ),
        (
            "crash-radix-cache-none.log",
            KILLED,
            "scheduler_exception",
            "ValueError: insert value must be an int64 tensor, got Double",
        ),
        (
            "crash-plain-exception-none.log",
            KILLED,
            "scheduler_exception",
            "Exception: Capture cuda graph failed: CUDA error: out of memory",
        ),
    ],
)
def test_a_real_crash_is_named_by_its_exception_line(name, props, kind, exception_line):
    failure = diagnose(name, props)
    assert failure["state"] == "failed" and failure["kind"] == kind
    assert repr(exception_line) in failure["reason"], failure["reason"]
    assert "not an OOM" in failure["reason"]  # status=9/KILL after SGLang's own SIGQUIT


def test_a_plain_exception_was_reported_only_as_a_traceback_before():
    # The old rule (class names ending in Error/Exception/Exit/Interrupt after at least one character)
    # skipped "Exception: ..." and quoted the traceback's first line instead.
    lines = journal("crash-plain-exception-none.log")
    assert exception_summary(lines) == "Exception: Capture cuda graph failed: CUDA error: out of memory"


def test_the_scheduler_killed_while_serving_is_named_by_the_watchdog_line():
    failure = diagnose("scheduler-killed-dflash.log", KILLED)
    assert failure["kind"] == "child_crashed"
    assert "Subprocess scheduler_0 (pid=2373) crashed with exit code -9" in failure["reason"]


def test_a_launcher_killed_while_starting_is_killed_from_outside():
    # The journal just stops after "Load weight end": nothing in it is fatal; the unit's exit is the cause.
    failure = diagnose("killed-while-starting-ddtree.log", KILLED)
    assert failure["kind"] == "killed" and "status=9/KILL by something outside SGLang" in failure["reason"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Exception: boom", "Exception: boom"),
        (
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        ),
        ("triton.compiler.errors.CompilationError: at 1:0:", "triton.compiler.errors.CompilationError: at 1:0:"),
        ("AssertionError", "AssertionError"),
        ("StopIteration", "StopIteration"),
        ("KeyError: 'ddtree'", "KeyError: 'ddtree'"),
    ],
)
def test_any_exception_class_ends_a_traceback(text, expected):
    lines = [
        "[2026-11-30 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/x/scheduler.py", line 1, in run',
        "    raise X",
        "    ^^^^^^^",
        text,
    ]
    assert exception_summary(lines) == expected


def test_uvicorn_lines_and_prose_after_a_traceback_are_not_exception_lines():
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "INFO:     Started server process [1]",
        "During handling of the above exception, another exception occurred:",
        "OSError: [Errno 98] in use",
    ]
    assert exception_summary(lines) == "OSError: [Errno 98] in use"
    assert exception_summary(lines[:3]) is None


def test_every_kind_has_a_description():
    for _pattern, kind in health_journal.FATAL_SIGNATURES:
        assert kind in health_journal.KIND_DESCRIPTIONS
