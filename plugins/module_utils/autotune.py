# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""DDTREE's budget and top-k tuned per host and model, with DFLASH as the fallback: the declaration,
the grid it spans, the key that says when to tune again, the choice, and what the choice becomes.

A service declares `speculative: {algorithm: DDTREE, autotune: {budgets, top_k, concurrency, min_gain}}`.
For a candidate release, DFLASH and every DDTREE (budget, top_k) of the grid are measured at every
declared concurrency (tokens/s, all requests together); a DDTREE setting is chosen only when it beats
DFLASH by min_gain at every declared concurrency, else the service runs DFLASH. A setting is one budget,
or a schedule of the budgets measured fastest at each declared concurrency (a budget per load, one top_k).
docs/autotune.md says why each rule is what it is. Plain functions, data in and data out: the module
(ddtree.sglang.service_autotune) reads and writes the state file.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math

from ansible_collections.ddtree.sglang.plugins.module_utils.ddtree_budget import parse_budget, schedule_from_levels
from ansible_collections.ddtree.sglang.plugins.module_utils.schema import option

# The declaration's fields and their defaults: `autotune: {}` measures verify windows from 8 to 128 tokens
# at one, 16 and 64 requests at a time, so the choice can be a schedule: a wide tree where the GPU has
# room at low load, a narrow one at high load, and the widths a model's own step cost allows (an MoE's
# experts read grow with the window). Budgets past the drafter's block widen the verify window; a
# setting the server cannot run fails its measurement and is never chosen.
DEFAULTS = {"budgets": [7, 15, 31, 63, 127], "top_k": [8], "concurrency": [1, 16, 64], "min_gain": 0.03}
# Where the settings are measured: a temporary instance of the service on spare GPUs of the host
# (`gpus`, as many as the service's own) and a port of its own, or, with `own_gpus: true`, on the
# service's own GPUs and port while the service is stopped in the host's rollout window. Not part of the
# grid or the tuning key: which GPUs of a host is not what the speed depends on (the key is per host; its
# GPUs are one model).
TRIAL_FIELDS = ("gpus", "port", "own_gpus")
# `speculative.autotune`'s fields, declared once (services.SPECULATIVE_FIELDS holds them; autotune_problems checks
# what needs more than a type: distinct values, the grid's size, where it measures).
AUTOTUNE_FIELDS = {
    "budgets": option("list", "DDTREE budgets to measure, distinct integers >= 1", elements="int"),
    "top_k": option("list", "DDTREE top-k values to measure, distinct integers >= 1", elements="int"),
    "concurrency": option("list", "Requests at a time each setting is measured with", elements="int"),
    "min_gain": option("float", "Share DDTREE must beat DFLASH by at every concurrency, in [0, 1)"),
    "gpus": option("list", "Spare GPUs the temporary instances run on (as many as the service's)", elements="int"),
    "port": option("int", "The temporary instances' port (1-65535, autotune_problems)"),
    "own_gpus": option("bool", "Measure on the service's own GPUs and port, stopped in the host's rollout window"),
}
FIELDS = tuple(AUTOTUNE_FIELDS)
# The temporary instance's name: the service's, with this suffix (its unit sglang-<name>-autotune.service).
TRIAL_SUFFIX = "-autotune"
# Each DDTREE setting is a server start plus a measurement (minutes on a GPU host): a grid larger than
# this is more likely a typo than a plan.
MAX_SETTINGS = 16
# The algorithms a measurement may be of; NONE only for the report (the gain over no speculation).
MEASURED_ALGORITHMS = ("DFLASH", "DDTREE", "NONE")
# Bump when the way settings are measured or compared changes: every service is tuned again.
KEY_FORMAT = 1
STATE_FORMAT = 1
# Earlier tunings kept (their choices and keys, not their measurements) in the state file.
KEEP_HISTORY = 20
# The health gate's speed floor is the tuned tokens/s at one request at a time, less this share: the
# gate's prompts and lengths are not the tuning's, and runs on one host differ by a few percent.
DEFAULT_FLOOR_MARGIN = 0.2
# Float noise when comparing a gain with min_gain (103 vs 100 tokens/s is a gain of exactly 3%).
EPSILON = 1e-9


