"""Task times for the test suite: each task's wall time per play, appended as JSON lines.

Enabled by scripts/test for the lab stages (ANSIBLE_CALLBACKS_ENABLED=task_times, with
DDTREE_TASK_TIMES naming the file); prints nothing, so the playbooks' output is unchanged.
Part of the lab only: nothing of it ships with the collection.
"""

from __future__ import annotations

DOCUMENTATION = """
name: task_times
type: aggregate
short_description: Write each task's wall time to a JSON-lines file (lab and tests only)
description:
  - Appends one line per finished task to the file named by C(DDTREE_TASK_TIMES).
options: {}
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._path = os.environ.get("DDTREE_TASK_TIMES")
        self._play = ""
        self._task = None
        self._started = 0.0

    def _close_task(self):
        if self._task is None or not self._path:
            return
        row = {"play": self._play, "task": self._task.get_name(), "path": self._task.get_path() or "",
               "started": round(self._started, 3), "seconds": round(time.time() - self._started, 3),
               "pid": os.getpid()}
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        self._task = None

    def v2_playbook_on_play_start(self, play):
        self._close_task()
        self._play = play.get_name()

    def _open_task(self, task):
        self._close_task()
        self._task = task
        self._started = time.time()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._open_task(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._open_task(task)

    def v2_playbook_on_stats(self, stats):
        self._close_task()
