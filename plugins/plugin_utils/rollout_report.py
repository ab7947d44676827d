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
from ansible_collections.ddtree.sglang.plugins.plugin_utils.svg_chart import grouped_bars

# 2: every release id is named release_id, or <qualifier>_release_id where an object holds several
# (before_release_id/after_release_id, failed_release_id/rolled_back_to_release_id; the host's
# release.release_id, a gate's release_id). 1 had release_before/release_after, failed_release,
# rolled_back_to, release.id and a gate's release.
SCHEMA_VERSION = 2
JOURNAL_LINES = 25
DIFF_CHARS = 4000
# Diffs in a plan's Markdown stop here (a GitHub comment holds 65536 characters); plan.json has them all.
PLAN_DIFF_BUDGET = 40000


# What a health gate's result is to the report, by its task's ddtree_rollout_event: a bake's re-check, or a
# production service measured for its shadow's comparison (nothing: the comparison carries its numbers);
# without one, the deploy's (or a rollback's) gate.
GATE_EVENTS = {"bake": "bake", "measure": None}


def gate_kind(event):
    """The event kind of an sglang_health result whose task says ddtree_rollout_event `event` (None: not recorded)."""
    return GATE_EVENTS.get(event, "gate")


def _short(release):
    return release[:12] if release else release


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


def _percent(gain):
    return None if gain is None else "%+.1f%%" % (100.0 * gain)


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
    hosts = {}

    def host(name):
        return hosts.setdefault(
            name,
            {
                "host": name,
                "status": None,
                "seen": False,
                "release": None,
                "base_release": None,
                "services": {},
                "changes": [],
                "failure": None,
                "unreachable": False,
            },
        )

    for name in targeted:
        host(name)
    lock = None
    stopped = paused = None
    for event in events:
        if event["kind"] in ("stop", "pause"):
            message = (event.get("result") or {}).get("msg", "")
            if event["kind"] == "stop":
                stopped = stopped or message
            else:
                paused = paused or message
            continue
        record = host(event["host"])
        result = event.get("result") or {}
        kind_ = event["kind"]
        if kind_ == "lock":
            lock = {
                "waited_s": result.get("waited_s"),
                "refused": bool(result.get("refused")),
                "holder": result.get("holder"),
                "msg": result.get("msg"),
            }
            continue
        if kind_ == "start":
            for service, links in sorted((result or {}).items()):
                release_id = (links or {}).get("release_id") or None
                _service(record, service)["before_release_id"] = release_id
                _service(record, service)["after_release_id"] = release_id
            continue
        record["seen"] = True
        if kind_ == "release":
            key = "base_release" if result.get("overlay") is False else "release"
            record[key] = {"release_id": result.get("release_id"), "built": bool(result.get("changed"))}
        elif kind_ == "choice":
            for name, choice in sorted((result.get("services") or {}).items()):
                _service(record, name)["release_choice"] = {
                    key: (choice or {}).get(key) for key in ("release_id", "follows", "reason")
                }
        elif kind_ == "shadow":
            _shadow_event(record, event, result)
        elif kind_ == "tuning" and result.get("service"):
            _service(record, result["service"])["tuning"] = tuning_summary(result, plan=kind == "plan")
        elif kind_ == "link":
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
        elif kind_ == "gate":
            service = _service(record, event["service"])
            summary = gate_summary(result)
            if service["rollback"] and "failed_release_id" in service["rollback"]:
                service["rollback"]["gate"] = summary
            else:
                service["gate"] = summary
                if not summary["passed"]:
                    service["rollback"] = {"evidence": summary}
        elif kind_ == "bake":
            verdict = bake_verdict(result)
            name = event.get("service") or result.get("service")
            if not name:  # the re-check never reached the host: no service to name
                record["inconclusive"] = verdict["reason"]
                continue
            service = _service(record, name)
            summary = dict(gate_summary(result), verdict=verdict["verdict"], reason=verdict["reason"])
            service["bake"] = summary
            if verdict["verdict"] == "failed":
                service["rollback"] = {"evidence": dict(summary, during="bake")}
        elif kind_ == "verdicts":
            for name, status in sorted((result.get("services") or {}).items()):
                if (status or {}).get("action") not in (None, "none"):
                    _service(record, name)["recovery"] = {
                        key: status.get(key)
                        for key in ("action", "reason", "release_id", "previous_release_id", "verdict")
                    }
        elif kind_ == "change":
            record["changes"].append(
                {"task": event.get("task"), "item": event.get("item"), "diff": (event.get("diff") or "")[:DIFF_CHARS]}
            )
        elif kind_ == "failed":
            record["failure"] = record["failure"] or {"task": event.get("task"), "msg": _failure_message(result)}
        elif kind_ == "unreachable":
            record["unreachable"] = True
            record["failure"] = record["failure"] or {
                "task": event.get("task"),
                "msg": result.get("msg", "unreachable"),
            }
    rows = []
    for name in list(targeted) + sorted(set(hosts) - set(targeted)):
        record = hosts[name]
        record["status"] = _host_status(record, kind)
        for service in record["services"].values():
            if service["recovery"] and service["switched"]:
                service["recovery"] = None  # a release switched to in this run has no verdict yet by nature
            if service["recovery"]:
                service["recovery"]["note"] = recovery_note(service["recovery"])
                verdict = service["recovery"].get("verdict") or {}
                if (
                    service["rollback"]
                    and not service["rollback"].get("evidence")
                    and verdict.get("verdict") == "failed"
                ):
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
        record["services"] = [record["services"][key] for key in sorted(record["services"])]
        del record["seen"]
        rows.append(record)
    if lock and lock["refused"]:
        verdict = "refused"
    elif kind == "plan":
        verdict = "plan failed" if any(row["failure"] for row in rows) else "planned"
    elif stopped or any(row["failure"] or row["status"] == "rolled back" for row in rows):
        verdict = "failed"
    elif paused:
        verdict = "paused"
    else:
        verdict = "succeeded"
    extra = {key: value for key, value in (("stopped", stopped), ("paused", paused)) if value}
    return dict(meta or {}, schema=SCHEMA_VERSION, kind=kind, verdict=verdict, lock=lock, hosts=rows, **extra)


