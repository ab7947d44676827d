# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The guard after a rollout: is a DDTREE service still worth running, and if not, what does it fall back to.

A service's `guard` settings are declared once here (GUARD_SETTINGS); services.SERVICE_FIELDS takes their
spec from settings_spec(). The guard (ddtree.sglang.sglang_guard, playbooks/watch.yml, docs/guard.md) watches
a service over a window - a short probe of greedy /generate requests, /server_info and /metrics - and
decide() says what to do with what it saw:

- ``switch``: DDTREE's per-request tokens/s fell below DFLASH's recorded numbers for this host and load by
  more than the margin, or its acceptance length collapsed against the release's own recorded one;
- ``hold``: it would switch, but the service switched less than hold_down seconds ago;
- ``keep``: the service is healthy, or it already runs its fallback (the guard never switches back: a
  rollout does, through the gate);
- ``unknown``: the guard could not read the live numbers; it changes nothing and says so.

Plain functions over data: the module reads the host, these decide, the playbook acts.
"""

from __future__ import annotations

import re
import time

from ansible_collections.ddtree.sglang.plugins.module_utils.schema import argument_spec, option, without
from ansible_collections.ddtree.sglang.plugins.module_utils.service_nodes import spans_nodes

GUARD_STATE_FORMAT = 1
FALLBACKS = ("dflash",)
# A service's `guard` settings, declared once (type, default, doc line).
GUARD_SETTINGS = {
    "enabled": option("bool", "Watch this DDTREE service after rollouts (playbooks/watch.yml)", default=True),
    "window": option("float", "Seconds one watch spans: the probe's requests are spread over it", default=60.0),
    "probe_requests": option("int", "Greedy /generate requests of the probe (the prompts of autotune)", default=4),
    "max_tokens": option("int", "max_new_tokens of each probe request", default=64, no_log=False),
    "margin": option(
        "float", "Switch when tokens/s falls below (1 - margin) x DFLASH's recorded tokens/s at this load", default=0.05
    ),
    "collapse_ratio": option(
        "float", "Switch when acceptance falls below this share of the release's recorded acceptance", default=0.5
    ),
    "hold_down": option("float", "Seconds after a switch during which the guard changes nothing", default=3600.0),
    "fallback": option(
        "str", "What a switch runs: dflash (DFLASH, the base release)", default="dflash", choices=list(FALLBACKS)
    ),
}
ACTIONS = ("switch", "hold", "keep", "unknown")


def settings_declarations() -> dict:
    """A service's `guard` fields: their types only (guard_settings fills the defaults, so a service that sets
    none has the same plan entry as before; guard_problems checks the values, choices included)."""
    return without(GUARD_SETTINGS, "default", "choices")


def settings_spec() -> dict:
    """The `guard` sub-options of a service, as ansible-core takes them (settings_declarations)."""
    return argument_spec(settings_declarations())


def guard_settings(service: dict) -> dict:
    """A service's guard settings with the declared defaults filled in."""
    declared = dict((service or {}).get("guard") or {})
    # None is unset: ansible-core fills every sub-option a service did not give with None.
    return {
        name: spec.get("default") if declared.get(name) is None else declared[name]
        for name, spec in GUARD_SETTINGS.items()
    }


def guard_problems(service: dict, label: str) -> list:
    """What is wrong with a service's `guard` settings, each naming the field, the value and the fix."""
    settings = guard_settings(service)
    problems = []
    for name in ("window", "hold_down"):
        if settings[name] is None or settings[name] < 0:
            problems.append("%s: guard.%s is %r; it must be a number of seconds >= 0" % (label, name, settings[name]))
    if settings["probe_requests"] is None or settings["probe_requests"] < 1:
        problems.append("%s: guard.probe_requests is %r; it must be >= 1" % (label, settings["probe_requests"]))
    if settings["fallback"] not in FALLBACKS:
        problems.append(
            "%s: guard.fallback is %r; it must be one of %s" % (label, settings["fallback"], ", ".join(FALLBACKS))
        )
    for name in ("margin", "collapse_ratio"):
        value = settings[name]
        if value is None or not 0 <= value < 1:
            problems.append(
                "%s: guard.%s is %r; it must be a number from 0 up to, not including, 1" % (label, name, value)
            )
    return problems