class IncompleteMeasurements(ValueError):
    """The measurements cannot decide: problems (a list of str) says what is missing or wrong."""

    def __init__(self, problems: list):
        super().__init__("; ".join(problems))
        self.problems = problems


# ---- the declaration -------------------------------------------------------------------------------


def _positive_int_list_problem(field: str, value, what: str, example: str) -> str | None:
    text = "speculative.autotune.%s is %r; it must be a non-empty list of distinct integers >= 1 (%s), e.g. %s" % (
        field,
        value,
        what,
        example,
    )
    if not isinstance(value, list) or not value:
        return text
    if any(not isinstance(item, int) or isinstance(item, bool) or item < 1 for item in value):
        return text
    twice = sorted({item for item in value if value.count(item) > 1})
    if twice:
        return "speculative.autotune.%s is %r and lists %s more than once; list each value once" % (
            field,
            value,
            ", ".join(str(item) for item in twice),
        )
    return None


def autotune_problems(spec: dict) -> list:
    """What is wrong with a service's `speculative.autotune` (each without the service's label: the
    caller, services._speculative_problems, puts it in front). [] when it is absent or right."""
    if spec.get("autotune") is None:
        return []
    own = spec["autotune"]
    algorithm = spec.get("algorithm", "NONE")
    if algorithm != "DDTREE":
        return [
            "speculative.autotune is set, but algorithm is %s; autotune chooses DDTREE's budget and top_k "
            "(falling back to DFLASH by itself): set algorithm DDTREE or remove autotune" % algorithm
        ]
    if not isinstance(own, dict):
        return [
            "speculative.autotune is %r; it must be a mapping of %s (e.g. autotune: {gpus: [2, 3], port: 30100} "
            "for the default grid)" % (own, ", ".join(FIELDS))
        ]
    problems = []
    unknown = sorted(set(own) - set(FIELDS))
    if unknown:
        problems.append(
            "speculative.autotune has unknown field(s) %s; its fields are %s"
            % (", ".join(repr(name) for name in unknown), ", ".join(FIELDS))
        )
    problems += _grid_problems(own) + _place_problems(own)
    # One place says which budget and top_k run: a fixed one beside the grid would be ignored silently.
    for fixed, field in (("budget", "budgets"), ("top_k", "top_k")):
        if spec.get(fixed) is not None:
            problems.append(
                "speculative.%s %r is fixed, but autotune chooses it: remove speculative.%s, or pin it "
                "in the grid with autotune.%s: [%s]" % (fixed, spec[fixed], fixed, field, spec[fixed])
            )
    if not problems:
        tuning = declaration(spec)
        settings = len(tuning["budgets"]) * len(tuning["top_k"])
        if settings > MAX_SETTINGS:
            problems.append(
                "speculative.autotune spans %d DDTREE settings (%d budgets x %d top_k), each a server start "
                "and a measurement; list at most %d"
                % (settings, len(tuning["budgets"]), len(tuning["top_k"]), MAX_SETTINGS)
            )
    return problems


def _grid_problems(own: dict) -> list:
    """What is wrong with the grid's fields: budgets, top_k, concurrency, min_gain."""
    problems = []
    for field, what, example in (
        ("budgets", "tree nodes besides the root", "[4, 8, 15]"),
        ("top_k", "candidates per draft position", "[4, 8]"),
        ("concurrency", "requests at a time to measure with", "[1, 16]"),
    ):
        if field in own:
            problem = _positive_int_list_problem(field, own[field], what, example)
            if problem:
                problems.append(problem)
    if "min_gain" in own:
        gain = own["min_gain"]
        if not isinstance(gain, (int, float)) or isinstance(gain, bool) or not 0 <= gain < 1:
            problems.append(
                "speculative.autotune.min_gain is %r; it must be a number from 0 up to, not including, 1 "
                "(0.03: DDTREE must be at least 3%% faster than DFLASH at every declared concurrency)" % (gain,)
            )
    return problems