def resume_command(report):
    """The command that resumes a paused rollout: the same run again, from the same directory."""
    command = report.get("command") or {}
    if not command.get("argv"):
        return None
    return "cd %s && %s" % (command.get("cwd") or ".", command["argv"])


# ---- Markdown ---------------------------------------------------------------------------------------


def _cell(value):
    if value is None or value == "":
        return "–"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _code(value):
    return "`%s`" % _short(value) if value else "–"


def _fence(lines):
    text = "\n".join(lines)
    fence = "```"
    while fence in text:
        fence += "`"
    return "%stext\n%s\n%s" % (fence, text, fence)


def _number(value, unit="", digits=1):
    if value is None:
        return None
    return ("%." + str(digits) + "f%s") % (value, unit)


def _gate_cell(gate):
    if not gate:
        return None
    if gate["passed"]:
        return "passed"
    return "failed at %s (%s)" % (gate["stage"], gate.get("failure_kind") or "?")


def _headline(report):
    rows = report["hosts"]
    counts = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    parts = ", ".join("%d %s" % (count, status) for status, count in sorted(counts.items()))
    if report["verdict"] == "planned":
        return "## ddtree.sglang plan: %s" % (parts or "no hosts")
    word = {
        "succeeded": "succeeded",
        "failed": "FAILED",
        "paused": "PAUSED (a bake's re-check was inconclusive)",
        "refused": "REFUSED (another rollout holds the lock)",
        "plan failed": "FAILED",
    }.get(report["verdict"], report["verdict"])
    return "## ddtree.sglang %s: %s (%s)" % (
        "plan" if report["kind"] == "plan" else "rollout",
        word,
        parts or "no hosts",
    )


