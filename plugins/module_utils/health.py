# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's rules: what a (re)started SGLang service's unit state, journal and answers mean.

Plain functions (and one small state machine, StartWatch) that take data and return data, so every
decision is unit-tested on real-looking journal lines and outputs without a GPU, a systemd or a clock.
The module ddtree.sglang.sglang_health does the I/O (systemctl, journalctl, HTTP) and feeds them.

Rules in brief (docs/health-gate.md explains each):
- fatal journal signatures (FATAL_SIGNATURES) and a dead, failed or auto-restarted unit fail the start at
  once; the unit's Result and the kernel log tell a host OOM from SGLang's own SIGKILL of its process
  tree and from a rejected flag (exit status 2);
- progress markers (PROGRESS_MARKERS) reset a no-progress deadline; an overall deadline caps the start;
- an output is degenerate when it is empty, one character repeated, made of very few distinct
  characters, or ends in a short loop covering at least half of it (degenerate_output);
- greedy outputs equal the baseline recorded for the same model (compare_output), since speculative
  decoding is lossless;
- tokens/s and acceptance length stay above floors and within max_regression of the previous release.
"""

from __future__ import annotations

import re
import signal

# ---------------------------------------------------------------------------------------------------
# Journal signatures and progress markers
# ---------------------------------------------------------------------------------------------------

# (substring, kind), matched case-insensitively. The order is the priority when several match: the
# first kind in this list that matched names the cause (a plugin that failed to load explains the
# "Unknown speculative algorithm name" after it; a CUDA OOM explains the scheduler exception around it).
FATAL_SIGNATURES = (
    ("unrecognized arguments", "bad_flag"),
    ("ambiguous option", "bad_flag"),
    ("Failed to load plugin", "plugin"),
    ("Unknown speculative algorithm name", "unknown_algorithm"),
    ("CUDA out of memory", "cuda_oom"),
    ("no kernel image is available", "arch"),
    ("undefined symbol", "abi"),
    ("Could not load any common_ops", "abi"),
    ("libtorchcodec", "torchcodec"),
    ("Scheduler hit an exception", "scheduler_exception"),
    ("Received sigquit", "self_kill"),  # launch phase
    ("SIGQUIT received", "self_kill"),  # running phase (tokenizer manager's handler)
    ("Traceback (most recent call last)", "traceback"),
)

# (substring, name), matched case-insensitively; each occurrence resets the no-progress deadline.
# Weights load once per model (target, then draft); CUDA-graph capture of a large batch range can take
# minutes, so its begin/end lines count as progress too.
PROGRESS_MARKERS = (
    ("Load weight begin", "load_weight_begin"),
    ("Load weight end", "load_weight_end"),
    ("Memory pool end", "memory_pool_end"),
    ("CUDA graph begin", "cuda_graph_begin"),
    ("CUDA graph end", "cuda_graph_end"),
    ("Uvicorn running on", "uvicorn_running"),
    ("The server is fired up and ready to roll!", "fired_up"),
)

KIND_DESCRIPTIONS = {
    "bad_flag": "a launch flag was rejected (exit status 2; restarting cannot fix it)",
    "plugin": "an SGLang plugin failed to load (is the release's overlay intact?)",
    "unknown_algorithm": "the speculative algorithm is unknown to SGLang (was the overlay plugin loaded?)",
    "cuda_oom": "CUDA out of memory on the GPU (another process holds GPU memory, or the memory fraction is too high)",
    "arch": "the GPU kernels were not built for this GPU's architecture",
    "abi": "a native library does not match the stack (torch / kernel package ABI)",
    "torchcodec": "torchcodec cannot load its FFmpeg libraries",
    "scheduler_exception": "the scheduler hit an exception",
    "self_kill": "SGLang killed its own process tree after a fatal error in a child (not an OOM)",
    "traceback": "a Python exception",
    "custom": "a configured fatal pattern",
    "oom": "the kernel OOM killer killed it (host memory)",
    "killed": "it was killed by a signal from outside SGLang",
    "exited": "the server process exited",
    "restarted": "the server crashed",
    "crash_loop": "systemd gave up restarting it (start limit hit)",
    "timeout": "systemd timed out starting or stopping it",
    "stopping": "the unit is stopping",
    "inactive": "the unit is not running",
    "unit_missing": "the unit does not exist",
    "failed": "the unit failed",
    "no_progress": "no progress marker in the journal within the no-progress deadline",
    "start_timeout": "the port did not open within the start timeout",
}

LINE_LIMIT = 500  # characters kept of one journal line in results


def _clip(line: str, limit: int = LINE_LIMIT) -> str:
    return line if len(line) <= limit else line[:limit] + "..."


def split_journal_output(stdout: str) -> tuple:
    """journalctl -o cat --show-cursor output -> (lines, cursor or None).

    Drops journalctl's own '-- ... --' notices (no entries, reboots) and the cursor line.
    """
    lines, cursor = [], None
    for line in stdout.splitlines():
        if line.startswith("-- cursor: "):
            cursor = line[len("-- cursor: "):].strip()
        elif line.startswith("-- ") and line.endswith(" --"):
            continue
        else:
            lines.append(line)
    return lines, cursor


def match_signatures(lines: list, signatures=FATAL_SIGNATURES, extra=(), start: int = 0) -> list:
    """Every line (from index start on) holding a fatal signature, in journal order.

    -> [{"index": i, "pattern": substring, "kind": kind, "line": line}], one entry per line (the
    highest-priority signature of that line). extra: more substrings, of kind "custom".
    """
    table = [(pattern.lower(), pattern, kind) for pattern, kind in signatures]
    table += [(pattern.lower(), pattern, "custom") for pattern in extra]
    found = []
    for index in range(start, len(lines)):
        lowered = lines[index].lower()
        for needle, pattern, kind in table:
            if needle in lowered:
                found.append({"index": index, "pattern": pattern, "kind": kind, "line": _clip(lines[index])})
                break
    return found


def match_progress(line: str, markers=PROGRESS_MARKERS, extra=()) -> str | None:
    """The progress marker's name a journal line carries, or None."""
    lowered = line.lower()
    for pattern, name in markers:
        if pattern.lower() in lowered:
            return name
    for pattern in extra:
        if pattern.lower() in lowered:
            return pattern
    return None


