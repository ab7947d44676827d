# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What Prometheus is told about the fleet's SGLang services (docs/monitoring.md).

Two documents, both made from the inventory and what the hosts recorded:

- the file-based service discovery targets (file_sd JSON): one target per service that exports its metrics,
  at ADDRESS:PORT, with the labels host, service, algorithm and release_id;
- the gate's records as recording rules of constant value (a Prometheus rules file): per service, the
  tokens/s its current release's health gate measured and the floor below which the live throughput alerts,
  the acceptance-length floor of a speculative service, and whether the gate found the current release's
  output degenerate. The shipped alert rules compare the live series with these
  (docs/decisions/monitoring-gate-records.md says why rules and not a textfile).
"""

from __future__ import annotations

from ansible_collections.ddtree.sglang.plugins.module_utils.service_nodes import node_rank

# The series the gate's records become (the shipped rules and dashboard read these names).
GATE_TOKENS_PER_SECOND = "ddtree:gate_tokens_per_second"
THROUGHPUT_FLOOR = "ddtree:throughput_floor_tokens_per_second"
ACCEPT_LENGTH_FLOOR = "ddtree:spec_accept_length_floor"
GATE_DEGENERATE = "ddtree:gate_degenerate_output"
RECORDS_GROUP = "ddtree_sglang_gate_records"
# The gate's failure kind for degenerate output (health_gate.py's stage_degenerate and baseline check).
DEGENERATE_KIND = "degenerate"


def _algorithm(service: dict) -> str:
    return str((service.get("speculative") or {}).get("algorithm") or "NONE")


def scraped_services(services: list | None, host: str | None = None) -> list:
    """The services that export metrics (metrics: true, the default) on host, in declaration order. A service
    across hosts serves HTTP, /metrics included, on its head only: its worker ranks have nothing to scrape."""
    return [
        service for service in services or [] if service.get("metrics", True) and (node_rank(service, host) or 0) == 0
    ]


def target_groups(hosts: dict, status: dict, address: str = "") -> list:
    """The file_sd document: [{"targets": ["ADDRESS:PORT"], "labels": {...}}], one per scraped service.

    hosts: {host: [service declarations]}; status: {host: {service: {"release_id": ...}}} as
    ddtree.sglang.service_gate_status returns it; address: where every target is scraped (a Prometheus
    on the host it scrapes: 127.0.0.1), or empty for each host's inventory name.
    """
    groups = []
    for host in sorted(hosts):
        for service in scraped_services(hosts[host], host):
            name = service["name"]
            labels = {"host": host, "service": name, "algorithm": _algorithm(service)}
            release_id = ((status.get(host) or {}).get(name) or {}).get("release_id")
            if release_id:
                labels["release_id"] = str(release_id)
            groups.append({"targets": ["%s:%d" % (address or host, int(service["port"]))], "labels": labels})
    return groups


def _record(name: str, value: float, labels: dict) -> dict:
    return {"record": name, "expr": "vector(%s)" % _number(value), "labels": dict(labels)}


def _number(value: float) -> str:
    """A float as PromQL reads it, without noise (12.5, 1.3, 0)."""
    return ("%.6f" % float(value)).rstrip("0").rstrip(".") or "0"


def gate_records(hosts: dict, status: dict, throughput_margin: float, accept_length_floor: float) -> dict:
    """The rules document of the gate's records, for the services target_groups scrapes.

    Per service with a current release: GATE_DEGENERATE (1 when that release's gate verdict failed as
    degenerate output, else 0); with the gate's measured tokens/s, GATE_TOKENS_PER_SECOND and
    THROUGHPUT_FLOOR (that number times 1 - throughput_margin). Per speculative service: ACCEPT_LENGTH_FLOOR.
    """
    if not 0 <= float(throughput_margin) < 1:
        raise ValueError("throughput_margin must be in [0, 1), got %r" % (throughput_margin,))
    if float(accept_length_floor) < 1:
        raise ValueError("accept_length_floor must be at least 1 (no draft accepted), got %r" % (accept_length_floor,))
    rules = []
    for host in sorted(hosts):
        for service in scraped_services(hosts[host], host):
            name = service["name"]
            labels = {"host": host, "service": name}
            if _algorithm(service) != "NONE":
                rules.append(_record(ACCEPT_LENGTH_FLOOR, accept_length_floor, labels))
            entry = (status.get(host) or {}).get(name) or {}
            release_id = entry.get("release_id")
            if not release_id:
                continue  # nothing deployed yet: no gate has measured it
            labels["release_id"] = str(release_id)
            verdict = entry.get("verdict") or {}
            degenerate = verdict.get("verdict") == "failed" and verdict.get("failure_kind") == DEGENERATE_KIND
            rules.append(_record(GATE_DEGENERATE, 1 if degenerate else 0, labels))
            measured = (verdict.get("measurements") or {}).get("tokens_per_second")
            if verdict.get("verdict") == "passed" and measured:
                rules.append(_record(GATE_TOKENS_PER_SECOND, measured, labels))
                rules.append(_record(THROUGHPUT_FLOOR, float(measured) * (1 - float(throughput_margin)), labels))
    return {"groups": [{"name": RECORDS_GROUP, "rules": rules}]}


def status_by_host(results: list) -> dict:
    """{host: services} from a looped, delegated ddtree.sglang.service_gate_status's results (each with its
    `item`, the host it ran for); a skipped, failed or unreachable entry gives that host no status."""
    status = {}
    for result in results or []:
        if result.get("skipped") or result.get("failed") or result.get("unreachable"):
            continue
        status[str(result.get("item"))] = result.get("services") or {}
    return status