def report_charts(report):
    """The report's charts as SVG: {"before_after": [chart], "tuning": [chart]}, each chart {"name", "title",
    "svg"}. Before/after: each gated service's tokens/s and acceptance length against the previous release's
    recorded numbers; tuning: each tuning's tokens/s and acceptance length per setting and concurrency."""
    charts = {"before_after": [], "tuning": []}
    if report.get("kind") == "plan":
        return charts
    gated = [
        ("%s/%s" % (row["host"], service["name"]), service["gate"])
        for row in report["hosts"]
        for service in row["services"]
        if service.get("gate") and service["gate"].get("tokens_per_second") is not None
    ]
    for field, what, unit in (
        ("tokens_per_second", "tokens/s", "tokens/s"),
        ("accept_length", "acceptance length", "tokens per step"),
    ):
        labels = [label for label, gate in gated if gate.get(field) is not None]
        if not labels:
            continue
        rows = [gate for _label, gate in gated if gate.get(field) is not None]
        series = [
            ("before (previous release)", [gate.get("previous_" + field) for gate in rows]),
            ("after", [gate.get(field) for gate in rows]),
        ]
        charts["before_after"].append(
            {
                "name": "before-after-" + field.replace("_", "-"),
                "title": "%s per host, before and after" % what.capitalize(),
                "svg": grouped_bars(
                    "%s per host and service, before and after" % what.capitalize(), labels, series, unit
                ),
            }
        )
    for row in report["hosts"]:
        for service in row["services"]:
            measured = (service.get("tuning") or {}).get("measurements") or []
            if not measured:
                continue
            settings = list(dict.fromkeys(item["setting"] for item in measured))
            levels = sorted({item["concurrency"] for item in measured}, key=lambda level: int(level or 0))
            for field, what, unit in (
                ("tokens_per_second", "tokens/s", "tokens/s"),
                ("accept_length", "acceptance length", "tokens per step"),
            ):
                values = {(item["setting"], item["concurrency"]): item.get(field) for item in measured}
                if not any(value is not None for value in values.values()):
                    continue
                series = [
                    ("concurrency %s" % level, [values.get((name, level)) for name in settings]) for level in levels
                ]
                title = "%s/%s tuning: %s per setting and concurrency" % (row["host"], service["name"], what)
                charts["tuning"].append(
                    {
                        "name": "tuning-%s-%s-%s" % (row["host"], service["name"], field.replace("_", "-")),
                        "title": title,
                        "svg": grouped_bars(title, settings, series, unit),
                    }
                )
    return charts


def _service_items(report, key):
    """(host, service name, service[key]) for each service whose key is set, in the report's order."""
    return [
        (row["host"], service["name"], service[key])
        for row in report["hosts"]
        for service in row["services"]
        if service.get(key)
    ]


def _table(title, headers, rows):
    """A "### title" section: a Markdown table under headers ("Host | Service | ...": a column each) with a row
    per item of rows (each value written by _cell), then a blank line. No rows: no section."""
    if not rows:
        return []
    return (
        ["### %s" % title, "", "| %s |" % headers, "|%s" % ("---|" * len(headers.split(" | ")))]
        + ["| %s |" % " | ".join(_cell(value) for value in row) for row in rows]
        + [""]
    )


def _shadow_row(host, name, comparison):
    """The shadows table's row: the shadow, its candidate release, the verdict and the numbers behind it."""
    return (
        host,
        name,
        comparison["shadow_service"],
        _short((comparison["shadow"] or {}).get("release_id")),
        comparison["verdict"],
        shadow_numbers(comparison),
        comparison["outputs_compared"],
        "; ".join(comparison["problems"] or []),
    )


