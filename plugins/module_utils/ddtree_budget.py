# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""DDTREE's budget as a service declares it: one number of tree nodes, or a schedule by batch size.

The overlay parses the same value from ``--speculative-ddtree-budget`` (``sglang_overlay.adapter.settings``:
``parse_budget``, ``MAX_BUDGET``); this module validates it before anything changes on a host and renders
the flag. ``tests/unit/plugins/module_utils/test_ddtree_budget.py`` holds the two to the same answers.

A schedule maps the largest batch size of each range to its budget: ``{1: 127, 4: 63, 16: 15, 48: 7}`` (or
the flag's ``"1:127,4:63,16:15,48:7"``) verifies 128 tokens a request for one request, 64 for two to four,
16 for five to sixteen, and 8 above.
"""

from __future__ import annotations

#: The widest tree (the overlay's tree kernel keeps up to 512 frontier entries in registers).
MAX_BUDGET = 511


def _positive(value, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError("%s is %r; it must be an integer" % (what, value))
    try:
        number = int(str(value).strip(), 10) if not isinstance(value, int) else value
    except ValueError:
        raise ValueError("%s is %r; it must be an integer" % (what, value)) from None
    if number < 1:
        raise ValueError("%s is %r; it must be >= 1" % (what, value))
    return number


def parse_budget(value):
    """An int in 1..MAX_BUDGET, or a schedule as ``((max_batch_size, budget), ...)`` sorted by batch size.

    Takes an int, a mapping of batch size to budget, or the flag's text (``"63"``, ``"1:63,16:15"``).
    Raises ValueError saying what is wrong, with the value.
    """
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, str) and ":" in value:
        pairs = []
        for item in value.split(","):
            size, sep, budget = item.partition(":")
            if not sep:
                raise ValueError("schedule entry %r is not BATCH_SIZE:BUDGET (e.g. '1:63,16:15')" % item.strip())
            pairs.append((size, budget))
    else:
        budget = _positive(value, "the budget")
        if budget > MAX_BUDGET:
            raise ValueError("the budget is %r; at most %d" % (value, MAX_BUDGET))
        return budget
    if not pairs:
        raise ValueError("the schedule %r is empty" % (value,))
    schedule = {}
    for size, budget in pairs:
        size = _positive(size, "a schedule's batch size")
        if size in schedule:
            raise ValueError("batch size %d appears twice in the schedule %r" % (size, value))
        budget = _positive(budget, "the budget for batch size %d" % size)
        if budget > MAX_BUDGET:
            raise ValueError("the budget for batch size %d is %d; at most %d" % (size, budget, MAX_BUDGET))
        schedule[size] = budget
    return tuple(sorted(schedule.items()))


def budget_problem(value) -> str | None:
    """What is wrong with a declared budget (an int, a schedule mapping or the flag's schedule text), or None.
    A number in quotes is refused: it reads as a schedule's text to some and as a typo to others."""
    if isinstance(value, str) and ":" not in value:
        return (
            "%r is a string; write the number without quotes (budget: %s) or a schedule by batch size such as "
            "{1: 63, 16: 15}" % (value, value.strip())
        )
    try:
        parse_budget(value)
    except ValueError as err:
        return (
            "%s; DDTREE takes a number of tree nodes (1-%d) or a schedule by batch size such as {1: 63, 16: 15, 48: 7}"
            % (
                err,
                MAX_BUDGET,
            )
        )
    return None


def format_budget(value) -> str:
    """The flag's text of a budget or schedule (``"63"``, ``"1:63,16:15"``)."""
    parsed = parse_budget(value)
    if isinstance(parsed, int):
        return str(parsed)
    return ",".join("%d:%d" % pair for pair in parsed)


def schedule_from_levels(budgets: dict) -> str | int:
    """The budget for a service from the budget chosen at each concurrency level.

    One budget when every level chose the same; else the schedule whose ranges end at each level
    (the last level's budget also serves loads above it).
    """
    distinct = set(budgets.values())
    if len(distinct) == 1:
        return distinct.pop()
    return format_budget({int(level): int(budget) for level, budget in budgets.items()})
