"""Task times for the test suite: each task's wall time and CPU time, appended as JSON lines.

Loaded by scripts/test for the lab stages (ANSIBLE_CALLBACK_PLUGINS names this folder; it needs no
enabling, so the callbacks ansible.cfg enables, such as the rollout report, stay as they are); writes
only when DDTREE_TASK_TIMES names a file, and prints nothing.
CPU time is what the task cost the machine whatever else ran beside it (wall time on a busy machine
says little): the controller's own (this process and the workers it reaped) and each lab host's (its
container's cgroup, the lab's containers only, found by DDTREE_LAB_ID). Part of the lab only:
nothing of it ships with the collection.
"""

from __future__ import annotations

DOCUMENTATION = """
name: task_times
type: aggregate
short_description: Write each task's wall and CPU time to a JSON-lines file (lab and tests only)
description:
  - Appends one line per finished task to the file named by C(DDTREE_TASK_TIMES).
options: {}
"""

import glob
import json
import os
import resource
import subprocess
import time

from ansible.plugins.callback import CallbackBase

CGROUP_ROOTS = ("/sys/fs/cgroup/unified/libpod_parent", "/sys/fs/cgroup/libpod_parent", "/sys/fs/cgroup/machine.slice")


def controller_cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cgroup_cpu(container_id):
    """Seconds of CPU the container has used, from its cgroup (v2 cpu.stat, else v1 cpuacct)."""
    for root in CGROUP_ROOTS:
        for path in glob.glob("%s/*%s*/cpu.stat" % (root, container_id)):
            with open(path, encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
    for path in glob.glob("/sys/fs/cgroup/cpuacct/libpod_parent/*%s*/cpuacct.usage" % container_id):
        with open(path, encoding="ascii") as handle:
            return int(handle.read()) / 1e9
    return None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self):
        super().__init__()
        self._path = os.environ.get("DDTREE_TASK_TIMES")
        self._lab_id = os.environ.get("DDTREE_LAB_ID", "")
        self._containers = {}  # host name -> container id
        self._play = ""
        self._task = None
        self._hosts = set()
        self._started = 0.0
        self._cpu_before = (0.0, {})

    def _find_containers(self):
        if not (self._path and self._lab_id):
            return
        try:
            out = subprocess.run(
                [
                    "podman",
                    "ps",
                    "--no-trunc",
                    "--format",
                    "{{.ID}} {{.Names}}",
                    "--filter",
                    "name=^%s-" % self._lab_id,
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return
        prefix = self._lab_id + "-"
        self._containers = {
            name[len(prefix) :]: cid for cid, name in (line.split(None, 1) for line in out.splitlines() if " " in line)
        }

    def _cpu_now(self):
        hosts = {}
        for host, cid in self._containers.items():
            used = cgroup_cpu(cid)
            if used is not None:
                hosts[host] = used
        return controller_cpu(), hosts

    def _close_task(self):
        if self._task is None or not self._path:
            return
        controller, hosts = self._cpu_now()
        controller_before, hosts_before = self._cpu_before
        row = {
            "play": self._play,
            "task": self._task.get_name(),
            "path": self._task.get_path() or "",
            "started": round(self._started, 3),
            "seconds": round(time.time() - self._started, 3),
            "cpu_controller": round(controller - controller_before, 3),
            "cpu_hosts": {
                host: round(used - hosts_before[host], 3)
                for host, used in hosts.items()
                if host in hosts_before and host in self._hosts
            },
            "hosts": sorted(self._hosts),
            "pid": os.getpid(),
        }
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        self._task = None

    def _open_task(self, task):
        self._close_task()
        if not self._containers:
            self._find_containers()
        self._task = task
        self._hosts = set()
        self._started = time.time()
        self._cpu_before = self._cpu_now()

    def v2_playbook_on_play_start(self, play):
        self._close_task()
        self._play = play.get_name()
        self._find_containers()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._open_task(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._open_task(task)

    def _seen(self, result, *args, **kwargs):  # on_failed also gets ignore_errors
        self._hosts.add(result._host.get_name())

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_skipped = v2_runner_on_unreachable = _seen
    v2_runner_on_async_poll = _seen

    def v2_playbook_on_stats(self, stats):
        self._close_task()