def _place_problems(own: dict) -> list:
    """What is wrong with where the grid is measured: gpus and port, or own_gpus."""
    problems = []
    if own.get("gpus") is not None:
        gpus = own["gpus"]
        if (
            not isinstance(gpus, list)
            or not gpus
            or len(set(map(repr, gpus))) != len(gpus)
            or any(not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0 for gpu in gpus)
        ):
            problems.append(
                "speculative.autotune.gpus is %r; it must be a non-empty list of distinct GPU indices "
                "(spare GPUs the settings are measured on, as many as the service's gpus), e.g. [2, 3]" % (gpus,)
            )
    if own.get("port") is not None:
        port = own["port"]
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            problems.append(
                "speculative.autotune.port is %r; it must be a TCP port (1-65535) of its own for the "
                "temporary instances the settings are measured on, e.g. 30100" % (port,)
            )
    if own.get("own_gpus") is not None:
        if not isinstance(own["own_gpus"], bool):
            problems.append(
                "speculative.autotune.own_gpus is %r; it must be true (measure on the service's own GPUs "
                "and port, the service stopped while its grid runs) or false" % (own["own_gpus"],)
            )
        elif own["own_gpus"]:
            spare = ["%s %r" % (field, own[field]) for field in ("gpus", "port") if own.get(field) is not None]
            if spare:
                problems.append(
                    "speculative.autotune.own_gpus is true, but %s %s set; the settings are measured either "
                    "on spare GPUs (gpus and port) or on the service's own (own_gpus: true): remove one"
                    % (" and ".join(spare), "are" if len(spare) > 1 else "is")
                )
    return problems


def declared(service: dict) -> bool:
    """Whether the service asks for tuning."""
    return (service.get("speculative") or {}).get("autotune") is not None


def in_own_window(service: dict) -> bool:
    """Whether a tuned service is measured on its own GPUs and port, stopped in the host's rollout window
    (`own_gpus: true`), rather than on spare GPUs beside it."""
    return ((service.get("speculative") or {}).get("autotune") or {}).get("own_gpus") is True


def declaration(spec: dict) -> dict:
    """The valid `autotune` of a speculative mapping with the defaults filled in and every list sorted
    (so [15, 4] and [4, 15] are the same grid and the same tuning key)."""
    own = spec.get("autotune") or {}
    result = {}
    for field, default in DEFAULTS.items():
        value = own.get(field)
        value = default if value is None else value
        result[field] = sorted(value) if isinstance(value, list) else float(value)
    return result


# ---- the grid --------------------------------------------------------------------------------------


def setting(algorithm: str, budget: int | None = None, top_k: int | None = None) -> dict:
    return {"algorithm": algorithm, "budget": budget, "top_k": top_k}


def setting_name(item: dict) -> str:
    """'DFLASH' or 'DDTREE budget 8 top_k 4', for messages."""
    if item["algorithm"] == "DDTREE":
        return "DDTREE budget %s top_k %s" % (item.get("budget"), item.get("top_k"))
    return item["algorithm"]


def candidate_settings(tuning: dict) -> list:
    """DFLASH (the yardstick and the fallback), then every DDTREE (budget, top_k) of the declaration."""
    return [setting("DFLASH")] + [
        setting("DDTREE", budget, top_k) for budget in tuning["budgets"] for top_k in tuning["top_k"]
    ]


def measurement_plan(tuning: dict) -> list:
    """What the measuring step measures: every candidate setting at every declared concurrency."""
    return [
        dict(item, concurrency=concurrency)
        for item in candidate_settings(tuning)
        for concurrency in tuning["concurrency"]
    ]


# ---- the tuning key --------------------------------------------------------------------------------


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()[:16]