def _tuning_row(host, name, tuning):
    """The tuning table's row: what was run, its gain over DFLASH per concurrency, and why it was (re)tuned."""
    runs = (
        "DDTREE budget %s top_k %s" % (tuning["budget"], tuning["top_k"])
        if tuning["algorithm"] == "DDTREE"
        else tuning["algorithm"]
    )
    if tuning["state"] in ("would tune", "needs tuning"):
        runs = None
    gains = ", ".join(
        "%s at %s" % (_percent(gain), concurrency) for concurrency, gain in tuning["gain_over_dflash"].items()
    )
    why = "%s changed" % ", ".join(tuning["key_changes"]) if tuning["key_changes"] else ""
    return (
        host,
        name,
        tuning["state"],
        runs,
        gains,
        "; ".join(part for part in (why, tuning["reason"] or "") if part),
    )


def _gate_row(host, name, label, gate):
    """The health gates table's row: the gate's result, its stages' times and its numbers against the previous
    release's."""
    return (
        host,
        name,
        label,
        _short(gate["release_id"]),
        "passed" if gate["passed"] else "failed at %s" % gate["stage"],
        _number(gate["time_to_port_s"], " s"),
        _number(gate["health_latency_s"], " s", 2),
        _number(gate["chat_latency_s"], " s", 2),
        gate["baseline_matches"] and "%s (%s)" % (gate["baseline"], gate["baseline_matches"]) or gate["baseline"],
        _pair(gate["tokens_per_second"], gate["previous_tokens_per_second"]),
        _pair(gate["accept_length"], gate["previous_accept_length"], 2),
        _number(gate["total_s"], " s"),
    )


def _chart_links(charts, prefix):
    """A paragraph per chart: an image of its own line each."""
    return [line for chart in charts for line in ("![%s](%s%s.svg)" % (chart["title"], prefix, chart["name"]), "")]


