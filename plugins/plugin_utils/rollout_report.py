# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rollout reports: what a run did to each host, from the results of the collection's own modules.

The rollout_summary callback records events (one per module result that matters) and, at the end,
build_report() turns them into a JSON-ready dict and render_markdown() into a pull-request comment.
Everything here is a plain function of recorded data, so it is tested from recorded events.

Event: {"host", "kind", "task", "service", "result"} with kind one of
  lock        ddtree.sglang.rollout_lock's result
  start       the releases each service pointed at before the run ({service: {release_id, previous_release_id}})
  release     ddtree.sglang.release's result (the release built for this host; a base release, overlay
              false, is kept apart as base_release)
  link        ddtree.sglang.service_link's result (a switch, or a rollback with state=previous)
  gate        ddtree.sglang.sglang_health's result (the first for a service; after a rollback, the
              gate of the release it went back to)
  choice      ddtree.sglang.service_release_choice's result: per service the release it runs and why
              (the candidate, a pin, or the base release of a service that does not load the overlay)
  shadow      ddtree.sglang.service_shadow_compare's result: a shadow's candidate against its production service,
              promoted (the production service then switches) or held (the shadow is rolled back)
  verdicts    ddtree.sglang.service_gate_status's result: per service, whether its current release
              passed its gate and what the run does about it (a release an interrupted rollout left
              without a passed gate is gated, or rolled back)
  change      a task that changed (or would, in check mode), with its diff as text
  failed      a task that failed the host (not an ignored one)
  unreachable the host could not be reached
  bake        a bake's re-check of a service (ddtree.sglang.sglang_health, task variable
              ddtree_rollout_event: bake): passed, failed (rolled back next) or inconclusive
  stop        a task that stopped the whole rollout (after a bake's failed re-check, or too many failures
              in a batch): its message, not a failure of the host it ran on
  pause       a task that paused the rollout (a bake's inconclusive re-check): its message
"""

from __future__ import annotations

from ansible_collections.ddtree.sglang.plugins.module_utils.rollout_policy import bake_verdict

# The report as text lives in rollout_report_render; its functions are named here too, where the callback and
# the tests take them with the report's builder.
from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_report_render import (  # noqa: F401  # pylint: disable=unused-import
    render_markdown,
    report_charts,
    resume_command,
    summary_lines,
)
from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_report_words import (
    ROLLBACK_LINK_TASK,
    _setting_label,
    _short,
)

# 2: every release id is named release_id, or <qualifier>_release_id where an object holds several
# (before_release_id/after_release_id, failed_release_id/rolled_back_to_release_id; the host's
# release.release_id, a gate's release_id). 1 had release_before/release_after, failed_release,
# rolled_back_to, release.id and a gate's release.
SCHEMA_VERSION = 2
JOURNAL_LINES = 25
DIFF_CHARS = 4000


# What a health gate's result is to the report, by its task's ddtree_rollout_event: a bake's re-check, or a
# production service measured for its shadow's comparison (nothing: the comparison carries its numbers);
# without one, the deploy's (or a rollback's) gate.
GATE_EVENTS = {"bake": "bake", "measure": None}


def gate_kind(event):
    """The event kind of an sglang_health result whose task says ddtree_rollout_event `event` (None: not recorded)."""
    return GATE_EVENTS.get(event, "gate")


def gate_summary(result):
    """The measurements of one health-gate run, flat, for a table row."""
    startup = result.get("startup") or {}
    health = result.get("health") or {}
    chat = result.get("chat") or {}
    baseline = result.get("baseline") or {}
    performance = result.get("performance") or {}
    previous = performance.get("previous") or {}
    matches = [entry.get("status") for entry in baseline.get("results") or []]
    summary = {
        "passed": result.get("passed") is True,
        "release_id": result.get("release_id"),
        "stage": result.get("failed_stage") or result.get("stage"),
        "time_to_port_s": startup.get("time_to_port_s"),
        "health_latency_s": health.get("latency_s"),
        "chat_latency_s": chat.get("latency_s"),
        "baseline": baseline.get("status"),
        "baseline_matches": "%d/%d" % (matches.count("match"), len(matches))
        if matches and baseline.get("status") in ("passed", "failed")
        else None,
        # What the outputs were compared with: host, fleet, none (recorded as a key's first baseline), partial.
        "baseline_reference": baseline.get("reference"),
        "baseline_note": baseline.get("note"),
        "tokens_per_second": performance.get("tokens_per_second"),
        "accept_length": performance.get("accept_length"),
        "previous_tokens_per_second": previous.get("tokens_per_second"),
        "previous_accept_length": previous.get("accept_length"),
        "total_s": (result.get("timings") or {}).get("total"),
    }
    if not summary["passed"]:
        summary.update(
            failure_kind=result.get("failure_kind"),
            msg=result.get("msg", ""),
            journal_excerpt=list(result.get("journal_excerpt") or [])[-JOURNAL_LINES:],
            signature_matches=[match.get("line") for match in result.get("signature_matches") or []][:5],
        )
    return summary


def _failure_message(result):
    """A failed task's message, including each failed loop item's (a loop says only 'One or more items failed')."""
    messages = [result.get("msg", "")] if result.get("msg") else []
    for item in result.get("results") or []:
        if item.get("failed") and item.get("msg"):
            messages.append(item["msg"])
    if len(messages) > 1 and messages[0].startswith("One or more items failed"):
        messages = messages[1:]
    return " | ".join(messages) or "failed (no message)"


# A service not switched in this run whose current release had no passed gate verdict: what the
# host's status says about it (service_gate_status's reasons).
RECOVERY_STATUS = {
    "interrupted": "gated after an interrupted rollout",
    "no_verdicts_yet": "gated once (no gate verdict recorded before)",
    "failed_verdict": "rolled back after an interrupted rollout",
}


def recovery_note(recovery):
    """One sentence on what an interrupted rollout had left, and what this run did about it."""
    release = _short(recovery.get("release_id")) or "none"
    if recovery["reason"] == "failed_verdict":
        verdict = recovery.get("verdict") or {}
        return "release %s had failed its gate at %s (%s) and an interrupted rollout left it current" % (
            release,
            verdict.get("recorded_at") or "?",
            verdict.get("stage") or "?",
        )
    if recovery["reason"] == "interrupted":
        return "release %s was left current without a gate verdict by an interrupted rollout (%s)" % (
            release,
            "restarted, then gated" if recovery["action"] == "restart" else "gated as it ran",
        )
    return "release %s had no gate verdict (it predates them, or the first rollout was interrupted): %s" % (
        release,
        "restarted, then gated" if recovery["action"] == "restart" else "gated as it ran",
    )


def _service(record, name):
    return record["services"].setdefault(
        name,
        {
            "name": name,
            "before_release_id": None,
            "after_release_id": None,
            "switched": False,
            "gate": None,
            "rollback": None,
            "recovery": None,
            "release_choice": None,
            "shadow": None,
            "tuning": None,
        },
    )


def _shadow_event(record, event, result):
    """A shadow's comparison: on the production service, the verdict and the numbers; its release choice
    says promoted or held; a held candidate whose gate passed is the shadow's rollback evidence."""
    production = _service(record, result.get("service") or event.get("service"))
    shadow_name = result.get("shadow_service")
    shadow = result.get("shadow") or {}
    production["shadow"] = {
        key: result.get(key)
        for key in ("shadow_service", "verdict", "problems", "shadow", "production", "outputs_compared", "max_slowdown")
    }
    choice = production.get("release_choice") or {}
    if result.get("promote"):
        production["release_choice"] = dict(
            choice,
            release_id=shadow.get("release_id"),
            follows="promoted",
            reason="promoted: its shadow %s passed and was not worse" % shadow_name,
        )
        return
    production["release_choice"] = dict(
        choice,
        follows="held",
        reason="held on its release: its shadow %s %s"
        % (shadow_name, "was worse" if shadow.get("passed") else "failed its gate"),
    )
    if shadow.get("passed"):
        rolled = _service(record, shadow_name)
        rolled["rollback"] = dict(
            rolled["rollback"] or {},
            evidence={
                "passed": False,
                "release_id": shadow.get("release_id"),
                "stage": "shadow",
                "failure_kind": "shadow_worse",
                "during": "shadow",
                "msg": "worse than %s: %s" % (production["name"], "; ".join(result.get("problems") or [])),
            },
        )


def tuning_summary(result, plan=False):
    """A service_autotune result to the report: whether it tuned (or, in a plan, would), the choice and its
    gain over DFLASH at each declared concurrency. The second call of a tuning (with the measurements)
    follows the first and replaces it."""
    choice = result.get("choice") or {}
    if result.get("tuned"):
        state = "tuned"
    elif result.get("needs_tuning"):
        state = "would tune" if plan else "needs tuning"
    else:
        state = "unchanged"
    gains = choice.get("gain_over_dflash") or {}
    return {
        "state": state,
        "algorithm": choice.get("algorithm"),
        "budget": choice.get("budget"),
        "top_k": choice.get("top_k"),
        "status": choice.get("status"),
        "reason": choice.get("reason"),
        "gain_over_dflash": {concurrency: gains[concurrency] for concurrency in sorted(gains, key=int)},
        "key_changes": list(result.get("key_changes") or []) if result.get("needs_tuning") else [],
        # What a tuning measured (only the call that tuned has it): the tuning's charts.
        "measurements": [
            {
                "setting": _setting_label(item),
                "concurrency": item.get("concurrency"),
                "tokens_per_second": item.get("tokens_per_second"),
                "accept_length": item.get("accept_length"),
            }
            for item in result.get("measurements") or []
            if not item.get("error")
        ],
    }


def _host_status(record, kind):
    if record["unreachable"]:
        return "unreachable"
    services = record["services"].values()
    if kind == "plan":
        if record["failure"]:
            return "plan failed"
        if not record["seen"]:
            return "not reached"
        return "would change" if record["changes"] else "no change"
    if any(service["rollback"] for service in services):
        # A failed gate with nothing to go back to (a blank host's first release) stopped the service: failed.
        if record["failure"] and ROLLBACK_LINK_TASK in str(record["failure"].get("task") or ""):
            return "failed"
        return "rolled back"
    if record.get("inconclusive") or any(
        (service.get("bake") or {}).get("verdict") == "inconclusive" for service in services
    ):
        return "inconclusive"
    if record["failure"]:
        return "failed"
    if not record["seen"]:
        return "not reached"
    if any(
        service["after_release_id"] != service["before_release_id"]
        for service in services
        if service["after_release_id"]
    ):
        return "updated"
    # Never "unchanged" for a release that had not passed its gate when this run began.
    for service in services:
        if service["recovery"]:
            return RECOVERY_STATUS[service["recovery"]["reason"]]
    return "unchanged"


def build_report(events, targeted, kind="rollout", meta=None):
    """The report of one run: kind 'plan' (check mode) or 'rollout'; meta: revision, trigger, times."""
    hosts = {name: _new_host(name) for name in targeted}
    lock = None
    stopped = paused = None
    for event in events:
        result = event.get("result") or {}
        if event["kind"] == "stop":
            stopped = stopped or result.get("msg", "")
        elif event["kind"] == "pause":
            paused = paused or result.get("msg", "")
        elif event["kind"] == "lock":
            hosts.setdefault(event["host"], _new_host(event["host"]))
            lock = {
                "waited_s": result.get("waited_s"),
                "refused": bool(result.get("refused")),
                "holder": result.get("holder"),
                "msg": result.get("msg"),
            }
        else:
            _apply_event(hosts.setdefault(event["host"], _new_host(event["host"])), event, result, kind)
    rows = [_finished_host(hosts[name], kind) for name in list(targeted) + sorted(set(hosts) - set(targeted))]
    extra = {key: value for key, value in (("stopped", stopped), ("paused", paused)) if value}
    verdict = _verdict(lock, kind, stopped, paused, rows)
    return dict(meta or {}, schema=SCHEMA_VERSION, kind=kind, verdict=verdict, lock=lock, hosts=rows, **extra)


def _new_host(name):
    return {
        "host": name,
        "status": None,
        "seen": False,
        "release": None,
        "base_release": None,
        "services": {},
        "changes": [],
        "failure": None,
        "unreachable": False,
    }


def _apply_event(record, event, result, kind):
    """One event's mark on its host's record (the lock, stop and pause events are the run's: build_report)."""
    if event["kind"] == "start":
        for service, links in sorted((result or {}).items()):
            release_id = (links or {}).get("release_id") or None
            _service(record, service)["before_release_id"] = release_id
            _service(record, service)["after_release_id"] = release_id
        return
    record["seen"] = True
    handler = _EVENT_HANDLERS.get(event["kind"])
    if handler is not None:
        handler(record, event, result, kind)


def _on_release(record, event, result, kind):
    key = "base_release" if result.get("overlay") is False else "release"
    record[key] = {"release_id": result.get("release_id"), "built": bool(result.get("changed"))}


def _on_choice(record, event, result, kind):
    for name, choice in sorted((result.get("services") or {}).items()):
        _service(record, name)["release_choice"] = {
            key: (choice or {}).get(key) for key in ("release_id", "follows", "reason")
        }


def _on_tuning(record, event, result, kind):
    if result.get("service"):
        _service(record, result["service"])["tuning"] = tuning_summary(result, plan=kind == "plan")


def _on_link(record, event, result, kind):
    service = _service(record, event["service"])
    before = (result.get("before") or {}).get("release_id")
    if event.get("rollback"):
        service["rollback"] = dict(
            service["rollback"] or {},
            failed_release_id=before,
            rolled_back_to_release_id=result.get("release_id"),
        )
    else:
        if service["before_release_id"] is None:
            service["before_release_id"] = before
        service["switched"] = service["switched"] or bool(result.get("changed"))
    service["after_release_id"] = result.get("release_id")


def _on_gate(record, event, result, kind):
    service = _service(record, event["service"])
    summary = gate_summary(result)
    if service["rollback"] and "failed_release_id" in service["rollback"]:
        service["rollback"]["gate"] = summary
    else:
        service["gate"] = summary
        if not summary["passed"]:
            service["rollback"] = {"evidence": summary}


def _on_bake(record, event, result, kind):
    verdict = bake_verdict(result)
    name = event.get("service") or result.get("service")
    if not name:  # the re-check never reached the host: no service to name
        record["inconclusive"] = verdict["reason"]
        return
    service = _service(record, name)
    summary = dict(gate_summary(result), verdict=verdict["verdict"], reason=verdict["reason"])
    service["bake"] = summary
    if verdict["verdict"] == "failed":
        service["rollback"] = {"evidence": dict(summary, during="bake")}


def _on_verdicts(record, event, result, kind):
    for name, status in sorted((result.get("services") or {}).items()):
        if (status or {}).get("action") not in (None, "none"):
            _service(record, name)["recovery"] = {
                key: status.get(key) for key in ("action", "reason", "release_id", "previous_release_id", "verdict")
            }


def _on_change(record, event, result, kind):
    record["changes"].append(
        {"task": event.get("task"), "item": event.get("item"), "diff": (event.get("diff") or "")[:DIFF_CHARS]}
    )


def _on_failed(record, event, result, kind):
    record["failure"] = record["failure"] or {"task": event.get("task"), "msg": _failure_message(result)}


def _on_unreachable(record, event, result, kind):
    record["unreachable"] = True
    record["failure"] = record["failure"] or {"task": event.get("task"), "msg": result.get("msg", "unreachable")}


def _on_shadow(record, event, result, kind):
    _shadow_event(record, event, result)


# What each kind of event does to its host's record (docstring of this module: the kinds).
_EVENT_HANDLERS = {
    "release": _on_release,
    "choice": _on_choice,
    "shadow": _on_shadow,
    "tuning": _on_tuning,
    "link": _on_link,
    "gate": _on_gate,
    "bake": _on_bake,
    "verdicts": _on_verdicts,
    "change": _on_change,
    "failed": _on_failed,
    "unreachable": _on_unreachable,
}


def _finished_host(record, kind):
    """A host's record as the report shows it: its status, its services in order, each recovery explained."""
    record["status"] = _host_status(record, kind)
    for service in record["services"].values():
        _finish_service(service)
    record["services"] = [record["services"][key] for key in sorted(record["services"])]
    del record["seen"]
    return record


def _finish_service(service):
    if service["recovery"] and service["switched"]:
        service["recovery"] = None  # a release switched to in this run has no verdict yet by nature
    if service["recovery"]:
        service["recovery"]["note"] = recovery_note(service["recovery"])
        verdict = service["recovery"].get("verdict") or {}
        if service["rollback"] and not service["rollback"].get("evidence") and verdict.get("verdict") == "failed":
            # Rolled back on the verdict an interrupted rollout recorded: that verdict is the evidence.
            service["rollback"]["evidence"] = {
                "passed": False,
                "release_id": service["recovery"]["release_id"],
                "stage": verdict.get("stage"),
                "failure_kind": verdict.get("failure_kind"),
                "msg": "recorded at %s by a rollout that died before its rollback: %s"
                % (verdict.get("recorded_at"), verdict.get("msg") or ""),
            }
    if service["rollback"] and "failed_release_id" not in service["rollback"]:
        # The gate failed but no rollback followed (the run stopped first): say so.
        service["rollback"]["failed_release_id"] = None


def _verdict(lock, kind, stopped, paused, rows):
    if lock and lock["refused"]:
        return "refused"
    if kind == "plan":
        return "plan failed" if any(row["failure"] for row in rows) else "planned"
    if stopped or any(row["failure"] or row["status"] == "rolled back" for row in rows):
        return "failed"
    return "paused" if paused else "succeeded"
