#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rollout_halt
short_description: Stop or pause a rollout, or let it go on, as a bake's verdict says
version_added: 0.1.0
description:
  - Fails with O(msg) when O(action) is C(stop) or C(pause), and says which in RV(rollout_event). The rollout
    report files the failure as the whole rollout's stop or pause, not as a failure of the host the task ran on
    (docs/rollout-policy.md, "Bake"). A paused rollout's verdict is C(paused), and C(scripts/rollout) exits 3.
  - With O(action) C(continue) it changes nothing and succeeds.
  - The action is decided before, by the C(ddtree.sglang.rollout_bake_verdicts) filter.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  action:
    description: What the rollout does next.
    type: str
    required: true
    choices: [continue, stop, pause]
  msg:
    description: Why it stops or pauses (the bake's verdict message); the failure's message.
    type: str
    default: ""
attributes:
  action:
    support: full
    description: Runs on the controller (C(plugins/action/rollout_halt.py)); it needs no connection to the host.
  check_mode:
    support: full
    description: Fails or succeeds as without check mode; it changes nothing either way.
  diff_mode:
    support: none
    description: Nothing is written.
seealso:
  - module: ddtree.sglang.sglang_health
"""

EXAMPLES = r"""
- name: Stop the rollout after a failed re-check, pause it after an inconclusive one
  ddtree.sglang.rollout_halt:
    action: "{{ sglang_service_bake.action }}"
    msg: "{{ sglang_service_bake.msg }}"
  run_once: true
"""

RETURN = r"""
rollout_event:
  description: C(stop) or C(pause) (the rollout report reads it); unset when the rollout goes on.
  returned: when O(action) is not C(continue)
  type: str
  sample: pause
msg:
  description: O(msg), when the rollout stops or pauses.
  returned: when O(action) is not C(continue)
  type: str
"""
