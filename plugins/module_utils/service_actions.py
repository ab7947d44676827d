# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the sglang_service role does to each service after the switch, decided from data.

The role acts; this decides (docs/services.md, "What the role does on each host"). One function,
called twice by the role:

- before the gates: from the plan, the links switched, what changed on the host (units, environments,
  API keys, the launcher) and the recorded gate verdicts (service_gate_status), which services to
  restart, keep running, gate, quick-check, compare with their shadow, or roll back on a recorded
  failed verdict;
- after the gates: also from this run's gate results and the shadows' verdicts, which services to roll
  back (with the failed result the rollback records) and which production services to promote.

Every decision carries its reasons, so a run says why a service was restarted, gated or rolled back.
"""

from __future__ import annotations

# Why a service restarts: it reads its unit, environment, API key and the launcher only when it starts.
UNIT_CHANGED = "unit changed"
ENVIRONMENT_CHANGED = "environment changed"
API_KEY_CHANGED = "API key changed"
LAUNCHER_CHANGED = "launcher changed"
RELEASE_SWITCHED = "release switched"
NOT_RUNNING = "not running: started"
TUNING_WINDOW = "stopped for its tuning and started again"
UNCHANGED = "unchanged: /health only"
NOT_INSTALLED = "not installed yet: nothing to start (check mode)"
# The systemd states the role puts a unit in: restarted (it reads what changed only when it starts) or started.
RESTARTED = "restarted"
STARTED = "started"
# The actions service_gate_status asks for (gate_verdicts.gate_action).
VERDICT_RESTART = "restart"
VERDICT_GATE = "gate"
VERDICT_ROLLBACK = "rollback"
# The kinds of change service_actions is told about, each a list of service names (or registered loop results).
CHANGE_KINDS = {"units": UNIT_CHANGED, "environments": ENVIRONMENT_CHANGED, "api_keys": API_KEY_CHANGED}
# The same kinds as the files ddtree.sglang.service_files names in its `changes` (`changed.files`: its loop's results).
FILE_KINDS = {"units": "unit", "environments": "environment", "api_keys": "api_key"}


def changed_names(values: list | None, file_kind: str | None = None) -> set:
    """Service names from a list of names, or of a registered loop's results (each item a plan entry); with
    `file_kind`, of the service_files results whose `changes` name that file."""
    names = set()
    for value in values or []:
        if isinstance(value, dict):
            if value.get("changed") and (file_kind is None or file_kind in (value.get("changes") or [])):
                item = value.get("item")
                names.add(item.get("name") if isinstance(item, dict) else item)
        elif value is not None:
            names.add(str(value))
    return names


def restart_reasons(name: str, changed: dict, switched: set, recorded: dict) -> list:
    """Why service `name` restarts in this run (empty: it does not)."""
    reasons = [
        reason
        for kind, reason in CHANGE_KINDS.items()
        if name in changed_names(changed.get(kind)) | changed_names(changed.get("files"), FILE_KINDS[kind])
    ]
    if changed.get("launcher"):
        reasons.append(LAUNCHER_CHANGED)
    if name in switched:
        reasons.append(RELEASE_SWITCHED)
    if recorded.get("action") == VERDICT_RESTART:
        reasons.append("its release has no passed verdict (%s): restarted and gated" % recorded.get("reason"))
    return reasons


def recorded_failure(service: dict, recorded: dict) -> dict:
    """A release whose recorded gate verdict failed, as a failed gate result (a rollout died before its rollback)."""
    verdict = recorded.get("verdict") or {}
    return {
        "item": service,
        "passed": False,
        "release_id": recorded.get("release_id"),
        "recorded_verdict": True,
        "failed_stage": verdict.get("stage"),
        "failure_kind": verdict.get("failure_kind"),
        "msg": "its gate failed at %s (recorded; the rollout then died): %s"
        % (verdict.get("recorded_at"), verdict.get("msg")),
    }


def held_shadow_failure(shadow: dict, production: str, verdict: dict) -> dict:
    """A shadow whose candidate was held, as a failed gate of the shadow: rolled back, production keeps its release."""
    return {
        "item": shadow,
        "passed": False,
        "release_id": (verdict.get("shadow") or {}).get("release_id"),
        "failed_stage": "shadow",
        "failure_kind": "shadow_worse",
        "msg": "worse than %s, which stays on its release: %s" % (production, "; ".join(verdict.get("problems") or [])),
    }


def decide_service(
    service: dict, status: dict, changed: dict, switched: set, window_restarted: set, installed: set | None
) -> dict:
    """One service's decision before the gates: {restart, start, gate, quick_check, rollback, reasons}."""
    name = service["name"]
    decision = {
        "restart": False,
        "start": False,
        "gate": False,
        "quick_check": False,
        "rollback": False,
        "promote": False,
        "reasons": [],
    }
    # A release switched to in this run is a deliberate deploy: gated afresh, whatever an earlier gate said.
    if status.get("action") == VERDICT_ROLLBACK and name not in switched:
        return dict(
            decision, rollback=True, reasons=["its release failed its gate (recorded): rolled back to previous"]
        )
    if installed is not None and name not in installed:
        return dict(decision, reasons=[NOT_INSTALLED])
    reasons = restart_reasons(name, changed, switched, status)
    restart = bool(reasons)
    if not restart and not (status.get("unit_state") or {}).get("active", True):
        reasons.append(NOT_RUNNING)
    if name in window_restarted:
        reasons.append(TUNING_WINDOW)
    if status.get("action") == VERDICT_GATE:
        reasons.append("its release has no verdict (%s): gated as it runs" % status.get("reason"))
    return dict(
        decision,
        restart=restart,
        start=True,
        gate=bool(reasons),
        quick_check=not reasons,
        reasons=reasons or [UNCHANGED],
    )


