# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters for the rollout policy (docs/rollout-policy.md); the logic is in module_utils/rollout_policy.py."""

from __future__ import annotations

import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.ddtree.sglang.plugins.module_utils.rollout_policy import (
    PolicyError,
    bake_checks,
    bake_outcome,
    bake_verdicts,
    max_fail_percentage,
    validate_policy,
)


def rollout_policy(policy, legacy_batches=None):
    """The policy, validated and normalised, with the play keywords it sets (serial, max_fail_percentage).

    A policy given as text (an AWX survey's textarea holds no mapping) is read as YAML, or JSON."""
    if isinstance(policy, str):
        try:
            policy = yaml.safe_load(policy) if policy.strip() else None
        except yaml.YAMLError as error:
            raise AnsibleFilterError(
                "ddtree_rollout_policy is text that is not YAML (%s): write a mapping such as "
                "{batches: [1, '5%%'], bake_time_s: 300}" % str(error).splitlines()[0]
            ) from None
    try:
        result = validate_policy(policy, legacy_batches)
    except PolicyError as error:
        raise AnsibleFilterError(str(error)) from None
    return dict(result, serial=list(result["batches"]), max_fail_percentage=max_fail_percentage(result))


def rollout_bake_verdicts(results, inconclusive=None):
    """A bake's re-checks, sorted into passed, failed and inconclusive; with the policy's `inconclusive` (fail or
    pause) also what the rollout does (`action`: continue, stop or pause) and its message (`msg`)."""
    if not isinstance(results, list):
        raise AnsibleFilterError(
            "rollout_bake_verdicts takes the registered loop's results (a list), got %r" % (results,)
        )
    verdicts = bake_verdicts(results)
    if inconclusive is not None:
        verdicts.update(bake_outcome(verdicts, inconclusive))
    return verdicts


def rollout_bake_checks(hosts, hostvars):
    """The re-checks of a bake: one {host, service, since, release_id} per service of each of hosts, from the
    facts the sglang_service role left on them (its plan, the restart time, the release)."""
    state = {}
    for host in hosts:
        facts = hostvars[host]
        state[host] = {
            "services": (facts.get("sglang_service_plan") or {}).get("services") or [],
            "since": (facts.get("sglang_service_since") or {}).get("stdout"),
            "release_id": (facts.get("sglang_service_release") or {}).get("release_id"),
            # Each service's own release (its pin, or the base release of one without the overlay).
            "releases": {
                name: choice.get("release_id")
                for name, choice in ((facts.get("sglang_service_releases") or {}).get("services") or {}).items()
            },
        }
    return bake_checks(list(hosts), state)


class FilterModule:
    def filters(self):
        return {
            "rollout_policy": rollout_policy,
            "rollout_bake_verdicts": rollout_bake_verdicts,
            "rollout_bake_checks": rollout_bake_checks,
        }
