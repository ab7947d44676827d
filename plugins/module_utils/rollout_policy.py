# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The rollout policy (docs/rollout-policy.md): batches, bake time, failures allowed, inconclusive.

Plain functions of data, used by the filter plugin ddtree.sglang.rollout_policy (which playbooks/services.yml
turns into `serial` and `max_fail_percentage`) and tested directly:
  validate_policy()  the policy as declared -> the policy normalised, or PolicyError naming the bad value and the fix
  batch_sizes()      the batches Ansible will make of N hosts (the same arithmetic as `serial`)
  bake_verdict()     one bake re-check's task result -> passed, failed (roll back) or inconclusive (pause)
"""

from __future__ import annotations

import re

# Today's behaviour, kept as the default: a canary of one host, then half the fleet at a time, no failure
# allowed, no bake.
DEFAULT_POLICY = {"batches": [1, "50%"], "bake_time_s": 0, "max_failures_per_batch": 0, "inconclusive": "pause"}
INCONCLUSIVE_CHOICES = ("pause", "fail")
PERCENT = re.compile(r"^([0-9]+)%$")
EXAMPLE = "{batches: [1, '5%', '25%', '100%'], bake_time_s: 300, max_failures_per_batch: 0, inconclusive: pause}"

# The health gate's failure kinds that are about the gate's own access to the host, not about the service:
# systemctl or journalctl could not be run, a state file could not be read (plugins/module_utils/health_gate.py).
GATE_SIDE_FAILURES = ("systemctl", "journal", "state_file")


class PolicyError(ValueError):
    """A policy value that cannot be used; the message names the value and the fix."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _batch(index: int, value) -> int | str:
    """One batch size: a count of hosts (>= 1) or an integral percentage of the targeted hosts ('1%'..'100%')."""
    where = "ddtree_rollout_policy.batches[%d]" % index
    if _is_int(value):
        if value < 1:
            raise PolicyError(
                "%s is %d: a batch needs at least one host; write a count >= 1 or a percentage such as '5%%'"
                % (where, value)
            )
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return _batch(index, int(text))
        match = PERCENT.match(text.replace(" ", ""))
        if match:
            percent = int(match.group(1))
            if not 1 <= percent <= 100:
                raise PolicyError(
                    "%s is %r: a percentage of the targeted hosts must be from '1%%' to '100%%'" % (where, value)
                )
            return "%d%%" % percent
    raise PolicyError(
        "%s is %r: write a count of hosts (for example 1) or a whole percentage of the targeted hosts "
        "(for example '5%%'; Ansible's serial takes no fractions)" % (where, value)
    )


def _check_order(batches: list) -> None:
    """Canary first: a count may not follow a larger count, nor a percentage a larger percentage."""
    largest = {}
    for index, value in enumerate(batches):
        kind, size = ("count", value) if _is_int(value) else ("percent", int(value[:-1]))
        if kind in largest and size < largest[kind][1]:
            before = largest[kind][0]
            raise PolicyError(
                "ddtree_rollout_policy.batches[%d] is %r, smaller than batches[%d] %r before it: batches are sizes, "
                "smallest first (a canary, then wider; the last repeats until every host is done); reorder them, "
                "for example [1, '5%%', '25%%', '100%%']" % (index, value, before, batches[before])
            )
        largest[kind] = (index, size)