def watched(service: dict) -> bool:
    """Whether the guard watches a service: a DDTREE service (declared or tuned) with the guard enabled, on one
    host. A service across hosts switches on all its nodes at once, which a rollout does and one host's guard
    cannot (docs/guard.md)."""
    speculative = (service or {}).get("speculative") or {}
    if spans_nodes(service or {}):
        return False
    return str(speculative.get("algorithm", "NONE")).upper() == "DDTREE" and bool(guard_settings(service)["enabled"])


# ---- what was recorded ---------------------------------------------------------------------------------


def dflash_reference(autotune_state: dict | None, load: int) -> dict | None:
    """DFLASH's recorded numbers on this host for a load (requests in flight), from autotune.json.

    The measurement at the largest declared concurrency <= load (else the smallest declared one), per
    request: autotune's tokens/s is all requests' tokens over the wall time, so one request's share is
    tokens/s / concurrency. -> {"concurrency", "tokens_per_second" (per request), "accept_length",
    "release_id", "tuned_at"} or None when nothing was recorded.
    """
    current = (autotune_state or {}).get("current") or {}
    rows = [
        row
        for row in current.get("measurements") or []
        if str(row.get("algorithm", "")).upper() == "DFLASH" and not row.get("error") and row.get("tokens_per_second")
    ]
    if not rows:
        return None
    levels = sorted({int(row.get("concurrency") or 1) for row in rows})
    fitting = [level for level in levels if level <= max(load, 1)]
    level = fitting[-1] if fitting else levels[0]
    row = [row for row in rows if int(row.get("concurrency") or 1) == level][-1]
    return {
        "concurrency": level,
        "tokens_per_second": round(float(row["tokens_per_second"]) / level, 3),
        "accept_length": row.get("accept_length"),
        "release_id": current.get("release_id"),
        "tuned_at": current.get("tuned_at"),
    }


def release_reference(metrics_document: dict | None, release_id: str | None) -> dict | None:
    """The gate's last recorded numbers for this release (metrics.json), or None."""
    for record in reversed((metrics_document or {}).get("records") or []):
        if release_id and record.get("release_id") == release_id and record.get("accept_length"):
            return {
                "tokens_per_second": record.get("tokens_per_second"),
                "accept_length": record.get("accept_length"),
                "release_id": record.get("release_id"),
                "recorded_at": record.get("recorded_at"),
            }
    return None


# ---- what is live ----------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def parse_metrics(text: str | None) -> dict:
    """Prometheus text exposition -> {metric name: value} (the sum over a name's label sets; histograms'
    buckets are skipped). Only what the guard reads is needed: gauges and counters."""
    values = {}
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match or match.group("name").endswith("_bucket"):
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        values[match.group("name")] = values.get(match.group("name"), 0.0) + value
    return values


def summarize_probe(replies: list) -> dict:
    """The probe's greedy /generate replies ({"completion_tokens", "seconds", "accept_length", "error"}) ->
    {"requests", "failed", "tokens_per_second" (per request: all tokens over all requests' seconds),
    "accept_length" (all tokens over all verify steps where given, else the mean of the requests'), "errors"}."""
    good = [reply for reply in replies if not reply.get("error") and reply.get("completion_tokens")]
    tokens = sum(reply["completion_tokens"] for reply in good)
    seconds = sum(reply.get("seconds") or 0 for reply in good)
    steps = [reply.get("verify_steps") for reply in good]
    accepts = [reply["accept_length"] for reply in good if isinstance(reply.get("accept_length"), (int, float))]
    if good and all(isinstance(step, int) and step > 0 for step in steps):
        accept = round(tokens / sum(steps), 3)
    else:
        accept = round(sum(accepts) / len(accepts), 3) if accepts else None
    return {
        "requests": len(replies),
        "failed": len(replies) - len(good),
        "tokens_per_second": round(tokens / seconds, 3) if good and seconds > 0 else None,
        "accept_length": accept,
        "errors": [reply["error"] for reply in replies if reply.get("error")][:3],
    }


def unit_algorithm(exec_start: str | None) -> str | None:
    """The speculative algorithm a unit runs, from `systemctl show -p ExecStart --value` (its argv): the value of
    --speculative-algorithm (NONE without it), or None when the unit has no ExecStart.

    /server_info cannot tell: the overlay resolves DDTREE as DFLASH inside SGLang (DFLASH's setup, the DDTree
    worker), so SGLang's record says DFLASH for both; the unit's flags are what the role rendered.
    """
    words = (exec_start or "").replace(";", " ").split()
    if not words:
        return None
    for index, word in enumerate(words):
        if word.startswith("--speculative-algorithm="):
            return word.split("=", 1)[1].upper()
        if word == "--speculative-algorithm" and index + 1 < len(words):
            return words[index + 1].upper()
    return "NONE"


