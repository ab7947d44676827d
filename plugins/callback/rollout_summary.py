# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: rollout_summary
type: aggregate
short_description: Say at the end of a rollout which host is on which release, and why
version_added: 0.1.0
description:
  - Collects what the sglang_service role records per host (C(sglang_service_outcome)) and every
    host's failure, and prints a summary when the playbook ends, also when a failed canary aborted
    the run - hosts that were targeted but not reached keep the release they had.
  - With C(DDTREE_ROLLOUT_REPORT) set, also writes the summary there as JSON.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
requirements:
  - enable it with C(callbacks_enabled = ddtree.sglang.rollout_summary) (the repository's ansible.cfg does)
options:
  report:
    description: Path of a JSON report to write at the end.
    type: path
    env:
      - name: DDTREE_ROLLOUT_REPORT
"""

import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddtree.sglang.rollout_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.targeted = []
        self.outcomes = {}
        self.failures = {}
        self.active = False

    def v2_playbook_on_play_start(self, play):
        manager = play.get_variable_manager()
        hosts = manager._inventory.get_hosts(play.hosts) if manager else []
        for host in hosts:
            if host.name not in self.targeted:
                self.targeted.append(host.name)

    def _record(self, host, result):
        facts = result.get("ansible_facts") or {}
        if "sglang_service_outcome" in facts:
            self.active = True
            self.outcomes[host] = facts["sglang_service_outcome"]

    def v2_runner_on_ok(self, result):
        self._record(result._host.get_name(), result._result)

    def v2_runner_item_on_ok(self, result):
        self._record(result._host.get_name(), result._result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not ignore_errors:
            self.failures.setdefault(result._host.get_name(), "%s: %s" % (result._task.get_name(), result._result.get("msg", "")))

    def summary(self):
        rows = []
        for host in self.targeted:
            if host in self.outcomes:
                for service, outcome in sorted(self.outcomes[host].items()):
                    rows.append({"host": host, "service": service, "release": outcome.get("release"), "gate": outcome.get("gate"),
                                 "failed": host in self.failures})
            elif host in self.failures:
                rows.append({"host": host, "service": None, "release": None, "gate": "failed before the switch: " + self.failures[host],
                             "failed": True})
            else:
                rows.append({"host": host, "service": None, "release": None, "gate": "not reached: keeps the release it had",
                             "failed": False})
        return rows

    def v2_playbook_on_stats(self, stats):
        if not self.active and not self.failures:
            return
        rows = self.summary()
        self._display.banner("ROLLOUT SUMMARY")
        for row in rows:
            who = row["host"] + (" " + row["service"] if row["service"] else "")
            release = " release %s," % row["release"] if row["release"] else ""
            self._display.display("%s:%s %s" % (who, release, row["gate"]), color="red" if row["failed"] else None)
        path = self.get_option("report")
        if path:
            with open(os.path.expanduser(path), "w") as handle:
                json.dump({"hosts": rows, "failures": self.failures}, handle, indent=1, sort_keys=True)
