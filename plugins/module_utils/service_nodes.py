# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Services across hosts: one SGLang server whose tensor-parallel group spans several nodes
(docs/services.md, "Services across hosts"; docs/decisions/multinode-services.md).

SGLang 0.5.23 runs one server on N nodes with the same command on each, plus `--nnodes N --node-rank i
--dist-init-addr HEAD:PORT`; rank 0 (the head) hosts the rendezvous at HEAD:PORT and alone serves HTTP.
A service declares `nodes` (its hosts in rank order, the head's address and dist-init port, the network
interface NCCL and Gloo use) identically on every node. This module holds the rules and decisions:

- the checks one host can make of its own declaration (`node_problems`) and the ones that need every
  node's facts at once (`node_group_problems`: the same declaration, stack and release everywhere, all
  nodes in one run and one batch);
- the flags and environment a node's rank gets;
- the start order (worker ranks before the head, which waits for them) and the verdict of the whole
  service, judged from the head's gate and every rank's unit (`group_verdict`).
"""

from __future__ import annotations

from ansible_collections.ddtree.sglang.plugins.module_utils.health_journal import clip_line
from ansible_collections.ddtree.sglang.plugins.module_utils.schema import option

# The `nodes` field's options, declared once (services.SERVICE_FIELDS and the role's argument spec use them).
NODE_FIELDS = {
    "hosts": option(
        "list", "The service's hosts (inventory names) in rank order; the first is the head (rank 0)", elements="str"
    ),
    "dist_init_addr": option("str", "The head's address the other nodes reach (SGLang's --dist-init-addr host)"),
    "dist_init_port": option("int", "The rendezvous port on the head (--dist-init-addr port)", default=20000),
    "interface": option("str", "The network interface between the nodes (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)"),
}
# Flags the collection renders for a node: a service may not set them itself.
NODE_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr")
# Parallelism other than TP: DFlash-family algorithms take TP only, and the collection spans nodes with TP alone.
NOT_TP_FLAGS = {
    "--pp-size": "pipeline parallelism",
    "--pipeline-parallel-size": "pipeline parallelism",
    "--dp-size": "data parallelism",
    "--data-parallel-size": "data parallelism",
    "--enable-dp-attention": "DP attention",
}
INTERFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# The head's gate result's fields a verdict of the whole service keeps (sglang_health's RETURN).
GATE_RESULT_KEYS = (
    "passed",
    "msg",
    "failed_stage",
    "failure_kind",
    "startup",
    "health",
    "chat",
    "baseline",
    "performance",
    "timings",
    "journal_excerpt",
)
# The gate's failure kind when a rank other than the one gated failed.
RANK_FAILED = "rank_failed"


def spans_nodes(service: dict) -> bool:
    """Whether the service is declared across hosts (a `nodes` field with hosts)."""
    return bool((service.get("nodes") or {}).get("hosts"))


def node_rank(service: dict, host: str) -> int | None:
    """This host's rank in the service's node group (None: a single-host service, or a host not in it)."""
    hosts = (service.get("nodes") or {}).get("hosts") or []
    return hosts.index(host) if host in hosts else None


def _flag_names(extra_args) -> list:
    return [str(arg).split("=", 1)[0] for arg in extra_args or []]


def node_problems(
    label: str,
    service: dict,
    host: str,
    services: list,
    interfaces: list | None = None,
    addresses: list | None = None,
) -> list:
    """The rules one host checks of a service declared across hosts; each names the host, the field and the fix.
    interfaces and addresses are the host's own (its facts); None skips those checks."""
    if not service.get("nodes"):
        return []
    nodes = service["nodes"]
    hosts = nodes.get("hosts") or []
    problems = []
    if len(hosts) < 2:
        problems.append(
            "%s: nodes.hosts %s names fewer than 2 hosts; list every host of the service in rank order (the head "
            "first), or remove nodes for a service on one host" % (label, hosts)
        )
    problems.extend(_declared_node_problems(label, nodes, host))
    problems.extend(_port_problems(label, service, services))
    gpus = service.get("gpus") or []
    tp_size = service.get("tp_size", 1)
    if hosts and gpus and tp_size != len(gpus) * len(hosts):
        problems.append(
            "%s: tp_size %s is not the service's GPUs on all nodes (%d GPU(s) on each of %d nodes); set tp_size "
            "to %d: a service across hosts runs tensor parallelism over every GPU of its nodes"
            % (label, tp_size, len(gpus), len(hosts), len(gpus) * len(hosts))
        )
    for flag in _flag_names(service.get("extra_args")):
        if flag in NODE_FLAGS:
            problems.append(
                "%s: extra_args holds %s, which the collection sets from nodes; remove it from extra_args"
                % (label, flag)
            )
        elif flag in NOT_TP_FLAGS:
            problems.append(
                "%s: extra_args holds %s (%s); a service across hosts runs tensor parallelism only (DFlash-family "
                "algorithms allow no other): remove it" % (label, flag, NOT_TP_FLAGS[flag])
            )
    if service.get("shadow_of"):
        problems.append("%s: a service across hosts cannot be a shadow; remove shadow_of or nodes" % label)
    if isinstance((service.get("speculative") or {}).get("autotune"), dict):
        problems.append(
            "%s: a service across hosts is not tuned by autotune; remove speculative.autotune and set budget "
            "and top_k" % label
        )
    problems.extend(_host_node_problems(label, nodes, host, interfaces, addresses))
    return problems


