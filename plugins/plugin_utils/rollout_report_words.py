# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout report's words for what it shows in several places (releases, gains, tunings, shadows): one
wording for the report's data (rollout_report) and its Markdown and terminal text (rollout_report_render)."""

from __future__ import annotations


def _short(release):
    return release[:12] if release else release


# How a service's release was chosen, for the table, where it is not the default (the candidate: a
# rolled-back service runs an older release than the candidate it followed, so it is not marked).
CHOICE_WORDS = {
    "pin": "pinned",
    "base": "base, no overlay",
    "shadow": "after its shadow",
    "promoted": "promoted by its shadow",
    "held": "held by its shadow",
}


def _choice_word(service):
    choice = service.get("release_choice") or {}
    return CHOICE_WORDS.get(choice.get("follows"))


def _percent(gain):
    return None if gain is None else "%+.1f%%" % (100.0 * gain)


def _setting_label(item):
    if str(item.get("algorithm")).upper() == "DDTREE":
        return "DDTREE b%s k%s" % (item.get("budget"), item.get("top_k"))
    return str(item.get("algorithm"))


def tuning_text(tuning):
    """'tuned: DDTREE budget 8 top_k 4, +12.0% over DFLASH', 'fell back to DFLASH: <why>', 'tuning unchanged
    (...)' or 'would tune (release_id changed)'."""
    if tuning["state"] in ("would tune", "needs tuning"):
        return "%s (%s changed)" % (tuning["state"], ", ".join(tuning["key_changes"]) or "nothing")
    if tuning["algorithm"] == "DDTREE":
        gains = tuning["gain_over_dflash"]
        over = ", ".join("%s at concurrency %s" % (_percent(gain), concurrency) for concurrency, gain in gains.items())
        if len(gains) == 1:
            over = _percent(next(iter(gains.values())))
        text = "DDTREE budget %s top_k %s, %s over DFLASH" % (tuning["budget"], tuning["top_k"], over)
    else:
        text = "DFLASH: %s" % (tuning["reason"] or "no DDTREE setting was fast enough")
    if tuning["state"] == "tuned":
        return ("tuned: " if tuning["algorithm"] == "DDTREE" else "fell back to ") + text
    return "tuning unchanged (%s)" % text


def shadow_numbers(comparison):
    """'tokens/s S vs P, acceptance S vs P' of a shadow's comparison (shadow first)."""
    shadow, production = comparison.get("shadow") or {}, comparison.get("production") or {}
    return "tokens/s %s vs %s, acceptance %s vs %s" % (
        _number(shadow.get("tokens_per_second")),
        _number(production.get("tokens_per_second")),
        _number(shadow.get("accept_length"), digits=2),
        _number(production.get("accept_length"), digits=2),
    )


def _number(value, unit="", digits=1):
    if value is None:
        return None
    return ("%." + str(digits) + "f%s") % (value, unit)


# The rollback's task that points current back at previous (roles/sglang_service/tasks/rollback.yml).
ROLLBACK_LINK_TASK = "Point current back at the previous release"
