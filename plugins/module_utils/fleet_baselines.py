# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet's greedy baselines: the reference for a host that has none of its own yet.

A host's baseline file (health_records) holds what its own first passing release said. A blank host
(new, re-imaged, or a service it never ran) has none, so without a reference its first release would be
recorded, not compared, and a lossy first release would become the baseline. The fleet's baselines
close that gap: a document of the same format (health_records), kept on the controller (the role's
sglang_service_fleet_baselines_file), with the entries every host recorded under each baseline key
(model, decoding family, tensor parallelism, SGLang version) - the first host to record an entry wins,
later ones compare with it. docs/health-gate.md ("The fleet's baselines") says why this and not a
DFLASH start per host.

Each fleet entry keeps where it came from: {"text", "completion_tokens", "recorded_at", "release_id",
"host"}.
"""

from __future__ import annotations

import copy

from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import (
    FILE_FORMAT,
    baseline_lookup,
    read_json,
)

# Where a greedy output's reference came from (the gate's baseline result, per prompt and overall).
HOST = "host"  # this host's own baseline file
FLEET = "fleet"  # the fleet's, recorded on a host (maybe this one before it was re-imaged)
NONE = "none"  # no reference anywhere: the output is recorded as the first baseline of its key


def check_document(document, what: str) -> dict:
    """A baselines document ({"format": 2, "baselines": {key: {max_tokens: {prompt: entry}}}}), or an empty
    one for None; raises ValueError naming `what` and the part that is wrong."""
    if document is None or document == {}:
        return {"format": FILE_FORMAT, "baselines": {}}
    if not isinstance(document, dict) or not isinstance(document.get("baselines", {}), dict):
        raise ValueError(
            '%s is not a baselines document (expected {"format": %d, "baselines": {key: {max_tokens: '
            "{prompt: entry}}}}), got %r" % (what, FILE_FORMAT, str(document)[:120])
        )
    if document.get("format", FILE_FORMAT) != FILE_FORMAT:
        raise ValueError(
            "%s has format %r; this collection reads format %d" % (what, document.get("format"), FILE_FORMAT)
        )
    for key, per_key in document.get("baselines", {}).items():
        for max_tokens, per_length in (per_key or {}).items() if isinstance(per_key, dict) else [(None, None)]:
            if not isinstance(per_length, dict) or not all(
                isinstance(entry, dict) and isinstance(entry.get("text"), str) for entry in per_length.values()
            ):
                raise ValueError(
                    '%s: the entries of key %r (max_tokens %s) are not {prompt: {"text": ...}}'
                    % (what, key, max_tokens)
                )
    return {"format": FILE_FORMAT, "baselines": document.get("baselines", {})}


def read_fleet(path: str) -> dict:
    """The fleet's baselines file on the controller, checked (an empty document when it does not exist yet:
    no host recorded anything). Raises ValueError naming the file and what to do."""
    fix = "fix the file, or move it away: the next gate that passes records a new one"
    try:
        document = read_json(path)
    except (OSError, ValueError) as error:
        raise ValueError("cannot read the fleet's baselines %s: %s (%s)" % (path, error, fix)) from error
    try:
        return check_document(document, "the fleet's baselines %s" % path)
    except ValueError as error:
        raise ValueError("%s (%s)" % (error, fix)) from error


def reference_for(
    host_document: dict | None, fleet_document: dict | None, key: str, prompt: str, max_tokens: int
) -> tuple:
    """The greedy output to compare with, and where it came from: this host's own baseline first (the
    same host's arithmetic), else the fleet's, else none. -> (entry or None, HOST | FLEET | NONE)."""
    entry = baseline_lookup(host_document, key, prompt, max_tokens)
    if entry is not None:
        return entry, HOST
    entry = baseline_lookup(fleet_document, key, prompt, max_tokens)
    if entry is not None:
        return entry, FLEET
    return None, NONE


def overall_reference(sources: list) -> str:
    """The references of a gate's prompts -> one word for the report: HOST or FLEET when every prompt had
    that one (FLEET when some had the host's and the others the fleet's), NONE when no prompt had any,
    "partial" when some had none."""
    found = set(sources)
    if not found:
        return NONE
    if found == {NONE}:
        return NONE
    if NONE in found:
        return "partial"
    return FLEET if FLEET in found else HOST


def new_key_note(key: str, max_tokens: int, release_id, fleet_checked: bool) -> str:
    """What the report says of outputs recorded with no reference: plainly, that nothing was compared."""
    where = "on this host or in the fleet's baselines" if fleet_checked else "on this host (no fleet baselines given)"
    return (
        "no baseline for %s (max_tokens %d) %s: the greedy outputs of release %s are recorded as the first "
        "baseline of this key, not compared with anything" % (key, max_tokens, where, release_id or "?")
    )


def fleet_add(fleet_document: dict | None, new_document: dict | None, host: str) -> tuple:
    """Add a host's newly recorded baselines to the fleet's, where the fleet has no entry for the same key,
    max_tokens and prompt (an entry the fleet has is the reference: it is never replaced).

    -> (the new fleet document, [{"key", "max_tokens", "prompt"} added]). The inputs are not changed.
    """
    fleet = copy.deepcopy(check_document(fleet_document, "the fleet's baselines"))
    added = []
    for key, per_key in sorted(check_document(new_document, "the host's new baselines")["baselines"].items()):
        for max_tokens, per_length in sorted(per_key.items()):
            for prompt, entry in sorted(per_length.items()):
                if baseline_lookup(fleet, key, prompt, int(max_tokens)) is not None:
                    continue
                fleet_entry = {
                    name: entry.get(name) for name in ("text", "completion_tokens", "recorded_at", "release_id")
                }
                fleet_entry["host"] = entry.get("host") or host
                fleet["baselines"].setdefault(key, {}).setdefault(str(max_tokens), {})[prompt] = fleet_entry
                added.append({"key": key, "max_tokens": int(max_tokens), "prompt": prompt})
    return fleet, added


def gates_new_baselines(gate_results: list) -> list:
    """The baselines documents that this run's gates recorded and the fleet may take: those of each gate that
    ran and passed (an unreachable host's result has no `passed`; a failed gate's outputs are no reference)."""
    return [
        result["baseline"]["new_baselines"]
        for result in gate_results or []
        if result.get("passed") is True and (result.get("baseline") or {}).get("new_baselines")
    ]