def _declared_node_problems(label: str, nodes: dict, host: str) -> list:
    """What nodes must say: each host once, this host among them, the head's address, the interface."""
    hosts = nodes.get("hosts") or []
    problems = []
    if len(set(hosts)) != len(hosts):
        problems.append("%s: nodes.hosts %s names a host twice; list each node once, in rank order" % (label, hosts))
    if hosts and host not in hosts:
        problems.append(
            "%s: nodes.hosts %s does not name %s; declare the service only on its nodes (a group's group_vars), "
            "or add %s to nodes.hosts" % (label, hosts, host, host)
        )
    if not nodes.get("dist_init_addr"):
        problems.append(
            "%s: nodes.dist_init_addr is not set; set it to the address of the head %s that the other nodes reach"
            % (label, hosts[0] if hosts else "(the first of nodes.hosts)")
        )
    if not nodes.get("interface"):
        problems.append(
            "%s: nodes.interface is not set; name the network interface between the nodes (NCCL and Gloo "
            "otherwise pick one themselves, often the wrong one)" % label
        )
    return problems


def _host_node_problems(label: str, nodes: dict, host: str, interfaces, addresses) -> list:
    """What this host must have: the interface nodes names, and (the head) the address the others reach."""
    hosts = nodes.get("hosts") or []
    problems = []
    interface = nodes.get("interface")
    if interface and interfaces is not None and interface not in interfaces:
        problems.append(
            "%s: nodes.interface %s does not exist on %s (its interfaces: %s); set the interface of the network "
            "between the nodes" % (label, interface, host, ", ".join(sorted(interfaces)) or "none")
        )
    address = nodes.get("dist_init_addr")
    if address and addresses is not None and hosts and hosts[0] == host and address not in addresses:
        problems.append(
            "%s: nodes.dist_init_addr %s is not an address of the head %s (its addresses: %s); set it to the "
            "head's address on the interface %s" % (label, address, host, ", ".join(addresses) or "none", interface)
        )
    return problems