def validate_policy(policy=None, legacy_batches=None) -> dict:
    """The policy, normalised (every key present, batches as ints and 'N%' strings), or PolicyError.

    policy: ddtree_rollout_policy as declared (None or {} is the default). legacy_batches:
    ddtree_rollout_batches, the batches alone as earlier releases took them.
    """
    if policy is None:
        policy = {}
    if not isinstance(policy, dict):
        raise PolicyError("ddtree_rollout_policy is %r: it is a mapping, for example %s" % (policy, EXAMPLE))
    unknown = sorted(set(policy) - set(DEFAULT_POLICY))
    if unknown:
        raise PolicyError(
            "ddtree_rollout_policy has unknown key(s) %s: the keys are %s"
            % (", ".join(map(str, unknown)), ", ".join(DEFAULT_POLICY))
        )
    if legacy_batches is not None and "batches" in policy:
        raise PolicyError(
            "both ddtree_rollout_batches (%r) and ddtree_rollout_policy.batches (%r) are set: keep "
            "ddtree_rollout_policy.batches only" % (legacy_batches, policy["batches"])
        )
    result = dict(DEFAULT_POLICY, **policy)
    batches = legacy_batches if legacy_batches is not None else result["batches"]
    if isinstance(batches, (str, int)) and not isinstance(batches, bool):
        batches = [batches]  # serial's own shorthand: one size for every batch
    if not isinstance(batches, list) or not batches:
        raise PolicyError(
            "ddtree_rollout_policy.batches is %r: a non-empty list of batch sizes, for example "
            "[1, '5%%', '25%%', '100%%']" % (batches,)
        )
    result["batches"] = [_batch(index, value) for index, value in enumerate(batches)]
    _check_order(result["batches"])

    bake = result["bake_time_s"]
    if isinstance(bake, str) and bake.strip().isdigit():
        bake = result["bake_time_s"] = int(bake)  # a survey or -e key=value passes numbers as text
    if not _is_int(bake) or bake < 0:
        raise PolicyError(
            "ddtree_rollout_policy.bake_time_s is %r: whole seconds to watch each batch before the next "
            "(0: no bake), an integer >= 0" % (bake,)
        )
    allowed = result["max_failures_per_batch"]
    if isinstance(allowed, str) and allowed.strip().isdigit():
        allowed = result["max_failures_per_batch"] = int(allowed)
    if not _is_int(allowed) or allowed < 0:
        raise PolicyError(
            "ddtree_rollout_policy.max_failures_per_batch is %r: the count of hosts that may fail in "
            "one batch without stopping the rollout, an integer >= 0 (0: the first failure stops it)" % (allowed,)
        )
    if result["inconclusive"] not in INCONCLUSIVE_CHOICES:
        raise PolicyError(
            "ddtree_rollout_policy.inconclusive is %r: %s (pause: stop and say how to resume; fail: "
            "stop as a failed rollout)" % (result["inconclusive"], " or ".join(INCONCLUSIVE_CHOICES))
        )
    return result


def max_fail_percentage(policy: dict) -> int:
    """The play's max_fail_percentage: 0 stops at the first failure; with failures allowed, 100 leaves the count
    to the batch's own check (a percentage of a batch cannot say "N hosts" for batches of different sizes)."""
    return 0 if policy["max_failures_per_batch"] == 0 else 100


def batch_sizes(batches: list, host_count: int) -> list:
    """The sizes of the batches Ansible makes of host_count hosts with serial: batches.

    The same arithmetic as ansible-core (PlaybookExecutor._get_serialized_batches, pct_to_int): a
    percentage is of all the targeted hosts, rounded down but at least 1; the last size repeats until
    every host is in a batch; the last batch holds what is left.
    """
    sizes, left, index = [], host_count, 0
    while left > 0:
        value = batches[min(index, len(batches) - 1)]
        size = int(value) if _is_int(value) else (int(int(value[:-1]) / 100.0 * host_count) or 1)
        size = min(size, left)
        sizes.append(size)
        left -= size
        index += 1
    return sizes


def bake_checks(hosts: list, host_state: dict) -> list:
    """The re-checks of one bake: one {host, service, since, release_id, gate} per service of each host updated so far.

    host_state: host -> {"services": the role's plan entries, "since": when its services were restarted (the
    journal is read from there, so a crash at any time since the deploy counts), "release_id" (the host's
    candidate), "releases" (service name -> the release it runs: the candidate, its pin or the base
    release; a service missing there runs the candidate)}. Only what the service's plan entry is copied
    whole (a rollback gates with its settings), never an API key: loop items are printed and returned (the
    task looks the key up itself).
    """
    checks = []
    for host in hosts:
        state = host_state.get(host) or {}
        releases = state.get("releases") or {}
        for service in state.get("services") or []:
            check = {
                "host": host,
                "since": state.get("since"),
                "release_id": releases.get(service.get("name")) or state.get("release_id"),
                "service": {key: value for key, value in service.items() if key != "api_key"},
            }
            # What the gate is called with: the plan entry, the journal since the deploy, the release, and its
            # host (the rollout report files an unreachable re-check under it).
            check["gate"] = dict(check["service"], since=check["since"], release_id=check["release_id"], bake_host=host)
            checks.append(check)
    return checks


