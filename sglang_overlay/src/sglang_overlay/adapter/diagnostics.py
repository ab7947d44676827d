"""Diagnostics of the tree step for performance work, switched on by the server's environment.

Torch only (no sglang import), so the tests run them on a CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import traceback
import warnings
from typing import Optional

import torch

from .. import knobs

logger = logging.getLogger(__name__)

__all__ = ["StepTimer", "SyncWatch"]


class SyncWatch:
    """Where the tree step makes the host wait for the GPU (``knobs.SYNC_DEBUG`` = N > 0: log every N steps).

    A diagnostic for performance work, as ``StepTimer``: torch's CUDA sync debug mode is on during the
    step, and every synchronizing operation it reports (``.item()``, ``.cpu()``, a blocking copy) is
    counted under the innermost frames that made it; the busiest places are logged. A step that
    synchronizes cannot overlap the scheduler's host work with the GPU, as DFLASH's step does
    (docs/decisions.md, "Diagnostics for the host side of the step").
    """

    FRAMES = 4

    def __init__(self, every: int, log: bool = True):
        self.every = every
        self.log = log  # only TP rank 0 logs
        self.counts: dict = {}
        self.steps = 0

    @classmethod
    def from_env(cls, log: bool = True) -> Optional["SyncWatch"]:
        every = knobs.SYNC_DEBUG.get()
        return cls(every, log) if every > 0 else None

    def _record(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = traceback.extract_stack()[:-1]
        # Innermost first, skipping the warnings machinery's own frames.
        frames = [f for f in reversed(frames) if "warnings" not in os.path.basename(f.filename)][: self.FRAMES]
        where = " <- ".join("%s:%d %s" % (os.path.basename(f.filename), f.lineno, f.name) for f in frames)
        self.counts[where] = self.counts.get(where, 0) + 1

    @contextlib.contextmanager
    def step(self):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = self._record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode("default")
        self.steps += 1
        if self.steps % self.every == 0:
            busiest = sorted(self.counts.items(), key=lambda kv: -kv[1])[:12]
            if self.log:
                logger.info(
                    "DDTREE host syncs over %d steps: %s",
                    self.steps,
                    "; ".join("%d x %s" % (n, where) for where, n in busiest) or "none",
                )
            self.counts, self.steps = {}, 0


class StepTimer:
    """Host time of the tree step's parts (``knobs.STEP_TIMING`` = N > 0: log the means every N steps).

    A diagnostic for performance work: wall-clock seconds on the host between the parts' entry and
    exit, no device synchronisation, so a part that waits for the GPU shows up as a long one.
    """

    PARTS = ("draft_hidden", "stage", "mask+verify", "accept", "post", "commit")

    def __init__(self, every: int, log: bool = True):
        self.every = every
        self.log = log  # only TP rank 0 logs
        self.sums = {p: 0.0 for p in self.PARTS + ("step",)}
        self.steps = 0
        self.rows = 0
        self._t0 = None
        self._last = None

    @classmethod
    def from_env(cls, log: bool = True) -> Optional["StepTimer"]:
        every = knobs.STEP_TIMING.get()
        return cls(every, log) if every > 0 else None

    def _mark(self, part: str) -> None:
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        elif part:
            self.sums[part] += now - self._last
        self._last = now

    def wrap(self, ports):
        timer = self

        class _Timed:
            def draft_hidden(self, *a):
                timer._t0 = None
                timer._mark("")
                out = ports.draft_hidden(*a)
                timer._mark("draft_hidden")
                return out

            def head_topk(self, *a):
                return ports.head_topk(*a)

            def verify(self, *a):
                out = ports.verify(*a)
                timer._mark("mask+verify")
                return out

            def accept(self, *a):
                out = ports.accept(*a)
                timer._mark("accept")
                return out

            def commit(self, *a):
                timer._mark("post")
                out = ports.commit(*a)
                timer._mark("commit")
                return out

        return _Timed()

    def wrap_stage(self, stage):
        def timed(*a):
            out = stage(*a)
            self._mark("stage")
            return out

        return timed

    def end_step(self, bs: int) -> None:
        self.sums["step"] += time.perf_counter() - self._t0
        self.steps += 1
        self.rows += bs
        if self.steps % self.every == 0:
            if self.log:
                logger.info(
                    "DDTREE step timing over %d steps (mean bs %.1f), host ms: %s",
                    self.steps,
                    self.rows / self.steps,
                    ", ".join("%s %.3f" % (p, 1e3 * v / self.steps) for p, v in self.sums.items()),
                )
            self.sums = {p: 0.0 for p in self.sums}
            self.steps = self.rows = 0