def signature_evidence(lines: list, matches: list, before: int = 3, after: int = 15, limit: int = 10) -> list:
    """The matched lines with context: up to `before` lines before and `after` after each match
    (a traceback's body and its final exception line), at most `limit` matches."""
    evidence = []
    for match in matches[:limit]:
        index = match["index"]
        context = [_clip(line) for line in lines[max(0, index - before):index + after + 1]]
        evidence.append(dict(match, context=context))
    return evidence


_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*")  # SGLang's "[2026-11-30 10:00:01 TP0] "
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")


def exception_summary(lines: list, start: int = 0) -> str | None:
    """The 'SomeError: message' line that ends the first traceback at or after line `start`: it names
    what went wrong (in a chained traceback, the original cause)."""
    in_traceback = False
    for line in lines[start:]:
        text = _LOG_PREFIX.sub("", line).strip()
        if "Traceback (most recent call last)" in text:
            in_traceback = True
        elif in_traceback and _EXCEPTION_LINE.match(text):
            return _clip(text)
    return None


# ---------------------------------------------------------------------------------------------------
# systemd unit state
# ---------------------------------------------------------------------------------------------------

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
    verdict = {"phase": None, "alive": False, "fatal": True, "kind": None, "reason": "", "exit": exit_info,
               "state": state, "result": result, "restarts": restarts}

    def fail(phase, kind, reason):
        verdict.update(phase=phase, kind=kind, reason=reason)
        return verdict

    def by_result(phase):
        """The kind of death, read from Result and the exit status."""
        if result == "oom-kill":
            return fail(phase, "oom", "the kernel OOM killer killed it (Result=oom-kill, %s)" % exit_text)
        if result == "start-limit-hit":
            return fail(phase, "crash_loop", "systemd gave up restarting it (Result=start-limit-hit)")
        if result == "timeout":
            return fail(phase, "timeout", "systemd timed out (Result=timeout, %s)" % exit_text)
        if exit_info and exit_info["code"] == "exited" and exit_info["status"] == 2:
            return fail(phase, "bad_flag", "it exited with status=2, a rejected launch flag (Result=%s)" % result)
        if exit_info and exit_info["code"] in ("killed", "dumped"):
            return fail(phase, "killed", "it was killed by a signal (Result=%s, %s)" % (result, exit_text))
        if exit_info and exit_info["code"] == "exited":
            return fail(phase, "exited", "it exited (Result=%s, %s)" % (result, exit_text))
        return None

    if props.get("LoadState") == "not-found":
        return fail("missing", "unit_missing", "the unit is not loaded (LoadState=not-found)")
    if restarts > restarts_at_start or sub == "auto-restart":
        verdict.update(phase="restarting", kind="restarted")
        if sub == "auto-restart":
            reason = "it died and systemd is about to restart it (%s, NRestarts=%d, last exit %s)" % (state, restarts, exit_text)
        else:
            reason = "it crashed and systemd restarted it (NRestarts=%d, %s, last exit %s)" % (restarts, state, exit_text)
        if result == "oom-kill":
            reason += "; Result=oom-kill"
        verdict["reason"] = reason
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
        verdict.update(phase="running", alive=True, fatal=False, reason="the unit is %s (MainPID %s)" % (state, props.get("MainPID")))
        return verdict
    if active == "activating":
        verdict.update(phase="starting", alive=True, fatal=False, reason="the unit is %s" % state)
        return verdict
    return fail("failed", "failed", "unexpected unit state %s (Result=%s)" % (state, result))


