"""SyncWatch: torch's sync debug mode on only during the step, the synchronizing places counted and logged."""

from __future__ import annotations

import logging
import warnings

import torch

from sglang_overlay.adapter import diagnostics
from sglang_overlay.adapter.diagnostics import SyncWatch

SYNC = "called a synchronizing CUDA operation"  # torch's sync debug warning


def item_on_the_host():
    warnings.warn(SYNC, UserWarning)


def test_syncs_are_counted_where_they_happen_and_logged_every_n_steps(monkeypatch, caplog):
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    watch = SyncWatch(every=2)
    caplog.set_level(logging.INFO, logger=diagnostics.__name__)
    for _ in range(2):
        with watch.step():
            item_on_the_host()
            item_on_the_host()
            warnings.warn("something else", UserWarning)  # not a sync: not counted
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


def test_only_a_positive_step_count_switches_it_on(monkeypatch):
    for raw, on in (("", False), ("0", False), ("x", False), ("50", True)):
        monkeypatch.setenv(SyncWatch.ENV, raw)
        watch = SyncWatch.from_env()
        assert (watch is not None) == on, raw
    assert SyncWatch.from_env().every == 50
