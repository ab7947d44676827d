#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_plan
short_description: Validate SGLang services declared as data and turn them into flags and environments
version_added: 0.1.0
description:
  - Checks the rules that need several fields or the host - unique names and ports, GPU indices that
    exist on the host and are not shared between services, C(tp_size) dividing the GPU count, a known
    speculative algorithm, a draft model for the algorithms that need one, DDTree budget and top-k
    at least 1, a valid C(speculative.autotune) (DDTREE only, no fixed budget or top-k beside it) - and
    fails listing every broken rule, each naming the service, the field and the value.
  - Refuses a shadow (C(shadow_of)) of an unknown service, of itself or of another shadow, one without
    spare GPUs (naming the GPUs that are free), one whose algorithm is not C(DDTREE), and a pinned one.
  - Refuses a release pin on a service whose algorithm does not load the overlay, and a pin that is
    no release id or revision.
  - Refuses a secret flag (C(--api-key), C(--admin-api-key)) in C(extra_args), which would put it in the
    server's command line, readable by every local user; C(api_key) is the way.
  - Runs a DDTREE service on SGLang's Triton attention backend - the only one proven with DDTREE's tree mask -
    adding C(--attention-backend triton) to its flags when its C(extra_args) do not set it, and refuses another
    backend for it (C(--attention-backend), C(--prefill-attention-backend) or C(--decode-attention-backend), in
    full or abbreviated), naming the flag, the value and the fix. Other algorithms keep the backend they declare.
  - Returns, per service, its systemd unit name, its C(launch_server) flags and its environment, never
    the API key (only whether there is one, C(has_api_key)).
  - A service that declares C(speculative.autotune) runs the setting its tuning chose
    (M(ddtree.sglang.service_autotune)), given in O(tuned) - DDTREE with the tuned budget and top-k, or
    DFLASH - with the tuned speed floor for its gate unless it sets C(health.min_tokens_per_second); without
    a tuned choice the plan fails, so an unmeasured setting never runs.
  - Refuses, before any rule above, a field no service has (naming the service, the field and the closest
    one, C(did you mean budget?)), a value of the wrong type, outside its choices or out of its range (ports 1-65535,
    a budget that is no integer or schedule) - on the controller, before the module runs (its action plugin).
  - Changes nothing; run it before anything changes on a host.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  services:
    description: The services (the C(sglang_services) variable; see the sglang_service role).
    type: list
    elements: dict
    required: true
    suboptions:
      name: {description: Service name (unit C(sglang-<name>.service)), type: str, required: true}
      model_path: {description: Target model path on the host, type: str, required: true}
      served_model_name: {description: Name in C(/v1/models); defaults to I(name), type: str}
      draft_model_path:
        description:
          - Draft model path (needed by DDTREE, DFLASH, EAGLE, EAGLE3, STANDALONE)
        type: str
      gpus: {description: "GPU indices the service uses (exclusive to it)", type: list, elements: int, required: true}
      tp_size: {description: "Tensor-parallel size; divides the number of GPUs", type: int, default: 1}
      host: {description: Address to listen on, type: str, default: 127.0.0.1}
      port: {description: "Port to listen on (1-65535, unique on the host)", type: int, required: true}
      speculative:
        description:
          - Speculative decoding - the algorithm and its parameters, or C(autotune) (DDTREE only; see O(tuned) and
            docs/autotune.md).
        type: dict
        default: {algorithm: NONE}
        suboptions:
          algorithm:
            description:
              - The speculative algorithm - NONE (unset), EAGLE, EAGLE3, NEXTN, DFLASH, DSPARK, UNO, FROZEN_KV_MTP,
                STANDALONE, NGRAM or DDTREE; another is refused naming the service.
            type: str
          budget:
            description:
              - "DDTREE - tree nodes besides the root (1-511), or a schedule by batch size such as C({1: 63, 16: 15})
                (or the flag's text C(1:63,16:15)). A number in quotes is refused."
            type: raw
          top_k: {description: DDTREE - candidates per draft position (>= 1), type: int}
          allow_hybrid_unsafe:
            description:
              - DDTREE - run a hybrid target (C(--speculative-ddtree-allow-hybrid-unsafe))
            type: bool
          num_steps: {description: "EAGLE-style algorithms - draft steps (C(--speculative-num-steps), >= 1)", type: int}
          eagle_topk:
            description:
              - EAGLE-style algorithms - top-k per step (C(--speculative-eagle-topk), >= 1)
            type: int
          num_draft_tokens:
            description: EAGLE-style algorithms - draft tokens (C(--speculative-num-draft-tokens), >= 1)
            type: int
          autotune:
            description:
              - DDTREE only - the budget and top-k are chosen per host and candidate release from measurements
                (M(ddtree.sglang.service_autotune)) - the fastest grid setting that beats DFLASH by C(min_gain) at
                every declared concurrency, else DFLASH - so C(budget) and C(top_k) must not be set beside it (pin
                one with a one-value list), nor C(release). A service is tuned again only when its tuning key
                changes (docs/autotune.md).
              - C(gpus) and C(port) say where the settings are measured - each in turn as a temporary
                instance C(<name>-autotune) on these spare GPUs (as many as the service's, used by no service of the
                host) and this port, before the candidate takes traffic; it is removed afterwards. A host without
                spare GPUs sets C(own_gpus=true) instead - the instance runs on the service's own GPUs and port, and
                the service is stopped while its grid runs, in the host's rollout window (its batch; the canary's
                first), then started again (a host-side timer starts it if the run dies midway). One of the two is
                required.
            type: dict
            suboptions:
              budgets:
                description: Budgets to measure, distinct integers >= 1 (default C([7, 15, 31, 63, 127])).
                type: list
                elements: int
              top_k:
                description:
                  - Top-k values to measure, distinct integers >= 1 (default C([8])); at most 16 settings in all.
                type: list
                elements: int
              concurrency:
                description:
                  - Requests at a time each setting is measured with, distinct integers >= 1
                    (default C([1, 16, 64])).
                type: list
                elements: int
              min_gain:
                description:
                  - Share DDTREE must beat DFLASH by at every concurrency, in C([0, 1)) (default C(0.03))
                type: float
              gpus: {description: Spare GPUs the temporary instances run on, type: list, elements: int}
              port: {description: The temporary instances' port (1-65535), type: int}
              own_gpus:
                description:
                  - Measure on the service's own GPUs and port, stopped in the host's rollout window
                type: bool
      api_key:
        description:
          - API key for the OpenAI-compatible endpoints; keep it in Ansible Vault. Never returned.
          - The sglang_service role writes it only to C(<sglang_service_config_dir>/<name>.api-key) (C(0600) root),
            which systemd opens as the server's standard input; never in its command line, environment, journal, or
            any output.
        type: str
      shadow_of:
        description:
          - The production service on this host this one is the shadow of - it runs the candidate beside
            it on spare GPUs and a port of its own, without production traffic. A shadow's algorithm is
            C(DDTREE) and it follows the candidate.
        type: str
      shadow_max_slowdown:
        description:
          - A shadow's tolerance - the largest share of its production service's tokens/s it may lose and
            still be promoted (C(0.1) - at least 90%). Unset, the role's C(sglang_service_shadow_max_slowdown).
        type: float
      release:
        description:
          - C(candidate) (follow the rollout's candidate release), or a release id or source revision
            to pin the service to (M(ddtree.sglang.service_release_choice) resolves it on the host).
          - Only services whose algorithm loads the overlay (C(DDTREE)) may pin; the others run the base release.
        type: str
        default: candidate
      metrics:
        description:
          - Export SGLang's Prometheus metrics (C(--enable-metrics)); the monitoring scrapes them (docs/monitoring.md).
        type: bool
        default: true
      extra_args: {description: More launch_server flags, type: list, elements: str, default: []}
      environment:
        description:
          - More environment variables for the service's environment file (C(0600)), by name.
          - A name is letters, digits and C(_), not starting with a digit; a value is a string (a number is written as
            it reads). A value of true or false, unset, a mapping or a list, or one with a line break is refused,
            naming the service and the variable.
        type: dict
        default: {}
      health:
        description:
          - This service's own health-gate settings, over O(gate_defaults) (each is the
            M(ddtree.sglang.sglang_health) option of the same name). Unset, the gate's defaults apply.
        type: dict
        default: {}
        suboptions:
          start_timeout:
            description:
              - Seconds the whole start may take (the role's default C(sglang_service_start_timeout))
            type: float
          no_progress_timeout:
            description:
              - Seconds without a journal progress marker (the role's default
                C(sglang_service_no_progress_timeout)).
            type: float
          min_tokens_per_second: {description: Floor for tokens/s, type: float}
          min_accept_length: {description: Floor for the acceptance length, type: float}
          max_regression:
            description:
              - Largest allowed drop from the previous release's numbers (the gate's default C(0.5))
            type: float
          baseline_tolerance:
            description:
              - Share of a baseline's length allowed to differ at its end (the gate's default C(0))
            type: float
      nodes:
        description:
          - The hosts one server spans (SGLang's C(--nnodes), C(--node-rank), C(--dist-init-addr)), declared the
            same on each of them (docs/services.md, "Services across hosts"). Unset, the service runs on this host
            alone.
        type: dict
        suboptions:
          hosts:
            description: The service's hosts (inventory names) in rank order; the first is the head (rank 0).
            type: list
            elements: str
          dist_init_addr: {description: The head's address the other nodes reach, type: str}
          dist_init_port: {description: The rendezvous port on the head, type: int, default: 20000}
          interface:
            description: The network interface between the nodes (NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME).
            type: str
      guard:
        description: The guard's settings after rollouts (docs/guard.md); unset, its defaults.
        type: dict
        default: {}
        suboptions:
          enabled: {description: Watch this DDTREE service after rollouts (default true), type: bool}
          window: {description: Seconds one watch spans (default 60), type: float}
          probe_requests: {description: Greedy /generate requests of the probe (default 4), type: int}
          max_tokens: {description: max_new_tokens of each probe request (default 64), type: int}
          margin: {description: Allowed share below DFLASH's tokens/s at this load (default 0.05), type: float}
          collapse_ratio: {description: Share of the recorded acceptance below which it fell (default 0.5), type: float}
          hold_down: {description: Seconds after a switch with no other switch (default 3600), type: float}
          fallback: {description: "What a switch runs (dflash, the default)", type: str}
  gpu_indices:
    description: The host's GPU indices (from M(ddtree.sglang.gpu_facts)).
    type: list
    elements: int
    required: true
  gate_defaults:
    description:
      - Health-gate settings for services that do not set their own in C(health) (the role passes
        C(start_timeout) and C(no_progress_timeout)).
    type: dict
    default: {}
    suboptions:
      start_timeout: {description: Seconds the whole start may take, type: float}
      no_progress_timeout: {description: Seconds without a journal progress marker, type: float}
      min_tokens_per_second: {description: Floor for tokens/s, type: float}
      min_accept_length: {description: Floor for the acceptance length, type: float}
      max_regression: {description: Largest allowed drop from the previous release's numbers, type: float}
      baseline_tolerance: {description: Share of a baseline's length allowed to differ at its end, type: float}
  tuned:
    description:
      - Per service name, the choice of its tuning (the C(choice) M(ddtree.sglang.service_autotune) returns),
        for the services that declare C(speculative.autotune). Ignored for the others.
    type: dict
    default: {}
  untuned:
    description:
      - What to do with a service that declares C(speculative.autotune) but has no choice in O(tuned).
      - C(fail) refuses the plan, so an unmeasured setting never reaches a unit.
      - C(defer) validates it with the others but leaves it out of RV(services) and names it in RV(untuned) -
        the role validates every service before anything changes, builds the releases, tunes, and plans again
        with O(tuned) (docs/autotune.md).
    type: str
    choices: [fail, defer]
    default: fail
  host:
    description: The host's name, for messages, and its rank in a service across hosts (O(services[].nodes)).
    type: str
    default: host
  interfaces:
    description:
      - The host's network interfaces; a service across hosts must name one of them.
      - Unset, the module reads them on the host when a service spans hosts.
    type: list
    elements: str
  addresses:
    description:
      - The host's addresses (loopback included); the head of a service across hosts must own its dist_init_addr.
      - Unset, the module reads them on the host (C(ip -j address)) when a service spans hosts.
    type: list
    elements: str
  state_root:
    description:
      - The services' state directory on the host (C(<state_root>/<name>/guard.json)). A DDTREE service the guard
        switched to DFLASH runs DFLASH in the plan while its speculative settings are those it was switched away
        from (RV(guarded); docs/guard.md). Unset, every service runs as declared.
    type: path
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
"""

EXAMPLES = r"""
- name: Validate this host's services
  ddtree.sglang.service_plan:
    services: "{{ sglang_services }}"
    gpu_indices: "{{ ansible_facts.ddtree_gpu.gpus | map(attribute='index') | list }}"
    gate_defaults: {start_timeout: 900, no_progress_timeout: 120}
    host: "{{ inventory_hostname }}"
  register: plan
"""

RETURN = r"""
services:
  description:
    - Per service, in order. C(gate) holds the health-gate settings of every gate of it; C(compare_gate), on a service
      a shadow runs beside, those it is measured with for the shadow's comparison (acceptance from one C(/generate)).
  returned: success
  type: list
  elements: dict
  sample:
    - name: coder
      unit: sglang-coder.service
      flags: [--model-path, /models/coder, --served-model-name, coder, --host, 127.0.0.1, --port, "30000", --tp-size,
        "2"]
      exec_args: --model-path /models/coder --served-model-name coder --host 127.0.0.1 --port 30000 --tp-size 2
      environment: {CUDA_VISIBLE_DEVICES: "0,1"}
      algorithm: DDTREE
      loads_overlay: true
      release: candidate
      shadow_of: null
      shadow_max_slowdown: null
      gpus: [0, 1]
      port: 30000
      host: 127.0.0.1
      has_api_key: true
      served_model_name: coder
      gate: {start_timeout: 1800, no_progress_timeout: 120}
      compare_gate: {start_timeout: 1800, no_progress_timeout: 120, accept_length_from: generate}
      tuned: {algorithm: DDTREE, budget: 8, top_k: 4, status: ddtree, speed_floor: 112.4}
needs_base_release:
  description:
    - Whether a service runs the stack's base release (its algorithm does not load the overlay), or may (a
      service still to tune, whose DFLASH runs there).
  returned: success
  type: bool
guarded:
  description:
    - The services that run their fallback (DFLASH) instead of their declaration because the guard switched them
      (C(guard.json) under O(state_root)) and their speculative settings are unchanged since, each with why
      (docs/guard.md).
  returned: success
  type: dict
  sample: {coder: "the guard switched it to DFLASH at 2026-12-04T18:08:18Z (...); it stays on DFLASH until ..."}
untuned:
  description: The services that declare C(speculative.autotune) and have no choice in O(tuned) yet (O(untuned=defer)),
    in order.
  returned: success
  type: list
  elements: str
  sample: [coder]
"""

import copy
import json
import os
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune import declared, tuned_service
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import settings_spec
from ansible_collections.ddtree.sglang.plugins.module_utils.guard import fallback_holds, fallback_services
from ansible_collections.ddtree.sglang.plugins.module_utils.service_nodes import ip_addresses, spans_nodes
from ansible_collections.ddtree.sglang.plugins.module_utils.service_releases import CANDIDATE
from ansible_collections.ddtree.sglang.plugins.module_utils.services import (
    declared_values,
    gate_settings,
    service_problems,
    service_spec,
    unit_entry,
)

# A service's fields, declared once in module_utils/services.py.
SERVICE_OPTIONS = service_spec()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            # A copy: ansible-core fills suboption defaults into the `default` dicts it is given.
            services=dict(type="list", elements="dict", required=True, options=copy.deepcopy(SERVICE_OPTIONS)),
            gpu_indices=dict(type="list", elements="int", required=True),
            gate_defaults=dict(type="dict", default={}, options=settings_spec()),
            tuned=dict(type="dict", default={}),
            untuned=dict(type="str", default="fail", choices=["fail", "defer"]),
            host=dict(type="str", default="host"),
            interfaces=dict(type="list", elements="str"),
            addresses=dict(type="list", elements="str"),
            state_root=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    services = [declared_values(service) for service in module.params["services"]]
    host = module.params["host"]
    interfaces, addresses = _host_network(module, services)
    problems = service_problems(services, module.params["gpu_indices"], host, interfaces, addresses)
    if problems:
        module.fail_json(
            msg="%d problem(s) in sglang_services, nothing was changed: %s" % (len(problems), " | ".join(problems)),
            problems=problems,
        )
    guarded = _guarded(module, services)
    services = fallback_services(services, list(guarded))
    untuned = []
    if module.params["untuned"] == "defer":
        untuned = [
            service["name"]
            for service in services
            if declared(service) and not (module.params["tuned"] or {}).get(service["name"])
        ]
        services = [service for service in services if service["name"] not in untuned]
    services, problems = _with_tuned_choices(services, module.params["tuned"], host)
    if problems:
        module.fail_json(
            msg="%d service(s) without a tuned setting, nothing was changed: %s"
            % (len(problems), " | ".join(problems)),
            problems=problems,
        )
    plan = _plan_entries(services, host, module.params["gate_defaults"])
    # The stack's base release: what a service without the overlay runs, and a tuned service's DFLASH.
    needs_base_release = bool(untuned) or any(not entry["loads_overlay"] for entry in plan)
    module.exit_json(
        changed=False, services=plan, untuned=untuned, needs_base_release=needs_base_release, guarded=guarded
    )


def _host_network(module, services):
    """The host's interfaces and addresses, read on the host when a service spans hosts and they were not given."""
    interfaces, addresses = module.params["interfaces"], module.params["addresses"]
    if any(spans_nodes(service) for service in services):
        if interfaces is None:
            interfaces = [name for _index, name in socket.if_nameindex()]
        if addresses is None:
            ip = module.get_bin_path("ip")
            rc, out, _err = module.run_command([ip, "-j", "address"]) if ip else (1, "", "")
            addresses = ip_addresses(out) if rc == 0 else None
    return interfaces, addresses


def _plan_entries(services, host, gate_defaults):
    """Each service's plan entry: what its unit runs, its release, its gate settings, its tuned choice."""
    plan = []
    shadowed = {service.get("shadow_of") for service, _tuning in services}
    for service, tuning in services:
        entry = dict(
            unit_entry(service, host),
            release=service.get("release") or CANDIDATE,
            shadow_of=service.get("shadow_of"),
            shadow_max_slowdown=service.get("shadow_max_slowdown"),
            gate=gate_settings(service, gate_defaults),
            tuned=tuning,
        )
        if service["name"] in shadowed:
            # How it is gated when measured for its shadow's comparison (the role's shadow.yml).
            entry["compare_gate"] = gate_settings(service, gate_defaults, compared=True)
        plan.append(entry)
    return plan


def _guarded(module, services):
    """{name: why} of the services whose guard's switch holds (guard.fallback_holds), read from O(state_root)."""
    root = module.params["state_root"]
    guarded = {}
    for service in services if root else []:
        path = os.path.join(root, service["name"], "guard.json")
        try:
            with open(path) as handle:
                state = json.load(handle)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            module.warn(
                "%s: the guard's record %s is unreadable (%s); the service runs as declared"
                % (service["name"], path, exc)
            )
            continue
        why = fallback_holds(state, service, path)
        if why:
            guarded[service["name"]] = why
            module.warn("%s: %s" % (service["name"], why))
    return guarded


def _with_tuned_choices(services, tuned, host):
    """[(the service as it runs, its tuned choice's summary or None)], and the problems: a service that
    declares autotune but has no (usable) tuned choice."""
    result, problems = [], []
    for position, service in enumerate(services):
        if not declared(service):
            result.append((service, None))
            continue
        label = "%s: sglang_services[%d] (%s)" % (host, position, service["name"])
        choice = (tuned or {}).get(service["name"])
        if not choice:
            problems.append(
                "%s: speculative.autotune is declared but no tuned choice was given in tuned; run "
                "ddtree.sglang.service_autotune for the candidate release first (docs/autotune.md)" % label
            )
            continue
        try:
            result.append(
                (
                    tuned_service(service, choice),
                    {key: choice.get(key) for key in ("algorithm", "budget", "top_k", "status", "speed_floor")},
                )
            )
        except ValueError as exc:
            problems.append("%s: %s" % (label, exc))
    return result, problems


if __name__ == "__main__":
    main()