_OOM_LINE = re.compile(r"Out of memory|oom-kill:|oom_reaper|Memory cgroup out of memory|invoked oom-killer", re.IGNORECASE)


def kernel_oom_lines(lines: list, unit: str, pids=()) -> list:
    """Kernel log lines that say the OOM killer hit this unit (its cgroup or one of its PIDs)."""
    found = []
    pid_patterns = [re.compile(r"(?:process|pid[= ])\s*%d\b" % int(pid)) for pid in pids if _int(pid) > 0]
    for line in lines:
        if not _OOM_LINE.search(line):
            continue
        if unit in line or any(pattern.search(line) for pattern in pid_patterns):
            found.append(_clip(line))
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
        return {"kind": "bad_flag", "oom": False, "reason": "%s: %r%s" % (KIND_DESCRIPTIONS["bad_flag"], line, unit_note)}
    if matches:
        kind = min(kinds, key=priority.index)
        first = next(match for match in matches if match["kind"] == kind)
        # The traceback at (or after) the cause's line, else the journal's first one.
        detail = exception_summary(lines, first["index"]) or exception_summary(lines) or first["line"]
        reason = "%s: %r" % (KIND_DESCRIPTIONS[kind], detail)
        if detail != first["line"]:
            reason += " (at %r)" % first["line"]
        if killed and exit_info.get("status") == signal.SIGKILL and "self_kill" in kinds:
            reason += "; %s after 'Received sigquit' is SGLang killing its own process tree, not an OOM" % exit_info["text"]
        return {"kind": kind, "oom": False, "reason": reason + unit_note}
    if unit_kind == "killed" and exit_info.get("status") == signal.SIGKILL:
        return {"kind": "killed", "oom": False,
                "reason": "%s: %s by something outside SGLang (no 'Received sigquit' in the journal, no OOM in the "
                          "kernel log)%s" % (KIND_DESCRIPTIONS["killed"], exit_info["text"], unit_note)}
    if unit_kind:
        return {"kind": unit_kind, "oom": False, "reason": "%s: %s" % (KIND_DESCRIPTIONS.get(unit_kind, unit_kind), unit.get("reason"))}
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

    def __init__(self, started_at: float, no_progress_timeout: float, start_timeout: float,
                 settle_seconds: float = 0.0, extra_signatures=(), extra_progress_markers=(),
                 restarts_at_start: int = 0, max_lines: int = 50000):
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
        self.lines.extend(list(new_lines)[:max(room, 0)])
        for index in range(start, len(self.lines)):
            name = match_progress(self.lines[index], extra=self.extra_progress_markers)
            if name:
                self.last_progress_at = now
                self.progress.append({"marker": name, "at": now, "line": _clip(self.lines[index])})
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
                    now - self.last_progress_at, last["marker"], last["at"] - self.started_at)
            else:
                reason = "no progress marker in the journal within %.0f s of the watch's start" % (now - self.started_at)
            return self._fail({"kind": "no_progress", "oom": False, "reason": self._with_unit(reason)})
        if now - self.started_at >= self.start_timeout:
            reason = "the port did not open within start_timeout (%.0f s), although progress markers kept coming" % self.start_timeout
            return self._fail({"kind": "start_timeout", "oom": False, "reason": self._with_unit(reason)})
        return {"state": "starting"}

    def _with_unit(self, reason: str) -> str:
        return reason + ("; %s" % self.unit["reason"] if self.unit else "")

    def _fail(self, diagnosis: dict | None) -> dict:
        if diagnosis is None:
            diagnosis = diagnose_failure(self.unit, self.matches, self.lines)
        self.failure = dict(diagnosis, state="failed")
        return self.failure

    def refine(self, oom_lines) -> dict:
        """Re-diagnose a failure with the kernel's OOM lines (fetched only when wants_kernel_log)."""
        if self.failure and self.failure["kind"] not in ("no_progress", "start_timeout") and oom_lines:
            self.failure = dict(diagnose_failure(self.unit, self.matches, self.lines, oom_lines), state="failed")
        return self.failure

    def excerpt(self, tail: int = 80) -> list:
        """The journal since the start for a failure report: its last `tail` lines."""
        return [_clip(line) for line in self.lines[-tail:]]

    def evidence(self) -> list:
        return signature_evidence(self.lines, self.matches)