def shadow_comparison(production: dict, services: list, gate_results: list) -> dict:
    """A production service to compare with its shadow, after the gates: with the shadow's gate result of this run
    (`shadow_gate`, {} when it was not gated) and the shadow's own `shadow_max_slowdown` (None: the role's)."""
    shadow = next((service for service in services if service["name"] == production["shadow"]), {})
    gate = next(
        (result for result in gate_results if (result.get("item") or {}).get("name") == production["shadow"]), {}
    )
    return dict(production, shadow_gate=gate, shadow_max_slowdown=shadow.get("shadow_max_slowdown"))


def after_gates(services: list, decisions: dict, recorded: dict, gate_results: list, shadow_verdicts: dict) -> dict:
    """{rollback: failed results in order, promote: production entries}: what follows this run's gates.

    rollback: each failed gate of this run, each release with a recorded failed verdict, each shadow whose
    candidate was held while its own gate passed (one whose gate failed is a failed gate already).
    promote: each production service whose shadow verdict promotes, and only when nothing is rolled back
    (a host that rolls back fails, and a failed host promotes nothing).
    """
    by_name = {service["name"]: service for service in services}
    rollback = [result for result in gate_results if result.get("passed") is not True]
    rollback += [
        recorded_failure(by_name[name], recorded.get(name) or {}) for name in by_name if decisions[name]["rollback"]
    ]
    promote = []
    for name in by_name:
        verdict = shadow_verdicts.get(name)
        if not verdict:
            continue
        if verdict.get("promote"):
            release_id = (verdict.get("shadow") or {}).get("release_id")
            promote.append(dict(by_name[name], release_id=release_id, state=RESTARTED))
        elif (verdict.get("shadow") or {}).get("passed") and verdict.get("shadow_service") in by_name:
            rollback.append(held_shadow_failure(by_name[verdict["shadow_service"]], name, verdict))
    return {"rollback": rollback, "promote": [] if rollback else promote}


def failure_message(host: str, rollback: list, releases: dict, state_root: str) -> str:
    """The host's failure after its rollbacks: each failed service, its release, stage and message."""
    if not rollback:
        return ""
    parts = []
    for result in rollback:
        name = result["item"]["name"]
        release = result.get("release_id") or (releases.get(name) or {}).get("release_id")
        parts.append("%s (release %s, %s: %s)" % (name, release, result.get("failed_stage") or "?", result.get("msg")))
    return "%s: the health gate failed for %s. Rolled back to the previous release; see %s/<service>/history.jsonl." % (
        host,
        "; ".join(parts),
        state_root,
    )


def _decisions(services, releases, switched, changed, recorded, window_restarted, installed) -> dict:
    """{name: decide_service's decision with the service's unit and release id}, before the gates."""
    switched, window_restarted = changed_names(switched), changed_names(window_restarted)
    installed = None if installed is None else set(installed)
    decisions = {}
    for service in services:
        status = recorded.get(service["name"]) or {}
        decisions[service["name"]] = dict(
            decide_service(service, status, changed, switched, window_restarted, installed),
            unit=service["unit"],
            release_id=(releases.get(service["name"]) or {}).get("release_id"),
        )
    return decisions


