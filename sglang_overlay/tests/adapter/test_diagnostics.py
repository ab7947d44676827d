"""SyncWatch: torch's sync debug mode on only during the step, the synchronizing places counted and logged.

StepTimer: the host time of the tree step's parts, averaged and logged every N steps."""

from __future__ import annotations

import logging
import warnings

import torch

from sglang_overlay import knobs
from sglang_overlay.adapter import diagnostics
from sglang_overlay.adapter.diagnostics import StepTimer, SyncWatch

SYNC = "called a synchronizing CUDA operation"  # torch's sync debug warning


def item_on_the_host():
    warnings.warn(SYNC, UserWarning, stacklevel=1)


def test_syncs_are_counted_where_they_happen_and_logged_every_n_steps(monkeypatch, caplog):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    watch = SyncWatch(every=2)
    caplog.set_level(logging.INFO, logger=diagnostics.__name__)
    for _ in range(2):
        with watch.step():
            item_on_the_host()
            item_on_the_host()
            warnings.warn("something else", UserWarning, stacklevel=1)  # not a sync: not counted
    assert modes == ["warn", "default", "warn", "default"]
    [line] = [r.getMessage() for r in caplog.records]
    # Two places (the two calls), each twice: innermost frame first, then its caller.
    assert line.startswith("DDTREE host syncs over 2 steps: 2 x test_diagnostics.py:")
    assert line.count("2 x test_diagnostics.py:") == 2 and line.count("item_on_the_host <- test_diagnostics.py:") == 2
    assert "something else" not in line
    assert watch.counts == {} and watch.steps == 0  # counted afresh after each log


def test_the_mode_is_reset_and_warnings_restored_when_the_step_raises(monkeypatch):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    shown = warnings.showwarning
    watch = SyncWatch(every=1, log=False)
    try:
        with watch.step():
            raise RuntimeError("step failed")
    except RuntimeError:
        pass
    assert modes == ["warn", "default"]
    assert warnings.showwarning is shown


def test_only_a_positive_step_count_switches_them_on(monkeypatch):
    for cls, knob in ((SyncWatch, knobs.SYNC_DEBUG), (StepTimer, knobs.STEP_TIMING)):
        for raw, on in (("", False), ("0", False), ("-3", False), ("x", False), ("50", True)):
            monkeypatch.setenv(knob.name, raw)
            watch = cls.from_env()
            assert (watch is not None) == on, (knob.name, raw)
        assert cls.from_env().every == 50


class _Ports:
    def draft_hidden(self, *a):
        return "hidden"

    def head_topk(self, *a):
        return "topk"

    def verify(self, *a):
        return "verified"

    def accept(self, *a):
        return "accepted"

    def commit(self, *a):
        return "committed"


def test_the_step_timer_passes_the_ports_through_and_logs_every_n_steps(caplog):
    caplog.set_level(logging.INFO, logger=diagnostics.__name__)
    timer = StepTimer(every=2)
    ports = timer.wrap(_Ports())
    stage = timer.wrap_stage(lambda *a: "layout")
    for bs in (3, 5):
        assert ports.draft_hidden() == "hidden" and stage() == "layout" and ports.head_topk() == "topk"
        assert ports.verify() == "verified" and ports.accept() == "accepted" and ports.commit() == "committed"
        timer.end_step(bs)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("DDTREE step timing over 2 steps (mean bs 4.0), host ms: draft_hidden ")
    for part in StepTimer.PARTS + ("step",):
        assert f"{part} " in line
    assert timer.steps == 0 and set(timer.sums.values()) == {0.0}  # counted afresh after each log


def test_the_step_timer_of_another_rank_counts_but_does_not_log(caplog):
    caplog.set_level(logging.INFO, logger=diagnostics.__name__)
    timer = StepTimer(every=1, log=False)
    ports = timer.wrap(_Ports())
    ports.draft_hidden()
    ports.commit()
    timer.end_step(1)
    assert not caplog.records
