# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's verdicts on the host, and what a run must do about a service's current release.

A rollout can die anywhere (a cancelled CI job, a controller that loses power): after the links
switched, after the restart, before the gate said anything, during a rollback. Links and units alone
cannot tell a release that passed its gate from one that was never gated, so the gate's verdict is
recorded per service and release, in /var/lib/sglang/<service>/verdicts.json:

    {"format": 1, "verdicts": {release_id: {"verdict": "passed" | "failed", "recorded_at": ...,
                                           "stage", "failure_kind", "msg", "measurements": {...}}}}

written whole (atomically) by ddtree.sglang.sglang_health right after its verdict. Every run reads it
(ddtree.sglang.service_gate_status) and decides per service with gate_action(): a current release with
no passed verdict is gated, restarted first when the running process may not be that release; a failed
one is rolled back. docs/health-gate.md ("Verdicts") has the table.
"""

from __future__ import annotations

import os
import time

FILE_FORMAT = 1
VERDICTS_FILE = "verdicts.json"
# Releases whose verdicts are kept per service: far more than current and previous ever need.
KEEP = 50
MESSAGE_CHARS = 500

# What a run does about a service's current release (gate_action's "action").
NOTHING = "none"  # it passed its gate: only (re)started services are gated, as always
GATE = "gate"  # no verdict, and the running process is that release: gate it as it runs
RESTART = "restart"  # no verdict, and the process may predate the switch (or is down): restart, then gate
ROLLBACK = "rollback"  # its gate failed: roll back to previous without running it again
# Why (gate_action's "reason"), for the report.
PASSED = "passed"
FAILED_VERDICT = "failed_verdict"  # the gate failed and the run died before (or during) the rollback
INTERRUPTED = "interrupted"  # verdicts exist for the service, but none for its current release
NO_VERDICTS_YET = "no_verdicts_yet"  # no verdict for the service at all: a release from before verdicts
NO_RELEASE = "no_release"  # no current link (a first deploy not switched yet)


def utc_now() -> str:
    """The time a verdict is recorded at, as the gate's other records write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def verdicts_path(state_root: str, service: str) -> str:
    """Where a service's verdicts live: <state_root>/<service>/verdicts.json."""
    return os.path.join(state_root, service, VERDICTS_FILE)


def measurements(result: dict) -> dict:
    """The gate's numbers worth keeping with its verdict (the full result is in the run's report)."""
    startup = result.get("startup") or {}
    baseline = result.get("baseline") or {}
    performance = result.get("performance") or {}
    return {
        "time_to_port_s": startup.get("time_to_port_s"),
        "health_latency_s": (result.get("health") or {}).get("latency_s"),
        "chat_latency_s": (result.get("chat") or {}).get("latency_s"),
        "baseline": baseline.get("status"),
        # Outputs that differed from their reference: a prompt recorded as new was compared with nothing.
        "baseline_mismatches": sum(1 for entry in baseline.get("results") or [] if entry.get("status") == "mismatch"),
        "baseline_reference": baseline.get("reference"),
        "tokens_per_second": performance.get("tokens_per_second"),
        "accept_length": performance.get("accept_length"),
        "total_s": (result.get("timings") or {}).get("total"),
    }


def verdict_record(passed: bool, result: dict, recorded_at: str) -> dict:
    """One verdict: passed or failed, when, where the gate stopped and why, and its measurements."""
    return {
        "verdict": "passed" if passed else "failed",
        "recorded_at": recorded_at,
        "stage": result.get("failed_stage") or result.get("stage"),
        "failure_kind": None if passed else result.get("failure_kind"),
        "msg": (result.get("msg") or "")[:MESSAGE_CHARS],
        "measurements": measurements(result),
    }


def verdict_for(document: dict | None, release_id: str | None) -> dict | None:
    """The verdict recorded for a release, or None."""
    if not release_id:
        return None
    return ((document or {}).get("verdicts") or {}).get(release_id)