def live_numbers(
    server_info: dict | None, metrics: dict | None, probe: dict | None, algorithm: str | None = None
) -> dict:
    """What the service runs and how fast, from /server_info's answer, /metrics (parse_metrics) and the probe;
    algorithm: what the unit runs (unit_algorithm), else /server_info's.

    The acceptance length is the probe's (this window's own requests) when it has one, else /metrics'
    sglang:spec_accept_length (SGLang's last logged window), else /server_info's average since the start.
    """
    info = server_info if isinstance(server_info, dict) else {}
    internal = (info.get("internal_states") or [{}])[0] if isinstance(info.get("internal_states"), list) else {}
    metrics = metrics or {}
    probe = probe or {}
    # What the unit runs (unit_algorithm) when known; /server_info's record says DFLASH for DDTREE too.
    if algorithm is None and info:
        algorithm = str(info.get("speculative_algorithm") or "NONE").upper()
    sources = (
        ("probe", probe.get("accept_length")),
        ("metrics", metrics.get("sglang:spec_accept_length")),
        ("server_info", (internal or {}).get("avg_spec_accept_length")),
    )
    source, accept = next(((name, value) for name, value in sources if value), (None, None))
    running = metrics.get("sglang:num_running_reqs")
    return {
        "algorithm": algorithm,
        "tokens_per_second": probe.get("tokens_per_second"),
        "accept_length": accept,
        "accept_length_source": source,
        "server_info_accept_length": (internal or {}).get("avg_spec_accept_length"),
        "metrics_accept_length": metrics.get("sglang:spec_accept_length"),
        "gen_throughput": metrics.get("sglang:gen_throughput"),
        "running_requests": running,
        # The load the probe ran under: the requests the server was running besides it, and the probe's own.
        "load": int(running or 0) + 1,
    }


# ---- the decision ----------------------------------------------------------------------------------------


def _speed_problems(settings: dict, live: dict, dflash: dict | None) -> list:
    """tokens/s per request below DFLASH's recorded at this load, less the margin."""
    speed = live.get("tokens_per_second")
    if not (dflash and speed is not None and dflash.get("tokens_per_second")):
        return []
    floor = dflash["tokens_per_second"] * (1 - settings["margin"])
    if not speed < floor:
        return []
    return [
        "tokens/s %.1f per request is below DFLASH's %.1f recorded on this host at concurrency %d (load %d) "
        "less the margin %.0f%% (%.1f)"
        % (speed, dflash["tokens_per_second"], dflash["concurrency"], live["load"], settings["margin"] * 100, floor)
    ]


def _accept_problems(settings: dict, live: dict, dflash: dict | None, release: dict | None) -> list:
    """The acceptance length collapsed below collapse_ratio of the release's recorded one (else DFLASH's tuning's)."""
    accept = live.get("accept_length")
    recorded_accept = (release or {}).get("accept_length") or (dflash or {}).get("accept_length")
    if accept is None or not recorded_accept:
        return []
    floor = recorded_accept * settings["collapse_ratio"]
    if not accept < floor:
        return []
    whose = "this release's gate" if (release or {}).get("accept_length") else "DFLASH's tuning"
    return [
        "acceptance length %.2f (%s) collapsed below %.0f%% of the %.2f %s recorded (%.2f)"
        % (accept, live.get("accept_length_source"), settings["collapse_ratio"] * 100, recorded_accept, whose, floor)
    ]


