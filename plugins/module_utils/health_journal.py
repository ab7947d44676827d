# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's journal rules: what the lines a starting SGLang service writes mean.

Fatal signatures (FATAL_SIGNATURES: the first kind in the list that matched names the cause),
progress markers (PROGRESS_MARKERS: each resets the no-progress deadline) and the evidence quoted
from a journal. Plain functions of journal lines; docs/health-gate.md explains each rule.
"""

from __future__ import annotations

import re

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
    # SGLang's subprocess watchdog: "Subprocess scheduler_0 (pid=2373) crashed with exit code -9.
    # Triggering SIGQUIT for cleanup..." (a scheduler SIGKILLed while serving). It names the child
    # and its exit code, which the "SIGQUIT received" after it does not.
    ("Triggering SIGQUIT for cleanup", "child_crashed"),
    ("Received sigquit", "self_kill"),  # launch phase
    ("SIGQUIT received", "self_kill"),  # running phase (tokenizer manager's handler)
    ("Traceback (most recent call last)", "traceback"),
)

# (substring, name), matched case-insensitively; each occurrence resets the no-progress deadline. In the
# order a real SGLang 0.5.23 start logs them (tests/fixtures/sglang-journals/): the
# distributed init, the weights (once per model: target, then draft), the KV cache, CUDA-graph capture (a
# large batch range can take minutes, so its begin/end lines count; "Capture target prefill CUDA graph
# begin", "Capture draft verify CUDA graph end", ...), the scheduler's summary, the HTTP server, the
# warm-up request's "fired up".
PROGRESS_MARKERS = (
    ("Init parallel begin", "init_parallel_begin"),
    ("Init parallel ends", "init_parallel_end"),
    ("Load weight begin", "load_weight_begin"),
    ("Load weight end", "load_weight_end"),
    ("KV Cache is allocated", "kv_cache_allocated"),
    ("Memory pool end", "memory_pool_end"),
    ("CUDA graph begin", "cuda_graph_begin"),
    ("CUDA graph end", "cuda_graph_end"),
    ("max_total_num_tokens=", "scheduler_ready"),
    ("Engine startup timings", "engine_started"),
    ("Application startup complete", "application_started"),
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
    "child_crashed": "an SGLang subprocess died (exit code -9 is SIGKILL: the kernel OOM killer or an operator)",
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


def clip_line(line: str, limit: int = LINE_LIMIT) -> str:
    return line if len(line) <= limit else line[:limit] + "..."


def split_journal_output(stdout: str) -> tuple:
    """journalctl -o cat --show-cursor output -> (lines, cursor or None).

    Drops journalctl's own '-- ... --' notices (no entries, reboots) and the cursor line.
    """
    lines, cursor = [], None
    for line in stdout.splitlines():
        if line.startswith("-- cursor: "):
            cursor = line[len("-- cursor: ") :].strip()
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
                found.append({"index": index, "pattern": pattern, "kind": kind, "line": clip_line(lines[index])})
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
        context = [clip_line(line) for line in lines[max(0, index - before) : index + after + 1]]
        evidence.append(dict(match, context=context))
    return evidence


_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*")  # SGLang's "[2026-11-30 10:00:01 TP0] "
# The line that ends a Python traceback: the exception's (dotted) class name, then ": message" or nothing.
# Any class name: SGLang raises plain `Exception("Capture cuda graph failed: ...")`, torch raises
# `torch.AcceleratorError`, Triton `triton.compiler.errors.CompilationError`, and a bare `raise
# SomeError` prints the name alone. Uvicorn's "INFO:     ..." lines (log levels) are not exceptions.
_EXCEPTION_LINE = re.compile(
    r"^(?!(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|TRACE):)(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::(?:\s.*)?)?$"
)


def exception_summary(lines: list, start: int = 0) -> str | None:
    """The exception line ('SomeError: message') that ends the first traceback at or after line `start`:
    it names what went wrong (in a chained traceback, the original cause, which comes first).

    A traceback's frames and source lines are indented; the first line after "Traceback (most recent call
    last):" that is not indented and reads as an exception class name (optionally followed by ": ...") is
    its exception line, whatever the class is called. Lines of prose ("During handling of the above
    exception, ...") are not class names and are passed over.
    """
    in_traceback = False
    for line in lines[start:]:
        text = _LOG_PREFIX.sub("", line)
        if "Traceback (most recent call last)" in text:
            in_traceback = True
        elif in_traceback and text.strip() and not text[:1].isspace() and _EXCEPTION_LINE.match(text.strip()):
            return clip_line(text.strip())
    return None
