# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Test only: SIGKILL the whole ansible-playbook run when a task begins, as a cancelled CI job or a
controller that loses power would end it (tests/gitops/test_interrupted.py).

DDTREE_KILL_AT_TASK: the start of the task's name; DDTREE_KILL_AFTER_S: seconds into that task
(default 0: before it runs); DDTREE_KILL_MARKER: a file written just before the kill, so the test
knows the kill point was reached. The run must be its own process group (start_new_session): the
workers and their connections die with it, and nothing else does.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: kill_at_task
type: aggregate
short_description: Test only - SIGKILL the run's process group when a named task begins
description: Used by tests/gitops/test_interrupted.py to interrupt rollouts at chosen points.
"""

import os
import signal
import threading

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "kill_at_task"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_task_start(self, task, is_conditional):
        wanted = os.environ.get("DDTREE_KILL_AT_TASK")
        # The task's own name, without the "role : " that get_name() puts before it.
        if not wanted or not (task.name or "").startswith(wanted):
            return
        delay = float(os.environ.get("DDTREE_KILL_AFTER_S") or 0)
        if delay:
            threading.Timer(delay, self._kill, args=(task.name,)).start()
        else:
            self._kill(task.name)

    @staticmethod
    def _kill(name):
        marker = os.environ.get("DDTREE_KILL_MARKER")
        if marker:
            with open(marker, "w") as handle:
                handle.write(name + "\n")
        os.killpg(os.getpgid(0), signal.SIGKILL)
