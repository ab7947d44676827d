# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of ddtree.sglang.rollout_halt (see plugins/modules/rollout_halt.py for its docs)."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_halt import halt_result

ARGUMENT_SPEC = dict(
    action=dict(type="str", required=True, choices=["continue", "stop", "pause"]),
    msg=dict(type="str", default=""),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # A stop or pause is the controller's; the host it runs for may be unreachable by now.
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result.update(halt_result(args["action"], args["msg"]))
        return result