def render_markdown(report, charts=None, chart_prefix=""):
    """The report as Markdown for a pull-request comment or a CI job summary. charts: report_charts(report),
    written beside the Markdown as <chart_prefix><name>.svg, which it links to (none: no charts)."""
    charts = charts or {}
    out = [_headline(report), ""]
    facts = []
    if report.get("revision"):
        facts.append("revision `%s`" % report["revision"][:12])
    if report.get("trigger"):
        facts.append("trigger %s" % report["trigger"])
    if report.get("started"):
        facts.append("%s → %s" % (report["started"], report.get("finished", "?")))
    if report.get("lock") and report["lock"].get("waited_s"):
        facts.append("waited %.0f s for the rollout lock" % report["lock"]["waited_s"])
    if facts:
        out += [" · ".join(facts), ""]
    if report["verdict"] == "refused":
        out += ["Nothing was changed: %s" % report["lock"]["msg"], ""]
        return "\n".join(out)

    out += ["| Host | Service | Release before | Release after | Result | Gate |", "|---|---|---|---|---|---|"]
    for row in report["hosts"]:
        services = row["services"] or [None]
        for service in services:
            if service is None:
                out.append("| %s | – | – | – | %s | – |" % (_cell(row["host"]), _cell(row["status"])))
                continue
            after = service["after_release_id"]
            if report["kind"] == "plan" and (service.get("release_choice") or row["release"]):
                after = (service.get("release_choice") or row["release"])["release_id"]
            after_cell = _code(after) + (" (%s)" % _choice_word(service) if _choice_word(service) else "")
            out.append(
                "| %s | %s | %s | %s | %s | %s |"
                % (
                    _cell(row["host"]),
                    _cell(service["name"]),
                    _code(service["before_release_id"]),
                    after_cell,
                    _cell(row["status"]),
                    _cell(_gate_cell(service["gate"]) if report["kind"] != "plan" else "–"),
                )
            )
    out.append("")
    out += _chart_links(charts.get("before_after") or [], chart_prefix)

    recoveries = _service_items(report, "recovery")
    if recoveries and report["kind"] != "plan":
        out += ["After an interrupted rollout:", ""]
        out += ["- %s · %s: %s." % (host, name, recovery["note"]) for host, name, recovery in recoveries]
        out.append("")

    for row in report["hosts"]:
        for service in row["services"]:
            rollback = service["rollback"]
            if not rollback:
                continue
            evidence = rollback.get("evidence") or {}
            out += [
                "### %s · %s: %s"
                % (
                    row["host"],
                    service["name"],
                    "rolled back" if rollback.get("rolled_back_to_release_id") else "gate failed, not rolled back",
                ),
                "",
            ]
            message = evidence.get("msg", "").strip()
            # The gate's message starts with "<unit> failed at <stage> (<kind>): ", said already here.
            if " failed at %s (" % evidence.get("stage") in message.split(": ", 1)[0]:
                message = message.split(": ", 1)[1]
            out.append(
                "Release %s failed %s at **%s** (%s): %s"
                % (
                    _code(rollback.get("failed_release_id") or evidence.get("release_id")),
                    {"bake": "the bake's re-check", "shadow": "the comparison with its production service"}.get(
                        evidence.get("during"), "the health gate"
                    ),
                    evidence.get("stage"),
                    evidence.get("failure_kind") or "?",
                    message,
                )
            )
            out.append("")
            if rollback.get("rolled_back_to_release_id"):
                back = rollback.get("gate") or {}
                out.append(
                    "Rolled back to %s; its gate %s."
                    % (
                        _code(rollback["rolled_back_to_release_id"]),
                        "passed"
                        if back.get("passed")
                        else "FAILED at %s: %s" % (back.get("stage"), back.get("msg", ""))
                        if back
                        else "was not run",
                    )
                )
                out.append("")
            todo = [line for line in failure_lines(row, service) if line.startswith("  what to do: ")]
            if todo:
                out += ["**What to do:** %s." % todo[0][len("  what to do: ") :], ""]
            if evidence.get("signature_matches"):
                out += ["Journal lines that decided it:", "", _fence(evidence["signature_matches"]), ""]
            if evidence.get("journal_excerpt"):
                out += [
                    "<details><summary>Journal excerpt (last %d lines)</summary>" % len(evidence["journal_excerpt"]),
                    "",
                    _fence(evidence["journal_excerpt"]),
                    "",
                    "</details>",
                    "",
                ]

    notes = [
        (row["host"], service["name"], service["gate"]["baseline_note"])
        for row in report["hosts"]
        for service in row["services"]
        if service["gate"] and service["gate"].get("baseline_note")
    ]
    if notes:
        out += ["Baselines:", ""] + ["- %s · %s: %s." % note for note in notes] + [""]

    failures = [row for row in report["hosts"] if row["failure"] and not any(s["rollback"] for s in row["services"])]
    if failures:
        out += ["### Failures", ""]
        for row in failures:
            out.append("- **%s** at *%s*: %s" % (row["host"], row["failure"]["task"], _cell(row["failure"]["msg"])))
        out.append("")
    if report.get("stopped"):
        out += ["**Stopped:** %s" % _cell(report["stopped"]), ""]
    if report.get("paused"):
        out += ["### Paused", "", _cell(report["paused"]), ""]
        if resume_command(report):
            out += [
                "Resume (the same run again; under AWX, relaunch the job):",
                "",
                _fence([resume_command(report)]),
                "",
            ]
    bakes = _service_items(report, "bake")
    bakes += [
        (row["host"], None, {"verdict": "inconclusive", "stage": None, "reason": row["inconclusive"]})
        for row in report["hosts"]
        if row.get("inconclusive")
    ]
    out += _table(
        "Bake re-checks",
        "Host | Service | Result | Stage | Why",
        [
            (host, name, bake["verdict"], bake["stage"], bake["reason"] if bake["verdict"] != "passed" else "")
            for host, name, bake in bakes
        ],
    )
    out += _table(
        "Shadows",
        "Host | Service | Shadow | Candidate | Result | Shadow vs production | Outputs compared | Why",
        [_shadow_row(*item) for item in _service_items(report, "shadow")],
    )
    tunings = _service_items(report, "tuning")
    out += _table(
        "Tuning", "Host | Service | Tuning | Runs | Gain over DFLASH | Why", [_tuning_row(*item) for item in tunings]
    )
    if tunings:
        out += _chart_links(charts.get("tuning") or [], chart_prefix)
    not_reached = [row["host"] for row in report["hosts"] if row["status"] == "not reached"]
    if not_reached:
        out += [
            "Not reached (the rollout stopped before them; they keep the release they had): %s"
            % ", ".join(not_reached),
            "",
        ]

    gates = [
        (row["host"], service["name"], label, gate)
        for row in report["hosts"]
        for service in row["services"]
        for label, gate in (("deploy", service["gate"]), ("after rollback", (service["rollback"] or {}).get("gate")))
        if gate
    ]
    out += _table(
        "Health gates",
        "Host | Service | Gate | Release | Result | Time to port | /health | Chat | Baseline | Tokens/s (prev) | "
        "Accept length (prev) | Total",
        [_gate_row(*item) for item in gates],
    )

    if report["kind"] == "plan":
        budget, left_out = PLAN_DIFF_BUDGET, 0
        for row in report["hosts"]:
            if not row["changes"]:
                continue
            out += ["<details><summary>%s: %d change(s)</summary>" % (row["host"], len(row["changes"])), ""]
            for change in row["changes"]:
                out.append("- %s%s" % (change["task"], " (%s)" % change["item"] if change["item"] else ""))
                if change["diff"] and len(change["diff"]) <= budget:
                    budget -= len(change["diff"])
                    out += ["", _fence(change["diff"].rstrip("\n").splitlines()), ""]
                elif change["diff"]:
                    left_out += 1
            out += ["", "</details>", ""]
        if left_out:
            out += ["%d diff(s) left out to keep this short: plan.json has every one." % left_out, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _pair(current, previous, digits=1):
    if current is None:
        return None
    text = _number(current, digits=digits)
    return "%s (%s)" % (text, _number(previous, digits=digits)) if previous is not None else text


# What to look at first, by the gate's failure kind (the message says the rest).
FIX_HINTS = {
    "baseline_mismatch": "greedy outputs changed, and speculative decoding must not change them: the release is lossy, "
    'or the arithmetic changed on purpose (docs/health-gate.md, "The baseline policy")',
    "degenerate": "the model's output is degenerate: the release breaks decoding",
    "performance": "slower than the floors or the previous release allow",
    "bad_flag": "a launch flag was rejected: the service's flags or the release's flag declarations",
}
MESSAGE_CHARS = 600
# The rollback's task that points current back at previous (roles/sglang_service/tasks/rollback.yml).
ROLLBACK_LINK_TASK = "Point current back at the previous release"


def _gate_reason(evidence):
    """The gate's message without its "<unit> failed at <stage> (<kind>): " head, which the line says already."""
    message = (evidence.get("msg") or "").strip()
    head, separator, rest = message.partition(": ")
    if " failed at " in head and separator:
        message = rest
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + " ..."


def failure_lines(row, service):
    """For a service whose gate failed: what failed and why, what the run did, what to do - the lines that
    follow its summary line, so that a failed run reads from the top."""
    rollback = service.get("rollback") or {}
    evidence = rollback.get("evidence") or {}
    if not evidence:
        return []
    failed = _short(rollback.get("failed_release_id") or evidence.get("release_id")) or "?"
    during = {"bake": "the bake's re-check", "shadow": "the comparison with its production service"}.get(
        evidence.get("during"), "the health gate"
    )
    lines = [
        "  why: release %s failed %s at %s (%s): %s"
        % (failed, during, evidence.get("stage"), evidence.get("failure_kind") or "?", _gate_reason(evidence))
    ]
    back = rollback.get("rolled_back_to_release_id")
    if back:
        gate = rollback.get("gate") or {}
        lines.append(
            "  done: stopped %s, pointed %s back at %s and started it; its gate %s"
            % (
                failed,
                service["name"],
                _short(back),
                "passed" if gate.get("passed") else ("FAILED at %s" % gate.get("stage") if gate else "was not run"),
            )
        )
        todo = "%s serves %s as before. Fix the cause in %s's source, then run the same command again" % (
            service["name"],
            _short(back),
            failed,
        )
    else:
        failure = row.get("failure") or {}
        cause = failure.get("msg") or "the run stopped before a rollback"
        # The rollback stops the failed release before it looks for the previous one (rollback.yml).
        stopped = "stopped %s; " % failed if ROLLBACK_LINK_TASK in str(failure.get("task") or "") else ""
        lines.append("  done: %snot rolled back - %s" % (stopped, cause))
        todo = (
            "%s has no release that passed its gate here. Fix the cause, then run the same command again"
            % service["name"]
        )
    hint = FIX_HINTS.get(evidence.get("failure_kind"))
    lines.append(
        "  what to do: %s%s. The journal excerpt is in the report%s"
        % (todo, " (%s)" % hint if hint else "", " and in the service's history.jsonl on the host" if back else "")
    )
    return lines


def summary_lines(report):
    """Short lines for the terminal at the end of a run: (text, is_bad)."""
    lines = []
    if report["verdict"] == "refused":
        return [(report["lock"]["msg"], True)]
    for row in report["hosts"]:
        bad = row["status"] in ("rolled back", "failed", "unreachable", "plan failed", "inconclusive")
        if not row["services"]:
            detail = row["failure"]["msg"] if row["failure"] else "keeps the release it had"
            lines.append(("%s: %s - %s" % (row["host"], row["status"], detail), bad))
        for service in row["services"]:
            text = "%s %s: %s, release %s -> %s" % (
                row["host"],
                service["name"],
                row["status"],
                _short(service["before_release_id"]) or "none",
                _short(service["after_release_id"]) or "none",
            )
            if service.get("release_choice"):
                text += " (%s)" % service["release_choice"]["reason"]
            if service["gate"]:
                text += ", gate " + _gate_cell(service["gate"])
                if service["gate"].get("baseline_reference") == "fleet" and service["gate"]["passed"]:
                    text += " (outputs compared with the fleet's baseline: this host had none)"
            if service.get("tuning"):
                text += ", " + tuning_text(service["tuning"])
            if service.get("shadow"):
                comparison = service["shadow"]
                text += ", shadow %s: %s (%s)%s" % (
                    comparison["shadow_service"],
                    comparison["verdict"],
                    shadow_numbers(comparison),
                    ": " + "; ".join(comparison["problems"]) if comparison["problems"] else "",
                )
            if service["rollback"] and service["rollback"].get("rolled_back_to_release_id"):
                text += ", rolled back to %s" % _short(service["rollback"]["rolled_back_to_release_id"])
            if service.get("recovery") and report["kind"] != "plan":
                text += " (%s)" % service["recovery"]["note"]
            lines.append((text, bad))
            lines += [(line, True) for line in failure_lines(row, service)]
            if service["gate"] and service["gate"].get("baseline_note"):
                lines.append(("%s %s: %s" % (row["host"], service["name"], service["gate"]["baseline_note"]), False))
        if row["failure"] and row["services"] and not any(s["rollback"] for s in row["services"]):
            lines.append(("%s: failed at %s: %s" % (row["host"], row["failure"]["task"], row["failure"]["msg"]), True))
    if report.get("stopped"):
        lines.append(("STOPPED: %s" % report["stopped"], True))
    if report.get("paused"):
        lines.append(
            (report["paused"] if report["paused"].startswith("PAUSED") else "PAUSED: %s" % report["paused"], True)
        )
        if resume_command(report):
            lines.append(("resume: %s" % resume_command(report), True))
    return lines