def tuning_key(service: dict, release_id: str, workload: dict | None = None) -> dict:
    """What a tuning is valid for -> {"digest", "parts"}; a change in any part tunes again.

    Parts: the model, the drafter, the release (its SGLang, overlay and kernels), the tensor-parallel
    size and GPU count, the grid and the declared load, the measuring workload (prompt set, lengths),
    and the server's other settings (extra_args, environment, allow_hybrid_unsafe: each can change the
    speed), the last as a digest only, because an environment may hold a token.
    """
    spec = service.get("speculative") or {}
    server = {
        "extra_args": [str(arg) for arg in service.get("extra_args") or []],
        "environment": {str(key): str(value) for key, value in (service.get("environment") or {}).items()},
        "allow_hybrid_unsafe": bool(spec.get("allow_hybrid_unsafe")),
    }
    parts = {
        "format": KEY_FORMAT,
        "model": service.get("model_path"),
        "drafter": service.get("draft_model_path"),
        "release_id": release_id,
        "tp_size": service.get("tp_size", 1),
        "gpu_count": len(service.get("gpus") or []),
        "grid": declaration(spec),
        "workload": workload or {},
        "server_settings": _digest(server),
    }
    return {"digest": _digest(parts), "parts": parts}


def key_changes(before: dict | None, after: dict) -> list:
    """The parts of the tuning key that differ (["release_id"]), every part when there was no tuning."""
    old = (before or {}).get("parts") or {}
    return sorted(name for name in set(old) | set(after["parts"]) if old.get(name) != after["parts"].get(name))


# ---- the measurements ------------------------------------------------------------------------------


def _identity(measurement: dict) -> tuple:
    algorithm = measurement.get("algorithm")
    if algorithm == "DDTREE":
        return (algorithm, measurement.get("budget"), measurement.get("top_k"), measurement.get("concurrency"))
    return (algorithm, None, None, measurement.get("concurrency"))


def _tokens_per_second(measurement: dict) -> float | None:
    """The measurement's tokens/s, or None when it failed (an error, no number, or no tokens)."""
    value = measurement.get("tokens_per_second")
    if measurement.get("error") or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 else None


def measurement_problems(tuning: dict, measurements: list) -> list:
    """Measurements the grid does not explain: another algorithm, a setting or concurrency not declared,
    or the same one twice (which would be chosen from is a guess; supply one per setting, e.g. a median)."""
    grid = {_identity(item) for item in measurement_plan(tuning)}
    problems, seen = [], set()
    for position, measurement in enumerate(measurements):
        identity = _identity(measurement)
        label = "measurements[%d] (%s at concurrency %s)" % (
            position,
            setting_name(measurement),
            measurement.get("concurrency"),
        )
        if measurement.get("algorithm") not in MEASURED_ALGORITHMS:
            problems.append(
                "measurements[%d]: algorithm %r is not one of %s"
                % (position, measurement.get("algorithm"), ", ".join(MEASURED_ALGORITHMS))
            )
            continue
        if identity in seen:
            problems.append("%s: measured twice; supply one measurement per setting and concurrency" % label)
        seen.add(identity)
        if measurement["algorithm"] == "NONE":
            if measurement.get("concurrency") not in tuning["concurrency"]:
                problems.append(
                    "%s: concurrency %r is not declared (%s)"
                    % (label, measurement.get("concurrency"), tuning["concurrency"])
                )
        elif identity not in grid:
            problems.append(
                "%s: not in the declared grid (budgets %s, top_k %s, concurrency %s)"
                % (label, tuning["budgets"], tuning["top_k"], tuning["concurrency"])
            )
    return problems


def _gain(value: float, yardstick: float) -> float:
    return value / yardstick - 1.0


def _percent(gain: float) -> str:
    return "%+.1f%%" % (100.0 * gain)


