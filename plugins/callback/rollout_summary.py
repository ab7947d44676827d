# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: rollout_summary
type: aggregate
short_description: Say at the end of a rollout which host is on which release, and why; write reports
version_added: 0.1.0
description:
  - Records what the collection's modules did on each host (the rollout lock, the release built,
    each service's switch and rollback, every health gate with its measurements, the releases an
    interrupted rollout left without a passed gate, failures) and, when
    the playbook ends, prints a summary - also when a failed canary stopped the run (hosts that were
    targeted but not reached keep the release they had).
  - With I(report_dir) set, writes the report there as JSON (for machines) and Markdown (for a
    pull-request comment or a CI job summary), C(rollout.json) and C(rollout.md), or C(plan.json) and
    C(plan.md) for a check-mode run, which lists each host's pending changes with their diffs.
  - Beside the Markdown, its charts as SVG files it links to (C(rollout-*.svg)) - each gated service's tokens/s
    and acceptance length before and after, and each tuning's per setting and concurrency.
  - Stays silent in runs that use none of the collection's rollout modules.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
requirements:
  - enable it with C(callbacks_enabled = ddtree.sglang.rollout_summary) (the repository's ansible.cfg does)
options:
  report_dir:
    description: Directory to write the reports into (created if missing).
    type: path
    env:
      - name: DDTREE_ROLLOUT_REPORT_DIR
  history:
    description: Also keep every run's reports in C(<report_dir>/history/), named by time, revision and kind.
    type: bool
    default: false
    env:
      - name: DDTREE_ROLLOUT_REPORT_HISTORY
  report:
    description: Path of a JSON report to write at the end (in addition to I(report_dir)).
    type: path
    env:
      - name: DDTREE_ROLLOUT_REPORT
  revision:
    description: The Git revision being rolled out, for the report; by default the checkout's C(HEAD).
    type: str
    env:
      - name: DDTREE_ROLLOUT_REVISION
  trigger:
    description: What started the run (for example C(github push), C(pull timer)), for the report.
    type: str
    env:
      - name: DDTREE_ROLLOUT_TRIGGER
"""

import json
import os
import re
import shlex
import subprocess
import sys
import time

from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_report import (
    build_report,
    gate_kind,
    render_markdown,
    report_charts,
    summary_lines,
)

# Module results that tell the report what happened, by the task's resolved action.
ACTIONS = {
    "ddtree.sglang.rollout_lock": "lock",
    "ddtree.sglang.release": "release",
    "ddtree.sglang.service_link": "link",
    "ddtree.sglang.sglang_health": "gate",
    # A service across hosts: the verdict of the whole service, after its head's gate, on every node.
    "ddtree.sglang.service_node_verdict": "gate",
    "ddtree.sglang.service_gate_status": "verdicts",
    "ddtree.sglang.service_release_choice": "choice",
    "ddtree.sglang.service_shadow_compare": "shadow",
    "ddtree.sglang.service_autotune": "tuning",
}
START_FACT = "ddtree_rollout_release_ids_at_start"
# A task may say what it is to the report with the task variable ddtree_rollout_event: "bake" (a bake's
# re-check, not a deploy's gate), "measure" (a production service measured for its shadow: not its gate),
# "stop" or "pause" (a run_once fail that stops or pauses the whole rollout, not a failure of the host it
# ran on; ddtree.sglang.rollout_halt's result says it as rollout_event). docs/rollout-policy.md, docs/services.md.
EVENT_VAR = "ddtree_rollout_event"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _event(task):
    """The task's ddtree_rollout_event, its own or its include's (a bake includes the role's restart_and_gate.yml)."""
    try:
        return task.get_vars().get(EVENT_VAR)
    except Exception:  # a task object without vars (never seen; the report must not break a run)  # pylint: disable=broad-except
        return None


def _command():
    """This run's ansible-playbook command as typed, to resume a paused rollout with (under AWX: relaunch the job)."""
    return {"cwd": os.getcwd(), "argv": " ".join(shlex.quote(arg) for arg in sys.argv)}


def _write(path, text):
    """Write a report file whole: a reader never sees half of one."""
    temporary = "%s.tmp-%d" % (path, os.getpid())
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _write_charts(directory, prefix, charts):
    """The report's charts (rollout_report.report_charts) as <prefix><name>.svg beside its Markdown."""
    for chart in [chart for section in charts.values() for chart in section]:
        _write(os.path.join(directory, prefix + chart["name"] + ".svg"), chart["svg"])


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ddtree.sglang.rollout_summary"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.targeted = []
        self.events = []
        self.failed_items = {}
        self.active = False
        self.started = _now()
        self.playbook_dir = None

    def v2_playbook_on_start(self, playbook):
        self.playbook_dir = os.path.dirname(os.path.abspath(playbook._file_name))

    def v2_playbook_on_play_start(self, play):
        manager = play.get_variable_manager()
        # Every host the play targets, not only this batch's: with `serial`, ansible-playbook restricts the
        # inventory to each batch and starts the play again per batch, so a rollout that stops early would
        # otherwise leave its later batches' hosts out of the report instead of listing them "not reached".
        # (--limit still applies: it is a limit, not a restriction.)
        hosts = manager._inventory.get_hosts(play.hosts, ignore_restrictions=True) if manager else []
        for host in hosts:
            if host.name not in self.targeted:
                self.targeted.append(host.name)

    # ---- recording ----------------------------------------------------------------------------------

    def _host(self, result):
        """The host a result is about: the delegated one when a task ran on a targeted host for another (a bake)."""
        # An unreachable result carries no _ansible_delegated_vars; its task holds delegate_to, templated.
        delegated = (result._result.get("_ansible_delegated_vars") or {}).get(
            "ansible_delegated_host"
        ) or result._task.delegate_to
        return delegated if delegated in self.targeted else result._host.get_name()

    def _record(self, result, item=None):
        task = result._task
        host = self._host(result)
        data = result._result
        if START_FACT in (data.get("ansible_facts") or {}):
            self.active = True
            self.events.append({"host": host, "kind": "start", "result": data["ansible_facts"][START_FACT]})
        kind = ACTIONS.get(getattr(task, "resolved_action", None) or task.action)
        if kind == "gate":
            kind = gate_kind(_event(task))
        if kind and "results" not in data:
            self.active = True
            self.events.append(
                {
                    "host": host,
                    "kind": kind,
                    "task": task.get_name(),
                    "service": data.get("service"),
                    "rollback": kind == "link" and data.get("state") == "previous",
                    "result": data,
                }
            )
        if data.get("changed") and "results" not in data and context.CLIARGS.get("check"):
            diffs = data.get("diff") or []
            text = ANSI.sub("", self._get_diff(diffs)) if diffs else ""
            if all(line.startswith("diff skipped") for line in text.splitlines()):
                text = ""  # a binary or large file: the task's name says enough
            label = data.get("_ansible_item_label", item)
            self.events.append(
                {
                    "host": host,
                    "kind": "change",
                    "task": task.get_name(),
                    "item": label if label is None or isinstance(label, str) else json.dumps(label, default=str)[:200],
                    "diff": text,
                }
            )

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_item_on_ok(self, result):
        self._record(result, item=result._result.get("item"))

    def v2_runner_on_failed(self, result, ignore_errors=False):
        kind = ACTIONS.get(getattr(result._task, "resolved_action", None) or result._task.action)
        # A stop or pause says so in its task's vars, or in its result (ddtree.sglang.rollout_halt).
        event = result._result.get("rollout_event") or _event(result._task)
        if event in ("stop", "pause"):
            self.active = True
            self.events.append(
                {
                    "host": result._host.get_name(),
                    "kind": event,
                    "task": result._task.get_name(),
                    "result": {"msg": result._result.get("msg", "")},
                }
            )
            return
        if kind == "lock":
            self.active = True
            self.events.append({"host": result._host.get_name(), "kind": "lock", "result": result._result})
        if not ignore_errors:
            data = result._result
            items = self.failed_items.get((result._host.get_name(), result._task._uuid))
            if items:
                data = dict(data, msg=" | ".join(message for message in items if message) or data.get("msg", ""))
            self.events.append(
                {"host": result._host.get_name(), "kind": "failed", "task": result._task.get_name(), "result": data}
            )

    def v2_runner_item_on_failed(self, result):
        # A loop's own failure says only "One or more items failed": keep each item's message.
        self.failed_items.setdefault((result._host.get_name(), result._task._uuid), []).append(
            result._result.get("msg", "")
        )

    def v2_runner_on_unreachable(self, result):
        if _event(result._task) == "bake":
            # A bake's re-check that could not reach its host (the task ignores it): inconclusive, not a failure.
            # The re-check is a loop of one entry, which names its host (bake_host) and service.
            self.active = True
            entry = next(
                (
                    item.get("item")
                    for item in result._result.get("results") or []
                    if isinstance(item.get("item"), dict)
                ),
                {},
            )
            service = entry.get("name") or (result._task.args or {}).get("name")
            host = entry.get("bake_host") if entry.get("bake_host") in self.targeted else self._host(result)
            self.events.append(
                {
                    "host": host,
                    "kind": "bake",
                    "task": result._task.get_name(),
                    "service": service if isinstance(service, str) and "{{" not in service else None,
                    "result": dict(result._result, unreachable=True),
                }
            )
            return
        self.events.append(
            {
                "host": self._host(result),
                "kind": "unreachable",
                "task": result._task.get_name(),
                "result": result._result,
            }
        )

    # ---- the end ------------------------------------------------------------------------------------

    def _revision(self):
        revision = self.get_option("revision")
        if revision or not self.playbook_dir:
            return revision or None
        try:
            return (
                subprocess.run(
                    ["git", "-C", self.playbook_dir, "rev-parse", "HEAD"],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=10,
                ).stdout.strip()
                or None
            )
        except (OSError, subprocess.SubprocessError):
            return None

    def v2_playbook_on_stats(self, stats):
        if not self.active:
            return
        kind = "plan" if context.CLIARGS.get("check") else "rollout"
        meta = {
            "revision": self._revision(),
            "trigger": self.get_option("trigger") or None,
            "started": self.started,
            "finished": _now(),
        }
        if any(event["kind"] == "pause" for event in self.events):
            # Only for a paused run (the resume command), as typed: secrets belong in vault files, not in -e.
            meta["command"] = _command()
        report = build_report(self.events, self.targeted, kind=kind, meta=meta)
        self._display.banner("ROLLOUT SUMMARY" if kind == "rollout" else "ROLLOUT PLAN")
        for text, bad in summary_lines(report):
            self._display.display(text, color="red" if bad else None)
        document = json.dumps(report, indent=1, sort_keys=True, default=str) + "\n"
        report_dir = self.get_option("report_dir")
        if report_dir:
            os.makedirs(report_dir, exist_ok=True)
            charts = report_charts(report)
            markdown = render_markdown(report, charts, kind + "-")
            _write(os.path.join(report_dir, kind + ".json"), document)
            _write(os.path.join(report_dir, kind + ".md"), markdown)
            _write_charts(report_dir, kind + "-", charts)
            if self.get_option("history"):
                history = os.path.join(report_dir, "history")
                os.makedirs(history, exist_ok=True)
                stem = "%s-%s-%s" % (meta["finished"].replace(":", ""), (meta["revision"] or "unknown")[:12], kind)
                _write(os.path.join(history, stem + ".json"), document)
                _write(os.path.join(history, stem + ".md"), render_markdown(report, charts, stem + "-"))
                _write_charts(history, stem + "-", charts)
            self._display.display("reports: %s.{json,md}" % os.path.join(report_dir, kind))
        if self.get_option("report"):
            _write(os.path.expanduser(self.get_option("report")), document)
