"""Fault switches and tunables of the lab runtime, read from the environment (the unit's env file).

``LAB_RUNTIME_FAULT``: one switch, or several separated by commas:

==========================  ==========================================================================
``crash_at_start[:MSG]``    fatal while loading weights, before the port opens: "Scheduler hit an
                            exception" + traceback (``RuntimeError: MSG``), "Received sigquit from a
                            child process", then SIGKILL of itself (systemd: ``status=9/KILL``)
``crash_after:N``           the same fatal path when the scheduler takes generation request N+1 (the
                            first N succeed; health checks and the warm-up do not count)
``hang``                    after the warm-up the scheduler stops producing tokens: ``/health`` answers
                            503 after its timeout, ``/v1/models`` still 200, generation never returns
``slow:MS``                 MS milliseconds more per generated token
``degenerate[:C]``          every generated token is the character C (default ``!``)
``accept_collapse``         DDTREE's drafter proposes tokens the target does not pick (a drafter that
                            no longer fits the traffic): acceptance length falls toward 1, the output
                            stays the same (verification is lossless); DFLASH and EAGLE are unaffected,
                            so a fallback to DFLASH on the same release recovers the speed
``bad_flag``                SGLang's own parser is handed an unknown flag: argparse's "unrecognized
                            arguments", exit 2 (as a release that renders a flag SGLang lacks)
``crash_rank:R[:S]``        on a server across nodes (``--nnodes``), rank R takes the fatal path S
                            seconds (default 3) after every rank joined; its peers see it gone and
                            follow (ranks.py). Other ranks than R, and single-node servers, ignore it
==========================  ==========================================================================

A fault can also travel *inside a release*: a module ``sglang_overlay/release_fault.py`` in the
release's site dir (a module of the overlay's package, so the overlay's wheel carries it) whose
``FAULT`` string holds the same syntax. The collection's fault tests write one into a copy of the
overlay's source and build a new release from it, so the fault belongs to that release and a
rollback to the previous release removes it, exactly as a broken release in production. The overlay
itself has no such module. ``LAB_RUNTIME_FAULT`` wins over the file.

Tunables: ``LAB_RUNTIME_LOAD_SECONDS`` (simulated weight loading, default 1.5),
``LAB_RUNTIME_DRAIN_SECONDS`` (SIGTERM: how long in-flight requests may finish, default 15, as
SGLang's scheduler stop), ``LAB_RUNTIME_JOIN_SECONDS`` (how long the ranks of a server across nodes
wait for each other, default 120), ``SGLANG_HEALTH_CHECK_TIMEOUT`` (SGLang's own, default 20 s).
A malformed value is an error naming the variable (the runtime exits 1 before loading).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

ENV_FAULT = "LAB_RUNTIME_FAULT"
ENV_LOAD_SECONDS = "LAB_RUNTIME_LOAD_SECONDS"
ENV_DRAIN_SECONDS = "LAB_RUNTIME_DRAIN_SECONDS"
ENV_HEALTH_TIMEOUT = "SGLANG_HEALTH_CHECK_TIMEOUT"
ENV_JOIN_SECONDS = "LAB_RUNTIME_JOIN_SECONDS"

DEFAULT_LOAD_SECONDS = 1.5
DEFAULT_DRAIN_SECONDS = 15.0
DEFAULT_HEALTH_TIMEOUT = 20.0
DEFAULT_JOIN_SECONDS = 120.0
DEFAULT_CRASH_RANK_SECONDS = 3.0


class LabConfigError(ValueError):
    """A lab runtime variable is malformed (the message names it)."""


@dataclass(frozen=True)
class Faults:
    crash_at_start: Optional[str] = None  # the message, when set
    crash_after: Optional[int] = None
    hang: bool = False
    slow_ms: float = 0.0
    degenerate: Optional[str] = None  # the repeated character, when set
    bad_flag: bool = False
    accept_collapse: bool = False
    crash_rank: Optional[int] = None  # the rank that crashes, when set
    crash_rank_seconds: float = DEFAULT_CRASH_RANK_SECONDS

    def describe(self) -> str:
        parts = []
        if self.crash_at_start is not None:
            parts.append("crash_at_start")
        if self.crash_after is not None:
            parts.append(f"crash_after:{self.crash_after}")
        if self.hang:
            parts.append("hang")
        if self.slow_ms:
            parts.append(f"slow:{self.slow_ms:g}")
        if self.degenerate is not None:
            parts.append(f"degenerate:{self.degenerate}")
        if self.bad_flag:
            parts.append("bad_flag")
        if self.accept_collapse:
            parts.append("accept_collapse")
        if self.crash_rank is not None:
            parts.append(f"crash_rank:{self.crash_rank}:{self.crash_rank_seconds:g}")
        return ",".join(parts) or "none"


# Not ours to ship: only a faulty release built by the lab's tests has it.
RELEASE_FAULT_MODULE = "sglang_overlay.release_fault"


def release_fault() -> Optional[str]:
    """The fault a release carries (``sglang_overlay.release_fault.FAULT``), if any."""
    import importlib

    try:
        return str(getattr(importlib.import_module(RELEASE_FAULT_MODULE), "FAULT", "")).strip() or None
    except ImportError:
        return None


def parse_faults(raw: Optional[str]) -> Faults:
    values: dict = {}
    for item in (raw or "").split(","):
        item = item.strip()
        if not item or item == "none":
            continue
        name, _, arg = item.partition(":")
        name = name.strip().lower()
        try:
            if name == "crash_at_start":
                values["crash_at_start"] = (
                    arg or "lab fault crash_at_start: the scheduler failed while loading the model"
                )
            elif name == "crash_after":
                values["crash_after"] = int(arg)
                if values["crash_after"] < 0:
                    raise ValueError
            elif name == "hang":
                values["hang"] = True
            elif name == "bad_flag":
                values["bad_flag"] = True
            elif name == "accept_collapse":
                values["accept_collapse"] = True
            elif name == "crash_rank":
                rank, _, seconds = arg.partition(":")
                values["crash_rank"] = int(rank)
                if seconds:
                    values["crash_rank_seconds"] = float(seconds)
                if values["crash_rank"] < 0 or values.get("crash_rank_seconds", 0) < 0:
                    raise ValueError
            elif name == "slow":
                values["slow_ms"] = float(arg)
                if values["slow_ms"] < 0:
                    raise ValueError
            elif name == "degenerate":
                char = arg or "!"
                if len(char.encode("utf-8")) != 1:
                    raise ValueError
                values["degenerate"] = char
            else:
                raise ValueError
        except ValueError:
            raise LabConfigError(
                f"{ENV_FAULT}: bad switch {item!r}; expected crash_at_start[:MSG], crash_after:N, hang, "
                "slow:MS, degenerate[:C] (C one ASCII character), accept_collapse, bad_flag or crash_rank:R[:S], "
                "comma-separated"
            ) from None
    return Faults(**values)


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise LabConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise LabConfigError(f"{name} must be >= 0, got {raw!r}")
    return value


@dataclass(frozen=True)
class LabEnv:
    faults: Faults
    load_seconds: float
    drain_seconds: float
    health_timeout: float
    join_seconds: float = DEFAULT_JOIN_SECONDS

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "LabEnv":
        environ = os.environ if environ is None else environ
        return cls(
            faults=parse_faults(environ.get(ENV_FAULT) or release_fault()),
            load_seconds=_seconds(environ, ENV_LOAD_SECONDS, DEFAULT_LOAD_SECONDS),
            drain_seconds=_seconds(environ, ENV_DRAIN_SECONDS, DEFAULT_DRAIN_SECONDS),
            health_timeout=_seconds(environ, ENV_HEALTH_TIMEOUT, DEFAULT_HEALTH_TIMEOUT),
            join_seconds=_seconds(environ, ENV_JOIN_SECONDS, DEFAULT_JOIN_SECONDS),
        )