# ---------------------------------------------------------------------------------------------------
# Output quality
# ---------------------------------------------------------------------------------------------------

# The degenerate-output rule's thresholds (docs/health-gate.md).
REPEAT_MIN_CHARS = 4  # "!!!!" and longer runs of one character
FEW_DISTINCT_MIN_CHARS = 16  # texts this long (without whitespace) ...
FEW_DISTINCT_MAX = 3  # ... made of this few distinct characters
LOOP_MAX_PERIOD = 32  # loops of up to this many characters ...
LOOP_MIN_REPEATS = 4  # ... repeated this often ...
LOOP_MIN_CHARS = 16  # ... covering at least this many characters ...
LOOP_MIN_SHARE = 0.5  # ... and this share of the text


def periodic_suffix(text: str, period: int) -> int:
    """Length of the longest suffix of text that repeats with this period (>= period when text is long enough)."""
    n = len(text)
    if period <= 0 or period > n:
        return 0
    j = n - 1
    while j >= period and text[j] == text[j - period]:
        j -= 1
    return n - (j + 1 - period)


def degenerate_output(text: str | None) -> dict:
    """Whether a generated text is degenerate. -> {"degenerate": bool, "rule": str or None, "reason": str}.

    Rules, in order (whitespace is ignored for the first three, collapsed to one space for the loop):
    1. empty: nothing but whitespace;
    2. one_char: one character repeated, at least REPEAT_MIN_CHARS times ("!!!!!!!!", the incident);
    3. few_distinct: at least FEW_DISTINCT_MIN_CHARS characters drawn from at most FEW_DISTINCT_MAX
       distinct ones ("1, 1, 1, 1, 1, 1, 1, 1");
    4. loop: the text ends in a unit of 1..LOOP_MAX_PERIOD characters repeated at least LOOP_MIN_REPEATS
       times, covering at least LOOP_MIN_CHARS characters and LOOP_MIN_SHARE of the text ("the the the ...").
    Real answers in any script pass: distinct characters grow with length, and real text is not periodic.
    """
    text = text or ""
    compact = "".join(text.split())
    if not compact:
        return {"degenerate": True, "rule": "empty", "reason": "the output is empty (%d characters of whitespace)" % len(text)}
    distinct = set(compact)
    if len(distinct) == 1 and len(compact) >= REPEAT_MIN_CHARS:
        return {"degenerate": True, "rule": "one_char",
                "reason": "the output is one character repeated: %r x %d" % (compact[0], len(compact))}
    if len(compact) >= FEW_DISTINCT_MIN_CHARS and len(distinct) <= FEW_DISTINCT_MAX:
        return {"degenerate": True, "rule": "few_distinct",
                "reason": "the output has only %d distinct characters (%s) in %d" % (
                    len(distinct), "".join(sorted(distinct)), len(compact))}
    collapsed = " ".join(text.split())
    for period in range(1, min(LOOP_MAX_PERIOD, len(collapsed) // LOOP_MIN_REPEATS) + 1):
        covered = periodic_suffix(collapsed, period)
        if (covered >= LOOP_MIN_REPEATS * period and covered >= LOOP_MIN_CHARS
                and covered >= LOOP_MIN_SHARE * len(collapsed)):
            unit = collapsed[-period:]
            return {"degenerate": True, "rule": "loop",
                    "reason": "the output ends in a loop: %r repeated %.1f times (%d of %d characters)" % (
                        unit, covered / float(period), covered, len(collapsed))}
    return {"degenerate": False, "rule": None, "reason": "not degenerate"}


def compare_output(expected: str, actual: str, tolerance: float = 0.0) -> dict:
    """Compare a greedy output with its baseline.

    tolerance 0: equal, character for character. Otherwise the two may differ only in their last
    floor(tolerance * len(expected)) characters (measured on the longer of the two), i.e. their common
    prefix must cover all but that many characters.
    -> {"match", "common_prefix", "differing_chars", "allowed_chars", "expected_excerpt", "actual_excerpt"}.
    """
    expected, actual = expected or "", actual or ""
    prefix = 0
    for a, b in zip(expected, actual):
        if a != b:
            break
        prefix += 1
    differing = max(len(expected), len(actual)) - prefix
    allowed = int(tolerance * len(expected))
    result = {"match": differing <= allowed, "common_prefix": prefix, "differing_chars": differing,
              "allowed_chars": allowed}
    if differing:
        start = max(0, prefix - 20)
        result["expected_excerpt"] = expected[start:prefix + 60]
        result["actual_excerpt"] = actual[start:prefix + 60]
    return result


# ---------------------------------------------------------------------------------------------------
# Baseline and metrics files (JSON documents on the host)
# ---------------------------------------------------------------------------------------------------

FILE_FORMAT = 1


def baseline_lookup(document: dict | None, model: str, prompt: str, max_tokens: int) -> dict | None:
    """The baseline entry for (model, max_tokens, prompt), or None.

    Document: {"format": 1, "baselines": {model: {str(max_tokens): {prompt: {"text": ..., ...}}}}}.
    """
    return (((document or {}).get("baselines") or {}).get(model) or {}).get(str(max_tokens), {}).get(prompt)


def baseline_add(document: dict | None, model: str, prompt: str, max_tokens: int, entry: dict) -> dict:
    """A copy of the document with this entry set."""
    document = {"format": FILE_FORMAT, "baselines": dict((document or {}).get("baselines") or {})}
    per_model = dict(document["baselines"].get(model) or {})
    per_length = dict(per_model.get(str(max_tokens)) or {})
    per_length[prompt] = entry
    per_model[str(max_tokens)] = per_length
    document["baselines"][model] = per_model
    return document


def tokens_per_second(generations: list) -> float | None:
    """sum(completion_tokens) / sum(seconds) over generations [{"completion_tokens", "seconds"}]."""
    tokens = sum(g.get("completion_tokens") or 0 for g in generations)
    seconds = sum(g.get("seconds") or 0.0 for g in generations)
    if not generations or seconds <= 0:
        return None
    return round(tokens / seconds, 3)


def previous_metrics(document: dict | None, model: str) -> dict | None:
    """The last recorded metrics for this model in a metrics document {"format": 1, "records": [...]}."""
    for record in reversed((document or {}).get("records") or []):
        if record.get("model") == model:
            return record
    return None


def metrics_add(document: dict | None, record: dict, keep: int = 50) -> dict:
    """A copy of the metrics document with record appended (the last `keep` records kept)."""
    records = list((document or {}).get("records") or []) + [record]
    return {"format": FILE_FORMAT, "records": records[-keep:]}


def _number(value) -> float | None:
    """A number from JSON or Ansible (where "3.4" may arrive as a string); None when absent or not a number."""
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


METRIC_LABELS = {"tokens_per_second": "tokens/s", "accept_length": "acceptance length"}


def compare_metrics(current: dict, floors: dict | None = None, previous: dict | None = None,
                    max_regression: float = 0.5) -> list:
    """Problems with the measured numbers; [] when they pass.

    current/previous: {"tokens_per_second": float or None, "accept_length": float or None}.
    floors: {"tokens_per_second": float or None, "accept_length": float or None}: each set floor must be
    met (an acceptance-length floor with no acceptance length reported is a problem: speculative
    decoding is off). previous: each number present on both sides must be at least
    (1 - max_regression) x the previous one.
    """
    problems = []
    for key, label in METRIC_LABELS.items():
        value = _number(current.get(key))
        floor = _number((floors or {}).get(key))
        if floor is not None:
            if value is None:
                problems.append("no %s was measured, but the floor is %g%s" % (
                    label, floor, " (is speculative decoding on?)" if key == "accept_length" else ""))
            elif value < floor:
                problems.append("%s %.3g is below the floor %g" % (label, value, floor))
        before = _number((previous or {}).get(key))
        if value is not None and before:
            least = (1.0 - max_regression) * before
            if value < least:
                problems.append("%s %.3g is %.0f%% below the previous release's %.3g (max_regression %g allows down to %.3g)" % (
                    label, value, 100.0 * (1.0 - value / before), before, max_regression, least))
    return problems


def redact(text, secret: str | None):
    """text with every occurrence of secret replaced (for anything a server echoes back)."""
    if not secret or not isinstance(text, str):
        return text
    return text.replace(secret, "********")