def _verdict(item: dict, tuning: dict, by_identity: dict, dflash: dict) -> dict:
    """One DDTREE setting against DFLASH -> its status (qualifies, too_slow, failed, unmeasured: the
    first that applies, from the last), its numbers per concurrency and the reasons it does not qualify."""
    speeds, gains = {}, {}
    unmeasured, failed, slow = [], [], []
    for concurrency in tuning["concurrency"]:
        measurement = by_identity.get(("DDTREE", item["budget"], item["top_k"], concurrency))
        value = _tokens_per_second(measurement) if measurement else None
        if measurement is None:
            unmeasured.append("not measured at concurrency %d" % concurrency)
        elif value is None:
            failed.append("failed at concurrency %d: %s" % (concurrency, measurement.get("error") or "no tokens/s"))
        else:
            gain = _gain(value, dflash[concurrency])
            speeds[str(concurrency)] = value
            gains[str(concurrency)] = round(gain, 4)
            if gain + EPSILON < tuning["min_gain"]:
                slow.append(
                    "%s over DFLASH at concurrency %d, less than min_gain %s"
                    % (_percent(gain), concurrency, _percent(tuning["min_gain"]))
                )
    status = "unmeasured" if unmeasured else "failed" if failed else "too_slow" if slow else "qualifies"
    return dict(
        item, status=status, tokens_per_second=speeds, gain_over_dflash=gains, reasons=unmeasured + failed + slow
    )


def _rank(verdict: dict) -> tuple:
    """The order among qualifying settings: the best worst-case gain first (the service meets every
    declared load), then the best geometric-mean gain, then the smaller tree (less verify work and
    memory for the same speed), then the smaller top_k."""
    ratios = [1.0 + gain for gain in verdict["gain_over_dflash"].values()]
    mean = math.exp(sum(math.log(ratio) for ratio in ratios) / len(ratios))
    # A schedule ranks like the single budget of its widest window (the memory it takes).
    budget = verdict["budget"] if isinstance(verdict["budget"], int) else max(verdict["levels"].values())
    return (-min(ratios), -mean, budget, verdict["top_k"])


def _schedule_verdict(top_k: int, verdicts: list, tuning: dict) -> dict | None:
    """The schedule of one top_k: at each declared concurrency, the budget measured fastest there.

    Each concurrency level is measured with the single-budget server whose window the schedule gives
    that load, so the level's numbers are the schedule's. None when fewer than two budgets would make
    it (then it is one of the single settings) or a level has no measurement.
    """
    levels, speeds, gains = {}, {}, {}
    for concurrency in tuning["concurrency"]:
        key = str(concurrency)
        measured = [item for item in verdicts if item["top_k"] == top_k and key in item["tokens_per_second"]]
        if not measured:
            return None
        best = max(measured, key=lambda item: (item["tokens_per_second"][key], -item["budget"]))
        levels[key], speeds[key], gains[key] = (
            best["budget"],
            best["tokens_per_second"][key],
            best["gain_over_dflash"][key],
        )
    if len(set(levels.values())) < 2:
        return None
    slow = [
        "%s over DFLASH at concurrency %s, less than min_gain %s" % (_percent(gain), key, _percent(tuning["min_gain"]))
        for key, gain in gains.items()
        if gain + EPSILON < tuning["min_gain"]
    ]
    return dict(
        setting("DDTREE", schedule_from_levels(levels), top_k),
        status="too_slow" if slow else "qualifies",
        tokens_per_second=speeds,
        gain_over_dflash=gains,
        reasons=slow,
        levels=levels,
    )


def _dflash_speeds(tuning: dict, measurements: list, by_identity: dict) -> dict:
    """{concurrency: DFLASH's tokens/s}; raises IncompleteMeasurements when the measurements cannot decide."""
    problems = measurement_problems(tuning, measurements)
    dflash = {}
    for concurrency in tuning["concurrency"]:
        measurement = by_identity.get(("DFLASH", None, None, concurrency))
        value = _tokens_per_second(measurement) if measurement else None
        if measurement is None:
            problems.append(
                "DFLASH was not measured at concurrency %d; every DDTREE setting is compared with it" % concurrency
            )
        elif value is None:
            problems.append(
                "DFLASH's measurement at concurrency %d failed (%s); nothing can be compared with it"
                % (concurrency, measurement.get("error") or "no tokens/s")
            )
        else:
            dflash[concurrency] = value
    if problems:
        raise IncompleteMeasurements(problems)
    return dflash