def verdicts_add(document: dict | None, release_id: str, record: dict, keep: int = KEEP) -> dict:
    """A copy of the document with this release's verdict set (replacing an older one: the latest gate
    decides), keeping the `keep` most recently recorded releases."""
    if not release_id:
        raise ValueError("a gate verdict needs the release it is about: release_id is empty")
    verdicts = dict((document or {}).get("verdicts") or {})
    verdicts.pop(release_id, None)
    verdicts[release_id] = record
    newest = sorted(verdicts, key=lambda name: str(verdicts[name].get("recorded_at") or ""))[-keep:]
    return {"format": FILE_FORMAT, "verdicts": {name: verdicts[name] for name in newest}}


def started_after(process_start: float | None, link_mtime: float | None) -> bool:
    """Whether the unit's main process certainly started after the current link was set.

    process_start is systemd's ExecMainStartTimestamp in whole seconds (as `--timestamp=unix` prints
    it); link_mtime the link's own mtime. Within the same second the order is unknown: not after.
    """
    if process_start is None or link_mtime is None:
        return False
    return process_start > link_mtime


def gate_action(
    current: str | None,
    previous: str | None,
    document: dict | None,
    unit_active: bool,
    process_started_after_switch: bool,
    restarts: int = 0,
) -> dict:
    """What a run must do about a service's current release, from its recorded verdicts and its unit.

    Returns {"action": none | gate | restart | rollback, "reason": ..., "verdict": the current release's
    verdict or None, "previous_verdict": previous's}.
    """
    verdict = verdict_for(document, current)
    previous_verdict = verdict_for(document, previous)
    decision = {"verdict": verdict, "previous_verdict": previous_verdict}
    if not current:
        return dict(decision, action=NOTHING, reason=NO_RELEASE)
    if verdict and verdict.get("verdict") == "passed":
        return dict(decision, action=NOTHING, reason=PASSED)
    if verdict and verdict.get("verdict") == "failed":
        # Back to previous, unless previous failed its gate too (or there is none): then the current
        # release is gated again and the usual rollback, or the host's failure, follows.
        if previous and not (previous_verdict and previous_verdict.get("verdict") == "failed"):
            return dict(decision, action=ROLLBACK, reason=FAILED_VERDICT)
        return dict(decision, action=RESTART, reason=FAILED_VERDICT)
    reason = INTERRUPTED if (document or {}).get("verdicts") else NO_VERDICTS_YET
    # Gate the running process only when it certainly is the current release, and no automatic
    # restart since its start would make the gate's unit watch read a crash.
    if unit_active and process_started_after_switch and not restarts:
        return dict(decision, action=GATE, reason=reason)
    return dict(decision, action=RESTART, reason=reason)


# `systemctl show --timestamp=unix -p` these: whether the unit runs, since when, and whether systemd
# restarted it by itself since (NRestarts counts automatic restarts since the last deliberate start).
UNIT_PROPERTIES = ("ActiveState", "NRestarts", "ExecMainStartTimestamp")


def unit_facts(properties: dict) -> dict:
    """{active, restarts, process_start (unix seconds or None)} from `systemctl show --timestamp=unix`."""
    stamp = (properties.get("ExecMainStartTimestamp") or "").strip()
    try:
        process_start = float(stamp[1:]) if stamp.startswith("@") else None
    except ValueError:
        process_start = None
    try:
        restarts = int(properties.get("NRestarts") or 0)
    except ValueError:
        restarts = 0
    return {
        "active": properties.get("ActiveState") in ("active", "activating", "reloading"),
        "restarts": restarts,
        "process_start": process_start,
    }


def fallback_after_switch(
    before_current: str | None, before_previous: str | None, new_release: str, document: dict | None
) -> str | None:
    """The release `previous` should name after switching to new_release: the one to roll back to.

    Without verdicts (a host from before them) it is the release current named, as always. With them,
    only a release that passed its gate becomes the fallback: a current left unverified or failed by an
    interrupted rollout is skipped, and the fallback before it kept.
    """
    if before_current == new_release:
        return before_previous
    if before_current and (document or {}).get("verdicts"):
        verdict = verdict_for(document, before_current)
        if not (verdict and verdict.get("verdict") == "passed"):
            return before_previous
    return before_current or before_previous
