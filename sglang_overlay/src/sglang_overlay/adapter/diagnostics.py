"""Diagnostics of the tree step for performance work, switched on by the server's environment.

Torch only (no sglang import), so the tests run them on a CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
import warnings
from typing import Optional

import torch

logger = logging.getLogger(__name__)

__all__ = ["SyncWatch"]


class SyncWatch:
    """Where the tree step makes the host wait for the GPU (``DDTREE_SYNC_DEBUG=N``: log every N steps).

    A diagnostic for performance work, as ``StepTimer``: torch's CUDA sync debug mode is on during the
    step, and every synchronizing operation it reports (``.item()``, ``.cpu()``, a blocking copy) is
    counted under the innermost frames that made it; the busiest places are logged. A step that
    synchronizes cannot overlap the scheduler's host work with the GPU, which is what DFLASH's step
    does (docs/evidence/gpu-sglang/README.md, run 5: 2.1 ms of idle GPU a step at one request).
    """

    ENV = "DDTREE_SYNC_DEBUG"
    FRAMES = 4

    def __init__(self, every: int, log: bool = True):
        self.every = every
        self.log = log  # only TP rank 0 logs
        self.counts: dict = {}
        self.steps = 0

    @classmethod
    def from_env(cls, log: bool = True) -> Optional["SyncWatch"]:
        raw = os.environ.get(cls.ENV, "")
        return cls(int(raw), log) if raw.isdigit() and int(raw) > 0 else None

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
