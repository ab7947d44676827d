# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller side of ddtree.sglang.rollout_lock (see plugins/modules/rollout_lock.py for its docs)."""

from __future__ import annotations

import getpass
import os
import socket
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.ddtree.sglang.plugins.plugin_utils.cache import cache_dir
from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_lock import LockError, acquire, describe_holder

display = Display()

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str", required=True),
    dir=dict(type="path"),
    timeout=dict(type="float", default=3600),
)


def default_lock_dir():
    return os.environ.get("DDTREE_LOCK_DIR") or cache_dir("locks")


def _owner(playbook_pid, hosts):
    """Who holds the locks: the run's process, controller, user, start, revision and trigger, and its hosts."""
    return {
        "pid": playbook_pid,
        "controller": socket.gethostname(),
        "user": getpass.getuser(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "revision": os.environ.get("DDTREE_ROLLOUT_REVISION", ""),
        "trigger": os.environ.get("DDTREE_ROLLOUT_TRIGGER", ""),
        "hosts": sorted(hosts),
    }


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        hostvars = (task_vars or {}).get("hostvars", {})
        # A host's key is the address Ansible reaches it at: two inventories naming one machine
        # differently still share its lock.
        keys = {}
        for name in args["hosts"]:
            address = hostvars[name].get("ansible_host", name) if name in hostvars else name
            keys[str(address)] = name
        lock_dir = args["dir"] or default_lock_dir()
        # The worker running this task is a fork of the ansible-playbook process: hold the locks
        # while that process lives.
        playbook_pid = os.getppid()
        owner = _owner(playbook_pid, args["hosts"])

        def on_wait(path, holder):
            display.display(
                "rollout lock: %s is held by %s; waiting up to %d s"
                % (
                    keys.get(os.path.basename(path)[:-5], os.path.basename(path)),
                    describe_holder(holder),
                    args["timeout"],
                )
            )

        try:
            outcome = acquire(lock_dir, list(keys), owner, playbook_pid, args["timeout"], on_wait=on_wait)
        except LockError as error:
            raise AnsibleActionFail("rollout lock: %s" % error) from None
        result.update(changed=False, lock_dir=lock_dir, waited_s=outcome["waited_s"], owner=owner)
        if outcome["acquired"]:
            result.update(locked=sorted(args["hosts"]), msg="locked %d host(s) for this run" % len(args["hosts"]))
            return result
        holder = outcome["holder"] or {}
        result.update(
            failed=True,
            refused=True,
            holder=holder,
            msg=(
                "another rollout holds the lock for %s: %s. It was not interrupted. %s"
                % (
                    ", ".join(sorted(set(holder.get("hosts") or [])) or os.path.basename(outcome["path"])),
                    describe_holder(holder),
                    "Waited %.0f s; raise the wait with -e ddtree_rollout_lock_timeout=SECONDS or try again when it is "
                    "done." % outcome["waited_s"]
                    if args["timeout"]
                    else "Refused at once (timeout 0); wait for it, or run with -e ddtree_rollout_lock_timeout=SECONDS "
                    "to queue.",
                )
            ),
        )
        return result