def _ddtree_choice(best: dict, tuning: dict) -> tuple:
    """(setting, tokens/s per concurrency, reason, status) of the fastest DDTREE setting that qualifies."""
    reason = "%s is the fastest setting that beats DFLASH by min_gain %s at every declared concurrency (%s)" % (
        setting_name(best),
        _percent(tuning["min_gain"]),
        ", ".join(
            "%s at concurrency %s" % (_percent(gain), concurrency)
            for concurrency, gain in best["gain_over_dflash"].items()
        ),
    )
    if best.get("levels"):
        reason += "; a budget per load: %s" % ", ".join(
            "%s at concurrency up to %s" % (budget, level) for level, budget in best["levels"].items()
        )
    return setting("DDTREE", best["budget"], best["top_k"]), best["tokens_per_second"], reason, "ddtree"


def _fallback_choice(verdicts: list, tuning: dict, dflash: dict) -> tuple:
    """(setting, tokens/s per concurrency, reason, status) of DFLASH, when no DDTREE setting qualifies."""
    speeds = {str(concurrency): value for concurrency, value in dflash.items()}
    reason = "no DDTREE setting beats DFLASH by min_gain %s at every declared concurrency: running DFLASH" % _percent(
        tuning["min_gain"]
    )
    measured = [item for item in verdicts if item["status"] == "too_slow"]
    if measured:
        closest = sorted(measured, key=_rank)[0]
        reason += " (closest: %s, %s)" % (setting_name(closest), "; ".join(closest["reasons"]))
    return setting("DFLASH"), speeds, reason, "fallback"


def choose(tuning: dict, measurements: list) -> dict:
    """The setting to run, from the measurements of one tuning.

    -> {"algorithm": "DDTREE" | "DFLASH", "budget", "top_k", "status": "ddtree" | "fallback", "reason",
        "tokens_per_second": {concurrency: float}, "gain_over_dflash": {...}, "gain_over_none": {...},
        "settings": [every DDTREE setting's verdict]}; concurrencies are strings (JSON keys).
    Raises IncompleteMeasurements when measurements fall outside the grid or DFLASH was not measured
    at every declared concurrency: without the yardstick nothing can be chosen, not even DFLASH (its
    failure is the candidate's, for the health gate to judge).
    """
    by_identity = {_identity(item): item for item in measurements}
    dflash = _dflash_speeds(tuning, measurements, by_identity)
    none = {}
    for concurrency in tuning["concurrency"]:
        measurement = by_identity.get(("NONE", None, None, concurrency))
        if measurement and _tokens_per_second(measurement):
            none[concurrency] = _tokens_per_second(measurement)
    verdicts = [_verdict(item, tuning, by_identity, dflash) for item in candidate_settings(tuning)[1:]]
    schedules = [item for item in (_schedule_verdict(top_k, verdicts, tuning) for top_k in tuning["top_k"]) if item]
    qualifying = sorted((item for item in verdicts + schedules if item["status"] == "qualifies"), key=_rank)
    if qualifying:
        chosen, speeds, reason, status = _ddtree_choice(qualifying[0], tuning)
    else:
        chosen, speeds, reason, status = _fallback_choice(verdicts, tuning, dflash)
    gain_over_dflash = {key: round(_gain(value, dflash[int(key)]), 4) for key, value in speeds.items()}
    gain_over_none = {key: round(_gain(value, none[int(key)]), 4) for key, value in speeds.items() if int(key) in none}
    return dict(
        chosen,
        status=status,
        reason=reason,
        tokens_per_second=speeds,
        gain_over_dflash=gain_over_dflash,
        gain_over_none=gain_over_none,
        settings=verdicts,
    )


