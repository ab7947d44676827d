# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a bake's verdict does to the rollout (ddtree.sglang.rollout_halt): stop it, pause it, or let it go on."""

from __future__ import annotations


def halt_result(action: str, msg: str) -> dict:
    """The task's result for what the rollout does next: a failure that names the rollout's stop or pause
    (rollout_event, which the rollout report reads), or nothing when it goes on."""
    if action == "continue":
        return {"changed": False}
    return {"failed": True, "msg": msg or "the rollout's bake says: %s" % action, "rollout_event": action}
