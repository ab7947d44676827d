# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The history line of one rollback (module_utils/service_actions.py holds it, beside the decision to roll back)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ddtree.sglang.plugins.module_utils.service_actions import rollback_gate, rollback_record


def service_rollback_record(failed, rolled_back, gate, time):
    """The rollback's history line (service_actions.rollback_record): the failed release and its evidence.

    gate: the previous release's gate result, or the rollback's gate results (the one of this service is taken)."""
    if isinstance(gate, list):
        gate = rollback_gate(failed if isinstance(failed, dict) else {}, gate)
    for name, value in (
        ("the failed gate", failed),
        ("the rollback's link", rolled_back),
        ("the previous release's gate", gate),  # None: no gate result of this service
    ):
        if not isinstance(value, dict):
            raise AnsibleFilterError("service_rollback_record: %s must be a result (a dict), got %r" % (name, value))
    return rollback_record(failed, rolled_back, gate, str(time))


class FilterModule:
    def filters(self):
        return {"service_rollback_record": service_rollback_record}