def decide(
    settings: dict,
    live: dict | None,
    dflash: dict | None,
    release: dict | None,
    state: dict | None,
    now: float,
    unreachable: str | None = None,
) -> dict:
    """What the guard does about a service now. -> {"action", "reasons": [...], "hold_until": epoch or None}.

    settings: guard_settings(); live: live_numbers() (None with `unreachable`: why it could not be read);
    dflash: dflash_reference(); release: release_reference(); state: the service's guard.json; now: epoch s.
    """
    if unreachable or not live:
        return {
            "action": "unknown",
            "reasons": ["the live numbers could not be read (%s); nothing changes" % (unreachable or "no answer")],
            "hold_until": None,
        }
    if live.get("algorithm") != "DDTREE":
        fallback = (state or {}).get("fallback") or {}
        why = " (the guard switched it at %s: %s)" % (fallback.get("at"), fallback.get("reason")) if fallback else ""
        return {
            "action": "keep",
            "reasons": [
                "the service runs %s, not DDTREE%s; the guard never switches back" % (live.get("algorithm"), why)
            ],
            "hold_until": None,
        }
    speed, accept = live.get("tokens_per_second"), live.get("accept_length")
    recorded_accept = (release or {}).get("accept_length") or (dflash or {}).get("accept_length")
    problems = _speed_problems(settings, live, dflash) + _accept_problems(settings, live, dflash, release)
    if speed is None and accept is None:
        return {
            "action": "unknown",
            "reasons": ["the probe measured neither tokens/s nor an acceptance length; nothing changes"],
            "hold_until": None,
        }
    if not problems:
        held = (
            []
            if dflash or recorded_accept
            else ["nothing recorded to compare with (no autotune.json, no gate metrics)"]
        )
        return {"action": "keep", "reasons": ["DDTREE holds up"] + held, "hold_until": None}
    last = ((state or {}).get("last_switch") or {}).get("epoch")
    if last is not None and now - last < settings["hold_down"]:
        until = last + settings["hold_down"]
        return {
            "action": "hold",
            "reasons": problems
            + ["held down: the guard switched this service at %s; no switch before %s" % (_stamp(last), _stamp(until))],
            "hold_until": until,
        }
    return {"action": "switch", "reasons": problems, "hold_until": now + settings["hold_down"]}


def declared_speculative(service: dict) -> dict:
    """The service's declared speculative settings as the guard records and compares them (unset keys dropped)."""
    return {key: value for key, value in ((service or {}).get("speculative") or {}).items() if value is not None}


def fallback_holds(state: dict | None, service: dict, path: str = "guard.json") -> str | None:
    """Why a rollout runs the service's fallback instead of its declaration, or None (it runs as declared).

    A guard's switch holds across rollouts while the service's speculative settings are those it switched away
    from: a rollout of the same declaration would bring back the DDTREE that no longer paid, and the guard's
    hold-down would then leave it running. A changed declaration (another budget, a schedule, autotune) is
    DDTREE worth trying again, under the guard's watch; removing the guard's record (path) does the same.
    """
    fallback = (state or {}).get("fallback") or {}
    if not fallback or not watched(service):
        return None
    switched_from = (fallback.get("from") or {}).get("speculative")
    if switched_from is not None and switched_from != declared_speculative(service):
        return None
    return (
        "the guard switched it to DFLASH at %s (%s); it stays on DFLASH until its speculative settings change "
        "or %s is removed"
        % (
            fallback.get("at") or "?",
            fallback.get("reason") or "no reason recorded",
            path,
        )
    )


def fallback_service(service: dict) -> dict:
    """The service as its fallback runs it: DFLASH (no DDTREE flags, no tuning, no pin: DFLASH runs the stack's
    base release, docs/services.md), everything else as declared."""
    return dict(service, speculative={"algorithm": "DFLASH"}, release="candidate")


def fallback_services(services: list, switched: list) -> list:
    """sglang_services with each service named in `switched` replaced by its fallback (fallback_service)."""
    names = set(switched or [])
    return [fallback_service(service) if service.get("name") in names else service for service in services or []]


def guard_state(
    previous: dict | None,
    decision: dict,
    live: dict,
    now: float,
    release_id: str | None,
    speculative: dict | None = None,
) -> dict:
    """guard.json after a switch: the switch's time (the hold-down counts from it), from what (the algorithm, the
    release and the declared speculative settings, which fallback_holds compares), to what, why."""
    fallback = {
        "at": _stamp(now),
        "epoch": now,
        "from": {"algorithm": live.get("algorithm"), "release_id": release_id, "speculative": speculative},
        "to": {"algorithm": "DFLASH"},
        "reason": "; ".join(decision["reasons"]),
    }
    switches = list((previous or {}).get("switches") or [])[-19:] + [fallback]
    return {"format": GUARD_STATE_FORMAT, "last_switch": fallback, "fallback": fallback, "switches": switches}


def history_record(
    service: str, decision: dict, live: dict, references: dict, release_id: str | None, now: float
) -> dict:
    """The line the watch playbook appends to the service's history.jsonl when the guard switches it."""
    return {
        "event": "guard",
        "service": service,
        "at": _stamp(now),
        "action": decision["action"],
        "from": {"algorithm": live.get("algorithm"), "release_id": release_id},
        "to": {"algorithm": "DFLASH"},
        "reasons": decision["reasons"],
        "live": live,
        "recorded": references,
    }


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