# ---- what the choice becomes -----------------------------------------------------------------------


def speed_floor(choice: dict, margin: float = DEFAULT_FLOOR_MARGIN) -> float | None:
    """The health gate's tokens/s floor from the chosen setting: its tokens/s at one request at a time
    (the gate sends one at a time) less margin. None when concurrency 1 was not declared: a number
    measured with several requests at a time is no floor for one request."""
    value = (choice.get("tokens_per_second") or {}).get("1")
    return None if value is None else round(value * (1.0 - margin), 2)


def tuned_service(service: dict, choice: dict) -> dict:
    """The service as it runs with the choice: speculative becomes the chosen setting (DDTREE with its
    budget and top_k, or DFLASH) without autotune, and the gate's speed floor the tuned one, unless the
    service sets its own health.min_tokens_per_second (an explicit floor wins over a derived one).
    Raises ValueError for a choice that is neither."""
    algorithm = (choice or {}).get("algorithm")
    if algorithm not in ("DDTREE", "DFLASH"):
        raise ValueError("%s: a tuned choice is DDTREE or DFLASH, not %r" % (service.get("name"), algorithm))
    service = copy.deepcopy(service)
    spec = service.get("speculative") or {}
    if algorithm == "DDTREE":
        top_k = choice.get("top_k")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(
                "%s: the tuned DDTREE choice has top_k %r, not an integer >= 1" % (service.get("name"), top_k)
            )
        try:
            parse_budget(choice.get("budget"))
        except ValueError as err:
            raise ValueError("%s: the tuned DDTREE choice's budget: %s" % (service.get("name"), err)) from None
        resolved = {"algorithm": "DDTREE", "budget": choice["budget"], "top_k": choice["top_k"]}
        if spec.get("allow_hybrid_unsafe"):
            resolved["allow_hybrid_unsafe"] = True
    else:
        resolved = {"algorithm": "DFLASH"}
    service["speculative"] = resolved
    floor = choice.get("speed_floor")
    health = dict(service.get("health") or {})
    if floor is not None and health.get("min_tokens_per_second") is None:
        health["min_tokens_per_second"] = floor
        service["health"] = health
    return service


# ---- the state file --------------------------------------------------------------------------------


def tuning_record(
    key: dict,
    release_id: str,
    tuning: dict,
    measurements: list,
    choice: dict,
    tuned_at: str,
    margin: float = DEFAULT_FLOOR_MARGIN,
) -> dict:
    """What one tuning leaves in the service's state: the key, every measurement and the choice (with the
    speed floor it gives the gate)."""
    recorded = dict(choice, speed_floor=speed_floor(choice, margin), floor_margin=margin)
    return {
        "key": key,
        "release_id": release_id,
        "tuned_at": tuned_at,
        "declaration": tuning,
        "measurements": [dict(item) for item in measurements],
        "choice": recorded,
    }


def state_document(previous: dict | None, record: dict, keep: int = KEEP_HISTORY) -> dict:
    """The state file after a tuning: {"format", "current": record, "history": [earlier tunings' key,
    release, time and choice, newest last]}."""
    history = list((previous or {}).get("history") or [])
    before = (previous or {}).get("current")
    if before:
        choice = before.get("choice") or {}
        history.append(
            {
                "key": (before.get("key") or {}).get("digest"),
                "release_id": before.get("release_id"),
                "tuned_at": before.get("tuned_at"),
                "choice": {field: choice.get(field) for field in ("algorithm", "budget", "top_k", "status")},
            }
        )
    return {"format": STATE_FORMAT, "current": record, "history": history[-keep:]}


def recorded_choice(document: dict | None, key: dict) -> dict | None:
    """The choice recorded for this key, or None when the state holds none for it (tune)."""
    current = (document or {}).get("current") or {}
    if (current.get("key") or {}).get("digest") != key["digest"]:
        return None
    return current.get("choice")
