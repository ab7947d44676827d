# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's output rules: what an SGLang service's answers and numbers mean.

An output is degenerate when it is empty, one character repeated, made of very few distinct
characters, or ends in a short loop (degenerate_output); greedy outputs equal their baseline, since
speculative decoding is lossless (compare_output); tokens/s and acceptance length stay above floors
and within max_regression of the previous release (compare_metrics). docs/health-gate.md explains each.
"""

from __future__ import annotations

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
        return {
            "degenerate": True,
            "rule": "empty",
            "reason": "the output is empty (%d characters of whitespace)" % len(text),
        }
    distinct = set(compact)
    if len(distinct) == 1 and len(compact) >= REPEAT_MIN_CHARS:
        return {
            "degenerate": True,
            "rule": "one_char",
            "reason": "the output is one character repeated: %r x %d" % (compact[0], len(compact)),
        }
    if len(compact) >= FEW_DISTINCT_MIN_CHARS and len(distinct) <= FEW_DISTINCT_MAX:
        return {
            "degenerate": True,
            "rule": "few_distinct",
            "reason": "the output has only %d distinct characters (%s) in %d"
            % (len(distinct), "".join(sorted(distinct)), len(compact)),
        }
    collapsed = " ".join(text.split())
    for period in range(1, min(LOOP_MAX_PERIOD, len(collapsed) // LOOP_MIN_REPEATS) + 1):
        covered = periodic_suffix(collapsed, period)
        if (
            covered >= LOOP_MIN_REPEATS * period
            and covered >= LOOP_MIN_CHARS
            and covered >= LOOP_MIN_SHARE * len(collapsed)
        ):
            unit = collapsed[-period:]
            return {
                "degenerate": True,
                "rule": "loop",
                "reason": "the output ends in a loop: %r repeated %.1f times (%d of %d characters)"
                % (unit, covered / float(period), covered, len(collapsed)),
            }
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
    result = {
        "match": differing <= allowed,
        "common_prefix": prefix,
        "differing_chars": differing,
        "allowed_chars": allowed,
    }
    if differing:
        start = max(0, prefix - 20)
        result["expected_excerpt"] = expected[start : prefix + 60]
        result["actual_excerpt"] = actual[start : prefix + 60]
    return result


def tokens_per_second(generations: list) -> float | None:
    """sum(completion_tokens) / sum(seconds) over generations [{"completion_tokens", "seconds"}]."""
    tokens = sum(g.get("completion_tokens") or 0 for g in generations)
    seconds = sum(g.get("seconds") or 0.0 for g in generations)
    if not generations or seconds <= 0:
        return None
    return round(tokens / seconds, 3)


def _number(value) -> float | None:
    """A number from JSON or Ansible (where "3.4" may arrive as a string); None when absent or not a number."""
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


METRIC_LABELS = {"tokens_per_second": "tokens/s", "accept_length": "acceptance length"}


def compare_metrics(
    current: dict, floors: dict | None = None, previous: dict | None = None, max_regression: float = 0.5
) -> list:
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
                problems.append(
                    "no %s was measured, but the floor is %g%s"
                    % (label, floor, " (is speculative decoding on?)" if key == "accept_length" else "")
                )
            elif value < floor:
                problems.append("%s %.3g is below the floor %g" % (label, value, floor))
        before = _number((previous or {}).get(key))
        if value is not None and before:
            least = (1.0 - max_regression) * before
            if value < least:
                problems.append(
                    "%s %.3g is %.0f%% below the previous release's %.3g (max_regression %g allows down to %.3g)"
                    % (label, value, 100.0 * (1.0 - value / before), before, max_regression, least)
                )
    return problems


def redact(text, secret: str | None):
    """text with every occurrence of secret replaced (for anything a server echoes back)."""
    if not secret or not isinstance(text, str):
        return text
    return text.replace(secret, "********")