def bake_verdict(result: dict) -> dict:
    """What one bake re-check (a ddtree.sglang.sglang_health result) means for the rollout.

    -> {"verdict": passed | failed | inconclusive, "reason": str}. failed: the service failed one of the gate's
    stages (roll it back). inconclusive: nothing was learnt about the service - the host was unreachable,
    the task timed out on the controller's side, the module did not run to a verdict, or the gate could
    not read the unit, the journal or a state file.
    """
    if result.get("unreachable"):
        return {"verdict": "inconclusive", "reason": "unreachable: %s" % (result.get("msg") or "no answer")}
    if result.get("passed") is True and not result.get("failed"):
        return {"verdict": "passed", "reason": result.get("msg") or "passed"}
    if result.get("timedout"):
        return {
            "verdict": "inconclusive",
            "reason": "the re-check timed out on the controller's side: %s" % result.get("msg", ""),
        }
    kind = result.get("failure_kind")
    if not kind:
        return {
            "verdict": "inconclusive",
            "reason": "the re-check ended without a verdict: %s" % (result.get("msg") or "no message"),
        }
    if kind in GATE_SIDE_FAILURES:
        return {
            "verdict": "inconclusive",
            "reason": "the gate could not look at the service (%s): %s" % (kind, result.get("msg", "")),
        }
    return {"verdict": "failed", "reason": result.get("msg") or kind}


def bake_verdicts(results: list) -> dict:
    """A bake's re-check results (a registered loop over {host, service}) sorted by verdict.

    -> {"passed": [...], "failed": [...], "inconclusive": [...]}, each entry {host, service, reason, result}.
    """
    out = {"passed": [], "failed": [], "inconclusive": []}
    for result in results:
        item = result.get("item") or {}
        verdict = bake_verdict(result)
        out[verdict["verdict"]].append(
            {
                "host": item.get("host"),
                "service": (item.get("service") or {}).get("name"),
                "reason": verdict["reason"],
                "result": result,
            }
        )
    return out


def bake_outcome(verdicts: dict, inconclusive: str) -> dict:
    """What a bake's sorted re-checks mean for the rollout under the policy's `inconclusive` (fail or pause).

    -> {"action": continue | stop | pause, "msg": the run's message when it stops or pauses}.
    """

    def listed(entries):
        return "; ".join("%s %s (%s)" % (entry["host"], entry["service"], entry["reason"]) for entry in entries)

    failed, unsure = verdicts.get("failed") or [], verdicts.get("inconclusive") or []
    if unsure and not failed and inconclusive == "pause":
        return {
            "action": "pause",
            "msg": (
                "PAUSED: the bake's re-check was inconclusive for %s. Nothing was rolled back. Look at those hosts; "
                "then "
                "resume by running the same rollout again (the summary prints the command): hosts already on the "
                "release "
                "are not restarted, and every host updated so far is re-checked at the end of its batch."
                % listed(unsure)
            ),
        }
    if not failed and not unsure:
        return {"action": "continue", "msg": ""}
    parts = []
    if failed:
        parts.append("The bake's re-check failed for %s: rolled back to the previous release." % listed(failed))
    if unsure:
        parts.append(
            "The bake's re-check was inconclusive (the policy says inconclusive: %s) for %s."
            % (inconclusive, listed(unsure))
        )
    parts.append("The rollout stops here; hosts not reached keep the release they had.")
    return {"action": "stop", "msg": " ".join(parts)}
