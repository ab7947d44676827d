# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sglang_service role's decisions about services across hosts (module_utils/service_nodes.py holds them)."""

from __future__ import annotations

from ansible_collections.ddtree.sglang.plugins.module_utils import service_nodes


def _restart_names(hostvars, hosts):
    names = {}
    for host in hosts or []:
        try:
            names[host] = hostvars[host].get("sglang_service_restart_names") or []
        except KeyError:
            continue
    return names


def node_start_order(start, hostvars, batch):
    """What this host (re)starts, worker ranks first (service_nodes.node_start_order)."""
    if not isinstance(start, list):
        # A plain error (Ansible reports a filter's exception with the task): importing ansible.errors here would
        # load the controller's warning handling into every test process that imports this filter.
        raise TypeError("node_start_order: the entries to start must be a list of plan entries")
    return service_nodes.node_start_order(start, _restart_names(hostvars, batch))


def node_group_problems(entries, host, hostvars, play_hosts, batch):
    """The problems of this host's services across hosts against their other nodes (service_nodes.group_problems)."""
    heads = [entry for entry in entries or [] if (entry.get("node_hosts") or [None])[0] == host]
    if not heads:
        return []  # no service across hosts is headed here: no other host's variables to read
    nodes = sorted({node for entry in heads for node in entry["node_hosts"]})
    facts = service_nodes.group_facts(hostvars, [node for node in nodes if node in (play_hosts or [])])
    return service_nodes.group_problems(host, heads, facts, play_hosts, batch)


def node_gate_results(gate_results, gate_entries, verdicts):
    """This host's gate results with each service across hosts judged as a whole (service_nodes.node_gate_results)."""
    return service_nodes.node_gate_results(gate_results, gate_entries, verdicts)


def node_entries(entries, across=True):
    """The plan entries (or results with the entry as item) of services across hosts, or (across=false) the others."""

    def spans(value):
        entry = value.get("item") if isinstance(value.get("item"), dict) else value
        return bool(entry.get("node_hosts"))

    return [value for value in entries or [] if spans(value) == bool(across)]


def node_verdict_inputs(entry, hostvars):
    """{head_gate, rank_checks, hosts} of one service across hosts (service_nodes.verdict_inputs)."""
    return service_nodes.verdict_inputs(entry, hostvars)


def node_rollback_gates(rolled_back):
    """The gate entries of a rollback of services across hosts (service_nodes.rollback_gates)."""
    return service_nodes.rollback_gates(rolled_back)


def node_serving(entries):
    """The entries that serve HTTP: all but the worker ranks of services across hosts."""
    return service_nodes.without_workers(entries)


class FilterModule:
    def filters(self):
        return {
            "node_start_order": node_start_order,
            "node_group_problems": node_group_problems,
            "node_gate_results": node_gate_results,
            "node_entries": node_entries,
            "node_verdict_inputs": node_verdict_inputs,
            "node_rollback_gates": node_rollback_gates,
            "node_serving": node_serving,
        }
