# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rollout reports as text: the Markdown for a pull request or CI job (render_markdown), its charts
(report_charts), and the terminal summary (summary_lines), each a plain function of build_report's report
(rollout_report.py), each section a function of its own."""

from __future__ import annotations

from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_report_words import (
    ROLLBACK_LINK_TASK,
    _choice_word,
    _number,
    _percent,
    _short,
    shadow_numbers,
    tuning_text,
)
from ansible_collections.ddtree.sglang.plugins.plugin_utils.svg_chart import grouped_bars

# Diffs in a plan's Markdown stop here (a GitHub comment holds 65536 characters); plan.json has them all.
PLAN_DIFF_BUDGET = 40000


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
    written beside the Markdown as <chart_prefix><name>.svg, which it links to (none: no charts). Each section is
    a function of its own (_md_*), in the order they appear."""
    charts = charts or {}
    out = [_headline(report), ""] + _md_facts(report)
    if report["verdict"] == "refused":
        out += ["Nothing was changed: %s" % report["lock"]["msg"], ""]
        return "\n".join(out)
    out += _md_hosts(report) + _chart_links(charts.get("before_after") or [], chart_prefix)
    out += _md_recoveries(report)
    for row in report["hosts"]:
        for service in row["services"]:
            if service["rollback"]:
                out += _md_rollback(row, service)
    out += _md_baseline_notes(report) + _md_failures(report) + _md_stopped_or_paused(report) + _md_bakes(report)
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
    out += _md_not_reached(report) + _md_gates(report)
    if report["kind"] == "plan":
        out += _md_plan_diffs(report)
    return "\n".join(out).rstrip("\n") + "\n"


def _md_facts(report):
    """The line under the headline: revision, trigger, when, the lock's wait."""
    facts = []
    if report.get("revision"):
        facts.append("revision `%s`" % report["revision"][:12])
    if report.get("trigger"):
        facts.append("trigger %s" % report["trigger"])
    if report.get("started"):
        facts.append("%s → %s" % (report["started"], report.get("finished", "?")))
    if report.get("lock") and report["lock"].get("waited_s"):
        facts.append("waited %.0f s for the rollout lock" % report["lock"]["waited_s"])
    return [" · ".join(facts), ""] if facts else []


def _md_hosts(report):
    """The table of every host and service: release before and after, result, gate."""
    out = ["| Host | Service | Release before | Release after | Result | Gate |", "|---|---|---|---|---|---|"]
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
    return out


def _md_recoveries(report):
    recoveries = _service_items(report, "recovery")
    if not recoveries or report["kind"] == "plan":
        return []
    out = ["After an interrupted rollout:", ""]
    out += ["- %s · %s: %s." % (host, name, recovery["note"]) for host, name, recovery in recoveries]
    return out + [""]


def _md_rollback(row, service):
    """A service whose gate failed: what failed and where, where it went back to, what to do, the journal."""
    rollback = service["rollback"]
    evidence = rollback.get("evidence") or {}
    out = [
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
    return out + _md_rollback_evidence(row, service, evidence)


def _md_rollback_evidence(row, service, evidence):
    out = []
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
    return out


def _md_baseline_notes(report):
    notes = [
        (row["host"], service["name"], service["gate"]["baseline_note"])
        for row in report["hosts"]
        for service in row["services"]
        if service["gate"] and service["gate"].get("baseline_note")
    ]
    return ["Baselines:", ""] + ["- %s · %s: %s." % note for note in notes] + [""] if notes else []


def _md_failures(report):
    """Hosts that failed other than by a gate (a rolled-back service has its own section)."""
    failures = [row for row in report["hosts"] if row["failure"] and not any(s["rollback"] for s in row["services"])]
    if not failures:
        return []
    out = ["### Failures", ""]
    for row in failures:
        out.append("- **%s** at *%s*: %s" % (row["host"], row["failure"]["task"], _cell(row["failure"]["msg"])))
    return out + [""]


def _md_stopped_or_paused(report):
    out = []
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
    return out


def _md_bakes(report):
    bakes = _service_items(report, "bake")
    bakes += [
        (row["host"], None, {"verdict": "inconclusive", "stage": None, "reason": row["inconclusive"]})
        for row in report["hosts"]
        if row.get("inconclusive")
    ]
    return _table(
        "Bake re-checks",
        "Host | Service | Result | Stage | Why",
        [
            (host, name, bake["verdict"], bake["stage"], bake["reason"] if bake["verdict"] != "passed" else "")
            for host, name, bake in bakes
        ],
    )


def _md_not_reached(report):
    not_reached = [row["host"] for row in report["hosts"] if row["status"] == "not reached"]
    if not not_reached:
        return []
    return [
        "Not reached (the rollout stopped before them; they keep the release they had): %s" % ", ".join(not_reached),
        "",
    ]


def _md_gates(report):
    gates = [
        (row["host"], service["name"], label, gate)
        for row in report["hosts"]
        for service in row["services"]
        for label, gate in (("deploy", service["gate"]), ("after rollback", (service["rollback"] or {}).get("gate")))
        if gate
    ]
    return _table(
        "Health gates",
        "Host | Service | Gate | Release | Result | Time to port | /health | Chat | Baseline | Tokens/s (prev) | "
        "Accept length (prev) | Total",
        [_gate_row(*item) for item in gates],
    )


def _md_plan_diffs(report):
    """A plan's changes per host, with their diffs up to PLAN_DIFF_BUDGET characters in all."""
    out = []
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
    return out


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