def _port_problems(label: str, service: dict, services: list) -> list:
    port = service["nodes"].get("dist_init_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        return ["%s: nodes.dist_init_port %r must be a port from 1024 to 65535" % (label, port)]
    problems = []
    for other in services:
        if other.get("port") == port:
            problems.append(
                "%s: nodes.dist_init_port %s collides with the HTTP port of service %s; give the rendezvous a "
                "port of its own (e.g. %d)" % (label, port, other.get("name"), port + 10000 if port < 55535 else 20000)
            )
        other_nodes = other.get("nodes") or {}
        if other is not service and other_nodes.get("dist_init_port") == port:
            problems.append(
                "%s: nodes.dist_init_port %s is also the dist-init port of service %s; give each service its own"
                % (label, port, other.get("name"))
            )
    return problems


def node_group_problems(service_name: str, declared_hosts: list, nodes_facts: dict, batch: list | None = None) -> list:
    """The rules that need every node at once. nodes_facts: {host: {service, stack_id, release_id}} of the nodes
    in this run (`service` the host's declaration, None when it declares no such service); batch: the hosts of
    this batch of the rollout (None: not batched)."""
    problems = []
    label = "service %s (nodes %s)" % (service_name, ", ".join(declared_hosts))
    missing = [host for host in declared_hosts if host not in nodes_facts]
    if missing:
        problems.append(
            "%s: %s not in this run (limited out or unreachable); a service across hosts switches on all its nodes "
            "at once: run them together (-l %s)" % (label, " and ".join(missing), ",".join(declared_hosts))
        )
    present = [host for host in declared_hosts if host in nodes_facts]
    if batch is not None:
        outside = [host for host in present if host not in batch]
        if outside and len(outside) < len(present):
            problems.append(
                "%s: %s not in the same rollout batch as the others; give the rollout policy a batch that holds "
                "all %d nodes (e.g. batches: [%d, ...])"
                % (label, " and ".join(outside), len(declared_hosts), len(declared_hosts))
            )
        # A node of another batch has no facts of this run yet: compare the nodes of this batch.
        present = [host for host in present if host in batch]
    if not present:
        return problems
    head = present[0]
    reference = nodes_facts[head]
    for host in present[1:]:
        facts = nodes_facts[host]
        if facts.get("service") is None:
            problems.append(
                "%s: %s declares no service %s; declare it on every node of nodes.hosts (one group's group_vars)"
                % (label, host, service_name)
            )
            continue
        fields = sorted(
            key
            for key in set(facts["service"]) | set(reference.get("service") or {})
            if facts["service"].get(key) != (reference.get("service") or {}).get(key)
        )
        if fields:
            problems.append(
                "%s: %s declares it differently from %s in %s; declare it once, in the group_vars of the nodes' group"
                % (label, host, head, ", ".join(fields))
            )
        for key, what, fix in (
            ("stack_id", "stack", "give the nodes the same sglang_stack_pinset (and the same GPU generation's pins)"),
            ("release_id", "release", "build the release from one overlay source for the same stack on every node"),
        ):
            if facts.get(key) != reference.get(key):
                problems.append(
                    "%s: %s runs %s %s, %s runs %s; every node needs the same %s: %s"
                    % (label, host, what, facts.get(key), head, reference.get(key), what, fix)
                )
    return problems


def node_flags(service: dict, host: str) -> list:
    """The flags that make one SGLang server of a node's process: empty for a service on one host."""
    rank = node_rank(service, host)
    if rank is None:
        return []
    nodes = service["nodes"]
    address = nodes["dist_init_addr"]
    if ":" in address and not address.startswith("["):
        address = "[%s]" % address
    return [
        "--nnodes",
        str(len(nodes["hosts"])),
        "--node-rank",
        str(rank),
        "--dist-init-addr",
        "%s:%s" % (address, nodes.get("dist_init_port", NODE_FIELDS["dist_init_port"]["default"])),
    ]


def node_environment(service: dict) -> dict:
    """NCCL's and Gloo's interface, so neither picks one itself."""
    interface = (service.get("nodes") or {}).get("interface")
    return {name: interface for name in INTERFACE_VARIABLES} if interface else {}


def split_start_order(entries: list) -> tuple:
    """(worker ranks, the rest) of plan entries to (re)start: workers start first, the head waits for them."""
    workers = [entry for entry in entries or [] if (entry.get("node_rank") or 0) > 0]
    return workers, [entry for entry in entries or [] if (entry.get("node_rank") or 0) == 0]


def rank_failure(rank_check: dict) -> str | None:
    """Why a rank's unit counts as failed since its start (None: it ran throughout). rank_check: a rank's unit
    state since the gate's start: {host, rank, active, restarts, fatal (journal lines)}."""
    if not rank_check.get("active"):
        return "its unit is not running (%s)" % (rank_check.get("state") or "inactive")
    if rank_check.get("restarts"):
        return "its unit restarted %s time(s) since the start" % rank_check["restarts"]
    if rank_check.get("fatal"):
        return "its journal has a fatal line: %s" % rank_check["fatal"][0]
    return None


def group_verdict(service_name: str, head_gate: dict | None, rank_checks: list, hosts: list | None = None) -> dict:
    """The verdict of a whole service across hosts: it passes when the head's gate passed and every rank ran
    throughout. A rank that died is named with its host and journal, before the head's own failure (the head
    exits when a peer dies, so its failure is the consequence). rank_checks: each node's rank check; hosts:
    the nodes in rank order, each of which must have answered (a node that failed earlier in the run did not)."""
    checked = {check.get("host") for check in rank_checks or []}
    missing = [(rank, host) for rank, host in enumerate(hosts or []) if host not in checked]
    if missing:
        rank, host = missing[0]
        return {
            "passed": False,
            "failed_stage": "ranks",
            "failure_kind": RANK_FAILED,
            "failed_host": host,
            "failed_rank": rank,
            "msg": "%s: rank %d on %s was not checked (the node failed or was unreachable earlier in this run)"
            % (service_name, rank, host),
        }
    failed = []
    for check in sorted(rank_checks or [], key=lambda check: check.get("rank") or 0):
        reason = rank_failure(check)
        if reason and (check.get("rank") or 0) > 0:
            failed.append((check, reason))
    if failed:
        check, reason = failed[0]
        journal = check.get("journal") or []
        return {
            "passed": False,
            "failed_stage": "ranks",
            "failure_kind": RANK_FAILED,
            "failed_host": check.get("host"),
            "failed_rank": check.get("rank"),
            "journal_excerpt": journal,
            "msg": "%s: rank %s on %s failed: %s (journal of sglang-%s.service on %s: %s)"
            % (
                service_name,
                check.get("rank"),
                check.get("host"),
                reason,
                service_name,
                check.get("host"),
                " | ".join(journal[-5:]) or "empty",
            ),
        }
    if head_gate is None:
        return {
            "passed": False,
            "failed_stage": "ranks",
            "failure_kind": RANK_FAILED,
            "msg": "%s: the head's gate did not run (its node failed before it)" % service_name,
        }
    if not head_gate.get("passed"):
        return {
            "passed": False,
            "failed_stage": head_gate.get("failed_stage"),
            "failure_kind": head_gate.get("failure_kind"),
            "msg": "%s: the head's gate failed: %s" % (service_name, head_gate.get("msg")),
        }
    return {"passed": True, "msg": "%s: the head's gate passed and every rank ran throughout" % service_name}


def node_start_order(start: list, restarts_by_host: dict) -> dict:
    """What this host (re)starts, in which task: {workers, rest}, plan entries each with its systemd `state`.

    start: the plan entries to put in their `state` (restarted or started). A service across hosts restarts on
    every node when it restarts on any (restarts_by_host: {host: [names]} of the nodes in this batch): a rank
    restarted alone says goodbye to its group and the others end with it. Worker ranks (node_rank > 0) come
    first, in a task of their own; the heads and the services of one host after them.
    """
    restarted_anywhere = {name for names in (restarts_by_host or {}).values() for name in names or []}
    ordered = [
        dict(entry, state="restarted") if entry.get("node_hosts") and entry["name"] in restarted_anywhere else entry
        for entry in start or []
    ]
    workers, rest = split_start_order(ordered)
    return {"workers": workers, "rest": rest}


def group_facts(hostvars, hosts: list) -> dict:
    """{host: {services: {name: declaration}, stack_id, release_ids: {name: id}}} of the given hosts, from their
    variables (hostvars, or any mapping of host to its variables); a host without them is left out."""
    facts = {}
    for host in hosts or []:
        try:
            variables = hostvars[host]
        except KeyError:
            continue
        stack = variables.get("sglang_stack_active") or {}
        releases = (variables.get("sglang_service_releases") or {}).get("services") or {}
        facts[host] = {
            "services": {service.get("name"): service for service in variables.get("sglang_services") or []},
            "stack_id": stack.get("id"),
            "release_ids": {name: (choice or {}).get("release_id") for name, choice in releases.items()},
        }
    return facts


def group_problems(host: str, entries: list, facts: dict, play_hosts: list, batch: list) -> list:
    """node_group_problems of every service across hosts in this host's plan; facts: group_facts of the play's
    hosts. Each service is judged by its head's node alone, so a problem is reported once."""
    problems = []
    for entry in entries or []:
        hosts = entry.get("node_hosts") or []
        if not hosts or hosts[0] != host:
            continue
        name = entry["name"]
        nodes = {
            node: {
                "service": facts[node]["services"].get(name),
                "stack_id": facts[node]["stack_id"],
                "release_id": facts[node]["release_ids"].get(name),
            }
            for node in hosts
            if node in facts and node in (play_hosts or [])
        }
        problems.extend(node_group_problems(name, hosts, nodes, batch))
    return problems


def rank_check(host: str, rank: int, properties: dict, lines: list, fatal_matches: list) -> dict:
    """One rank's unit since the start: {host, rank, active, state, restarts, fatal, journal}. properties:
    systemctl show's; lines: its journal since the start; fatal_matches: the fatal signatures found in it."""
    restarts = sum(1 for line in lines or [] if "Scheduled restart job" in line)
    return {
        "host": host,
        "rank": rank,
        "active": properties.get("ActiveState") == "active",
        "state": "%s/%s" % (properties.get("ActiveState"), properties.get("SubState")),
        "restarts": restarts,
        "fatal": [match.get("line") for match in fatal_matches or []],
        "journal": [clip_line(line) for line in (lines or [])[-20:]],
    }


def node_gate_results(gate_results: list, gate_entries: list, verdicts: list) -> list:
    """The gate results of this host with every service across hosts judged as a whole: the head's own gate
    result and each worker's (which ran no gate: it serves no HTTP) become the group's verdict, so a failure on
    any node rolls back every node. verdicts: the service_node_verdict results ({name, passed, ...})."""
    by_name = {verdict.get("name"): verdict for verdict in verdicts or []}
    results = [result for result in gate_results or [] if not (result.get("item") or {}).get("node_hosts")]
    for entry in gate_entries or []:
        if not entry.get("node_hosts"):
            continue
        own = next((r for r in gate_results or [] if (r.get("item") or {}).get("name") == entry["name"]), {})
        verdict = by_name.get(entry["name"]) or {"passed": False, "msg": "%s: not judged" % entry["name"]}
        result = dict(own, **{key: value for key, value in verdict.items() if key != "name"})
        result.update(item=entry, release_id=entry.get("release_id"))
        results.append(result)
    return results


def verdict_inputs(entry: dict, hostvars) -> dict:
    """{head_gate, rank_checks, hosts} of one service across hosts, from the nodes' variables: the head's gate
    result (its `sglang_service_gate_run`) and each node's rank check (its `sglang_service_rank_run`)."""
    name, hosts = entry["name"], entry.get("node_hosts") or []
    head_gate, checks = None, []
    for host in hosts:
        try:
            variables = hostvars[host]
        except KeyError:
            continue
        for result in (variables.get("sglang_service_rank_run") or {}).get("results") or []:
            if (result.get("item") or {}).get("name") == name and "rank" in result:
                checks.append(
                    {
                        key: result.get(key)
                        for key in ("host", "rank", "active", "state", "restarts", "fatal", "journal")
                    }
                )
        if host == hosts[0]:
            for result in (variables.get("sglang_service_gate_run") or {}).get("results") or []:
                if (result.get("item") or {}).get("name") == name and "passed" in result:
                    # The gate's result, its measurements included (the rollout's report shows them).
                    head_gate = {key: value for key, value in result.items() if key in GATE_RESULT_KEYS}
    return {"head_gate": head_gate, "rank_checks": checks, "hosts": hosts}


def rollback_gates(rolled_back: list) -> list:
    """The gate entries of a rollback of services across hosts: each plan entry with the release it went back to
    (rolled_back: the service_link loop's results, each item a failed gate result with its plan entry)."""
    return [dict(result["item"]["item"], release_id=result.get("release_id")) for result in rolled_back or []]


def without_workers(entries: list) -> list:
    """The entries that serve HTTP: every one but the worker ranks of services across hosts."""
    return [entry for entry in entries or [] if not (entry.get("node_rank") or 0)]


def ip_addresses(ip_json: str) -> list | None:
    """The addresses of `ip -j address` output (loopback included), or None when it cannot be read."""
    import json

    try:
        links = json.loads(ip_json or "")
    except ValueError:
        return None
    return [info["local"] for link in links or [] for info in link.get("addr_info") or [] if info.get("local")]