def service_actions(
    services: list,
    releases: dict,
    switched: list,
    changed: dict,
    recorded: dict,
    window_restarted: list = (),
    installed: list | None = None,
    gate_results: list | None = None,
    shadow_verdicts: dict | None = None,
    check_mode: bool = False,
    host: str = "host",
    state_root: str = "/var/lib/sglang",
) -> dict:
    """The role's decisions for one host: per service with reasons, and as the lists the role loops over.

    services: the plan's entries; releases: service_release_choice's `services`; switched: names (or the
    service_link loop's results) whose current link changed in this run; changed: {units, environments,
    api_keys: names or registered loop results; files: service_files' loop results; launcher: bool};
    recorded: service_gate_status's `services`; window_restarted: names a tuning stopped and started again;
    installed: in check mode the names whose unit exists (a plan starts only those), None when every unit is
    installed.
    gate_results (after the gates: this run's sglang_health results, each with its plan entry as .item)
    and shadow_verdicts (production name -> service_shadow_compare's result) add the rollbacks and
    promotions; without them both lists are empty. In check mode nothing is gated or quick-checked (the
    services' decisions still say what would be).
    """
    decisions = _decisions(services, releases, switched, changed, recorded, window_restarted, installed)

    def entries(flag: str) -> list:
        return [
            dict(service, release_id=decisions[service["name"]]["release_id"])
            for service in services
            if decisions[service["name"]][flag]
        ]

    result = {
        "services": decisions,
        "restart": entries("restart"),
        # What the role's one systemd task does to each: restarted when anything it reads changed, else started.
        "start": [
            dict(entry, state=RESTARTED if decisions[entry["name"]]["restart"] else STARTED)
            for entry in entries("start")
        ],
        "gate": [] if check_mode else entries("gate"),
        "quick_check": [] if check_mode else entries("quick_check"),
        "rollback": [],
        "promote": [],
        "msg": "",
    }
    result["compare_shadow"] = _waiting_for_shadows(services, releases, decisions)
    if gate_results is not None:
        _add_after_gates(result, services, releases, recorded, gate_results, shadow_verdicts, host, state_root)
    return result


def _waiting_for_shadows(services, releases, decisions) -> list:
    """Each production service that waits for its shadow: compared with it once the shadow is gated."""
    return [
        dict(
            service,
            release_id=decisions[service["name"]]["release_id"],
            shadow=(releases.get(service["name"]) or {}).get("shadow"),
        )
        for service in services
        if (releases.get(service["name"]) or {}).get("follows") == "shadow"
    ]


def _add_after_gates(result, services, releases, recorded, gate_results, shadow_verdicts, host, state_root):
    """What follows this run's gates, in result: the shadows' comparisons, the rollbacks and the promotions."""
    decisions = result["services"]
    result["compare_shadow"] = [shadow_comparison(entry, services, gate_results) for entry in result["compare_shadow"]]
    outcome = after_gates(services, decisions, recorded, gate_results, shadow_verdicts or {})
    for failed in outcome["rollback"]:
        decisions[failed["item"]["name"]]["rollback"] = True
    for entry in outcome["promote"]:
        decisions[entry["name"]]["promote"] = True
    result.update(outcome, msg=failure_message(host, outcome["rollback"], releases, state_root))


def rollback_gate(failed: dict, gate_results: list) -> dict | None:
    """The gate result of the service that `failed` rolled back, among the rollback's gate results (None if absent)."""
    name = (failed.get("item") or {}).get("name")
    return next((result for result in gate_results if (result.get("item") or {}).get("name") == name), None)


def rollback_record(failed: dict, rolled_back: dict, gate: dict, time: str) -> dict:
    """The history line of one rollback: the failed release and its evidence, where it went, its gate."""
    return {
        "time": time,
        "event": "rollback",
        "failed_release_id": (rolled_back.get("before") or {}).get("release_id"),
        "failed_stage": failed.get("failed_stage"),
        "msg": failed.get("msg") or "",
        "journal": (failed.get("journal_excerpt") or [])[-40:],
        "rolled_back_to_release_id": rolled_back.get("release_id"),
        "previous_gate": "passed" if gate.get("passed") else "failed: %s" % gate.get("msg"),
    }
