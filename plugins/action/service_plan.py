# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of ddtree.sglang.service_plan (see plugins/modules/service_plan.py for its docs).

The services' declarations are checked field by field here, on the values as the inventory wrote them, before
the module runs: ansible-core's own check (the module's, or a role argument spec's) would refuse an unknown key
or a missing field too, but without the service's name or the field it is closest to. The sglang_service role
leaves its services' fields to this check. What passes runs the module, which checks the rest on the host.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ddtree.sglang.plugins.module_utils.services import declared_problems


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        services = self._task.args.get("services")
        problems = (
            declared_problems(services, self._task.args.get("host") or "host", required=True)
            if isinstance(services, list)
            else []
        )
        if problems:
            result.update(
                failed=True,
                changed=False,
                msg="%d problem(s) in sglang_services, nothing was changed: %s" % (len(problems), " | ".join(problems)),
                problems=problems,
            )
            return result
        result.update(self._execute_module(task_vars=task_vars))
        return result
