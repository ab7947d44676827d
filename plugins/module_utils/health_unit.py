# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's start watch: whether a (re)started SGLang unit is alive, and why it died.

systemd's unit properties (classify_unit), the kernel's OOM lines (kernel_oom_lines), the cause of a
failed start (diagnose_failure: a host OOM, a rejected flag, the journal's signature, what the unit
says), and StartWatch, the state machine that follows a start until the port answers. No I/O and no
clock: the gate (health_gate.py) feeds them what systemctl and journalctl said, and the time.
"""

from __future__ import annotations

import re
import signal

from ansible_collections.ddtree.sglang.plugins.module_utils.health_journal import (
    FATAL_SIGNATURES,
    KIND_DESCRIPTIONS,
    clip_line,
    exception_summary,
    match_progress,
    match_signatures,
    signature_evidence,
)

UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "ExecMainStatus",
    "ExecMainCode",
    "ExecMainPID",
    "MainPID",
    "ActiveEnterTimestampMonotonic",
    "InactiveExitTimestamp",
)

# ExecMainCode is a CLD_* code from waitid(2).
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3


def parse_systemctl_show(text: str) -> dict:
    """`systemctl show -p A,B,...` output ('Key=Value' lines) -> {Key: Value}."""
    props = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def _int(value, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def signal_name(number: int) -> str:
    """9 -> 'KILL' (systemd's spelling in 'status=9/KILL')."""
    try:
        return signal.Signals(number).name[3:]
    except ValueError:
        return str(number)


def main_exit(props: dict) -> dict | None:
    """How the last main process ended: {"code": exited|killed|dumped, "status": int, "text": "status=9/KILL"}."""
    code = _int(props.get("ExecMainCode"))
    status = _int(props.get("ExecMainStatus"))
    if code == _CLD_EXITED:
        return {"code": "exited", "status": status, "text": "status=%d" % status}
    if code in (_CLD_KILLED, _CLD_DUMPED):
        text = "status=%d/%s" % (status, signal_name(status))
        if code == _CLD_DUMPED:
            text += " (core dumped)"
        return {"code": "killed" if code == _CLD_KILLED else "dumped", "status": status, "text": text}
    return None


def _death(result: str, exit_info: dict | None, exit_text: str) -> tuple | None:
    """(kind, reason) of a unit's death, read from its Result and its main process's exit status; None when
    neither says."""
    if result == "oom-kill":
        return "oom", "the kernel OOM killer killed it (Result=oom-kill, %s)" % exit_text
    if result == "start-limit-hit":
        return "crash_loop", "systemd gave up restarting it (Result=start-limit-hit)"
    if result == "timeout":
        return "timeout", "systemd timed out (Result=timeout, %s)" % exit_text
    if exit_info and exit_info["code"] == "exited" and exit_info["status"] == 2:
        return "bad_flag", "it exited with status=2, a rejected launch flag (Result=%s)" % result
    if exit_info and exit_info["code"] in ("killed", "dumped"):
        return "killed", "it was killed by a signal (Result=%s, %s)" % (result, exit_text)
    if exit_info and exit_info["code"] == "exited":
        return "exited", "it exited (Result=%s, %s)" % (result, exit_text)
    return None


def _restart_reason(sub: str, state: str, restarts: int, exit_text: str, result: str) -> str:
    if sub == "auto-restart":
        reason = "it died and systemd is about to restart it (%s, NRestarts=%d, last exit %s)" % (
            state,
            restarts,
            exit_text,
        )
    else:
        reason = "it crashed and systemd restarted it (NRestarts=%d, %s, last exit %s)" % (restarts, state, exit_text)
    if result == "oom-kill":
        reason += "; Result=oom-kill"
    return reason


def classify_unit(props: dict, restarts_at_start: int = 0) -> dict:
    """Decide from `systemctl show` properties whether a starting service is alive.

    -> {"phase": missing|starting|running|restarting|stopping|failed|exited|inactive, "alive": bool,
        "fatal": bool, "kind": str or None, "reason": str, "exit": main_exit(props)}.
    Manual (re)starts reset NRestarts, so NRestarts above restarts_at_start means systemd restarted
    the service after a crash. A server never exits by itself, so any exit is fatal.
    """
    active = props.get("ActiveState", "")
    sub = props.get("SubState", "")
    result = props.get("Result", "")
    restarts = _int(props.get("NRestarts"))
    exit_info = main_exit(props)
    exit_text = exit_info["text"] if exit_info else "no exit status"
    state = "%s/%s" % (active, sub)
    verdict = dict(phase=None, alive=False, fatal=True, kind=None, reason="", exit=exit_info, state=state)
    verdict.update(result=result, restarts=restarts)

    def fail(phase, kind, reason):
        verdict.update(phase=phase, kind=kind, reason=reason)
        return verdict

    def by_result(phase):
        """The kind of death, read from Result and the exit status."""
        death = _death(result, exit_info, exit_text)
        return fail(phase, *death) if death else None

    if props.get("LoadState") == "not-found":
        return fail("missing", "unit_missing", "the unit is not loaded (LoadState=not-found)")
    if restarts > restarts_at_start or sub == "auto-restart":
        verdict.update(
            phase="restarting", kind="restarted", reason=_restart_reason(sub, state, restarts, exit_text, result)
        )
        return verdict
    if active == "failed":
        return by_result("failed") or fail("failed", "failed", "the unit failed (Result=%s, %s)" % (result, exit_text))
    if active == "deactivating":
        return by_result("stopping") or fail("stopping", "stopping", "the unit is stopping (%s)" % state)
    if active == "inactive":
        if exit_info:
            return by_result("exited") or fail("exited", "exited", "it exited (%s)" % exit_text)
        return fail("inactive", "inactive", "the unit is inactive; was it started? (%s)" % state)
    if active in ("active", "reloading"):
        verdict.update(
            phase="running",
            alive=True,
            fatal=False,
            reason="the unit is %s (MainPID %s)" % (state, props.get("MainPID")),
        )
        return verdict
    if active == "activating":
        verdict.update(phase="starting", alive=True, fatal=False, reason="the unit is %s" % state)
        return verdict
    return fail("failed", "failed", "unexpected unit state %s (Result=%s)" % (state, result))


_OOM_LINE = re.compile(
    r"Out of memory|oom-kill:|oom_reaper|Memory cgroup out of memory|invoked oom-killer", re.IGNORECASE
)


def kernel_oom_lines(lines: list, unit: str, pids=()) -> list:
    """Kernel log lines that say the OOM killer hit this unit (its cgroup or one of its PIDs)."""
    found = []
    pid_patterns = [re.compile(r"(?:process|pid[= ])\s*%d\b" % int(pid)) for pid in pids if _int(pid) > 0]
    for line in lines:
        if not _OOM_LINE.search(line):
            continue
        if unit in line or any(pattern.search(line) for pattern in pid_patterns):
            found.append(clip_line(line))
    return found


def diagnose_failure(unit: dict | None, matches: list, lines: list, oom_lines=()) -> dict:
    """Name the cause of a failed start from the unit verdict, the journal's signature matches and the
    kernel's OOM lines. -> {"kind", "reason", "oom": bool}.

    Order: a host OOM (Result=oom-kill or the kernel's word) beats everything; then a rejected flag; then
    the highest-priority journal signature (with the exception line when there is a traceback); then
    what the unit says. status=9/KILL after "Received sigquit" is SGLang killing its own tree: no OOM.
    """
    unit = unit or {}
    unit_kind = unit.get("kind") if unit.get("fatal") else None
    exit_info = unit.get("exit") or {}
    killed = exit_info.get("code") in ("killed", "dumped")
    kinds = [match["kind"] for match in matches]
    priority = [kind for _pattern, kind in FATAL_SIGNATURES] + ["custom"]
    unit_note = " (unit %s: %s)" % (unit.get("state"), unit.get("reason")) if unit_kind else ""

    if unit.get("result") == "oom-kill" or oom_lines:
        evidence = oom_lines[0] if oom_lines else "Result=oom-kill"
        return {"kind": "oom", "oom": True, "reason": "%s: %s%s" % (KIND_DESCRIPTIONS["oom"], evidence, unit_note)}
    if "bad_flag" in kinds:
        line = next(match["line"] for match in matches if match["kind"] == "bad_flag")
        return {
            "kind": "bad_flag",
            "oom": False,
            "reason": "%s: %r%s" % (KIND_DESCRIPTIONS["bad_flag"], line, unit_note),
        }
    if matches:
        kind = min(kinds, key=priority.index)
        first = next(match for match in matches if match["kind"] == kind)
        # The traceback at (or after) the cause's line, else the journal's first one.
        detail = exception_summary(lines, first["index"]) or exception_summary(lines) or first["line"]
        reason = "%s: %r" % (KIND_DESCRIPTIONS[kind], detail)
        if detail != first["line"]:
            reason += " (at %r)" % first["line"]
        if killed and exit_info.get("status") == signal.SIGKILL and "self_kill" in kinds:
            reason += (
                "; %s after 'Received sigquit' is SGLang killing its own process tree, not an OOM" % exit_info["text"]
            )
        return {"kind": kind, "oom": False, "reason": reason + unit_note}
    if unit_kind == "killed" and exit_info.get("status") == signal.SIGKILL:
        return {
            "kind": "killed",
            "oom": False,
            "reason": "%s: %s by something outside SGLang (no 'Received sigquit' in the journal, no OOM in the "
            "kernel log)%s" % (KIND_DESCRIPTIONS["killed"], exit_info["text"], unit_note),
        }
    if unit_kind:
        return {
            "kind": unit_kind,
            "oom": False,
            "reason": "%s: %s" % (KIND_DESCRIPTIONS.get(unit_kind, unit_kind), unit.get("reason")),
        }
    return {"kind": "failed", "oom": False, "reason": "the start failed"}


def wants_kernel_log(unit: dict | None) -> bool:
    """Whether the kernel log may tell more: the main process died by a signal, or Result says OOM."""
    if not unit:
        return False
    exit_info = unit.get("exit") or {}
    return unit.get("result") == "oom-kill" or exit_info.get("code") in ("killed", "dumped")


# ---------------------------------------------------------------------------------------------------
# The start watch: a state machine fed with (time, unit properties, new journal lines, port open?)
# ---------------------------------------------------------------------------------------------------


class StartWatch:
    """Follows a service from its (re)start until its port answers, failing fast.

    feed(now, props, new_lines, port_open) -> {"state": "starting"|"ready"|"failing"|"failed", ...}.
    - A fatal journal signature or a fatal unit state moves it to "failing"; settle_seconds later (one
      more poll, so the traceback's end and the unit's final state are in the evidence) it is "failed".
    - A progress marker resets the no-progress deadline (no_progress_timeout after the last marker, or
      after started_at); start_timeout after started_at caps the whole start.
    - The port answering (and nothing fatal) makes it "ready"; after that only fatal evidence counts.
    No I/O, no clock: times are what the caller passes (seconds, any monotonic origin).
    """

    def __init__(
        self,
        started_at: float,
        no_progress_timeout: float,
        start_timeout: float,
        settle_seconds: float = 0.0,
        extra_signatures=(),
        extra_progress_markers=(),
        restarts_at_start: int = 0,
        max_lines: int = 50000,
    ):
        self.started_at = started_at
        self.no_progress_timeout = no_progress_timeout
        self.start_timeout = start_timeout
        self.settle_seconds = settle_seconds
        self.extra_signatures = tuple(extra_signatures)
        self.extra_progress_markers = tuple(extra_progress_markers)
        self.restarts_at_start = restarts_at_start
        self.max_lines = max_lines
        self.lines = []
        self.matches = []
        self.progress = []
        self.last_progress_at = started_at
        self.port_at = None
        self.unit = None
        self.failing_since = None
        self.failure = None
        self.now = started_at

    @property
    def first_progress_at(self) -> float | None:
        return self.progress[0]["at"] if self.progress else None

    def _take_lines(self, now: float, new_lines) -> None:
        start = len(self.lines)
        room = self.max_lines - start
        self.lines.extend(list(new_lines)[: max(room, 0)])
        for index in range(start, len(self.lines)):
            name = match_progress(self.lines[index], extra=self.extra_progress_markers)
            if name:
                self.last_progress_at = now
                self.progress.append({"marker": name, "at": now, "line": clip_line(self.lines[index])})
        self.matches.extend(match_signatures(self.lines, extra=self.extra_signatures, start=start))

    def feed(self, now: float, props: dict | None, new_lines=(), port_open: bool = False) -> dict:
        self.now = now
        if self.failure:
            return self.failure
        self._take_lines(now, new_lines)
        if props is not None:
            self.unit = classify_unit(props, self.restarts_at_start)
        fatal = bool(self.matches) or bool(self.unit and self.unit["fatal"])
        if fatal:
            if self.failing_since is None:
                self.failing_since = now
            if now - self.failing_since >= self.settle_seconds:
                return self._fail(None)
            return {"state": "failing"}
        if self.port_at is not None:
            return {"state": "ready"}
        if port_open:
            self.port_at = now
            return {"state": "ready"}
        if now - self.last_progress_at >= self.no_progress_timeout:
            if self.progress:
                last = self.progress[-1]
                reason = "no progress for %.0f s since the last marker, %r (seen %.1f s into the watch)" % (
                    now - self.last_progress_at,
                    last["marker"],
                    last["at"] - self.started_at,
                )
            else:
                reason = "no progress marker in the journal within %.0f s of the watch's start" % (
                    now - self.started_at
                )
            return self._fail({"kind": "no_progress", "oom": False, "reason": self._with_unit(reason)})
        if now - self.started_at >= self.start_timeout:
            reason = (
                "the port did not open within start_timeout (%.0f s), although progress markers kept coming"
                % self.start_timeout
            )
            return self._fail({"kind": "start_timeout", "oom": False, "reason": self._with_unit(reason)})
        return {"state": "starting"}

    def _with_unit(self, reason: str) -> str:
        return reason + ("; %s" % self.unit["reason"] if self.unit else "")

    def _fail(self, diagnosis: dict | None) -> dict:
        if diagnosis is None:
            diagnosis = diagnose_failure(self.unit, self.matches, self.lines)
        self.failure = dict(diagnosis, state="failed")
        return self.failure

    def follow(self, props: dict, new_lines=()) -> dict:
        """After a failure from fatal evidence: take the unit's later state and journal lines, and diagnose
        again. SGLang kills its process tree seconds after a child's fatal line (its watchdog sleeps 5 s
        first), so the unit may only show the death, and its exit status, on a later look."""
        if self.failure and self.failure["kind"] not in ("no_progress", "start_timeout"):
            self._take_lines(self.now, new_lines)
            self.unit = classify_unit(props, self.restarts_at_start)
            self.failure = dict(diagnose_failure(self.unit, self.matches, self.lines), state="failed")
        return self.failure

    def refine(self, oom_lines) -> dict:
        """Re-diagnose a failure with the kernel's OOM lines (fetched only when wants_kernel_log)."""
        if self.failure and self.failure["kind"] not in ("no_progress", "start_timeout") and oom_lines:
            self.failure = dict(diagnose_failure(self.unit, self.matches, self.lines, oom_lines), state="failed")
        return self.failure

    def excerpt(self, tail: int = 80) -> list:
        """The journal since the start for a failure report: its last `tail` lines."""
        return [clip_line(line) for line in self.lines[-tail:]]

    def evidence(self) -> list:
        return signature_evidence(self.lines, self.matches)
