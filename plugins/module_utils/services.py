# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""SGLang services declared as data: the cross-field rules, and the flags and environment they become.

Every field is declared here once (SERVICE_FIELDS) and checked by service_plan's action plugin on the controller
(declared_problems: unknown fields with the closest one, types, choices, ranges, required fields), then by its
module; what needs several fields at once, or the host's GPUs, is checked here too, before anything changes on a
host. The role's argument spec leaves the fields to the plan (docs/services.md, "Every field checked").
"""

from __future__ import annotations

import re

from ansible_collections.ddtree.sglang.plugins.module_utils import gate_options
from ansible_collections.ddtree.sglang.plugins.module_utils.autotune import (
    AUTOTUNE_FIELDS,
    TRIAL_SUFFIX,
    autotune_problems,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.ddtree_budget import (
    MAX_BUDGET,
    budget_problem,
    format_budget,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.gate_options import GATE_SETTINGS, settings_declarations
from ansible_collections.ddtree.sglang.plugins.module_utils.guard import guard_problems
from ansible_collections.ddtree.sglang.plugins.module_utils.guard import (
    settings_declarations as guard_settings_declarations,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.schema import (
    argument_spec,
    declaration_problems,
    missing_problems,
    option,
    well_declared,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.service_nodes import (
    NODE_FIELDS,
    node_environment,
    node_flags,
    node_problems,
    node_rank,
    spans_nodes,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.service_releases import (
    CANDIDATE,
    OVERLAY_ALGORITHMS,
    loads_overlay,
    release_pin_problems,
)

# SGLang 0.5.23's built-in algorithms (NEXTN is an alias of EAGLE) and the overlay's DDTREE.
ALGORITHMS = (
    "NONE",
    "EAGLE",
    "EAGLE3",
    "NEXTN",
    "DFLASH",
    "DSPARK",
    "UNO",
    "FROZEN_KV_MTP",
    "STANDALONE",
    "NGRAM",
    "DDTREE",
)
# Algorithms whose drafter is a separate model (--speculative-draft-model-path).
NEEDS_DRAFT_MODEL = ("DDTREE", "DFLASH", "EAGLE", "EAGLE3", "STANDALONE")
CHAIN_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
PORT = {"minimum": 1, "maximum": 65535}
# An environment variable: its name, as the environment file and systemd's EnvironmentFile= take it, and its value,
# a string (a number is written as it reads; true/false are refused, for a program reads "True" as neither).
ENVIRONMENT_NAME = r"[A-Za-z_][A-Za-z0-9_]*"


def environment_value_problem(value) -> str | None:
    """What is wrong with an environment variable's value as the inventory wrote it, or None."""
    if isinstance(value, bool):
        return (
            '%r is true or false, which a program reads as the text %r; write the text it expects in quotes (e.g. "1")'
            % (
                value,
                str(value),
            )
        )
    if isinstance(value, str) and "\n" in value:
        return "%r holds a line break, which ends the line of the environment file it is written to" % value
    return None


ENVIRONMENT = option(
    "dict",
    "More environment variables for the service's environment file: names of letters, digits and _, values strings",
    default={},
    keys=ENVIRONMENT_NAME,
    keys_doc="a variable's name is letters, digits and _, not starting with a digit",
    values=option("str", "an environment variable's value", check=environment_value_problem, example='"1"'),
)
# `speculative`'s fields, declared once (SERVICE_FIELDS holds them); _speculative_problems checks what needs
# several fields (a drafter for the algorithms that need one, a budget DDTREE can run).
SPECULATIVE_FIELDS = {
    # `allowed`, not `choices`: the plan refuses another value naming the service, before ansible-core would.
    "algorithm": option("str", "The speculative algorithm (unset: NONE)", allowed=list(ALGORITHMS)),
    "budget": option(
        "raw",
        "DDTREE: tree nodes (1-%d), or a schedule by batch size such as {1: 63, 16: 15}" % MAX_BUDGET,
        check=budget_problem,
    ),
    "top_k": option("int", "DDTREE: candidates per draft position (>= 1)"),
    "allow_hybrid_unsafe": option("bool", "DDTREE: run a hybrid target (--speculative-ddtree-allow-hybrid-unsafe)"),
    "num_steps": option("int", "EAGLE-style algorithms: draft steps (--speculative-num-steps)"),
    "eagle_topk": option("int", "EAGLE-style algorithms: top-k per step (--speculative-eagle-topk)"),
    "num_draft_tokens": option(
        "int", "EAGLE-style algorithms: draft tokens (--speculative-num-draft-tokens)", no_log=False
    ),
    "autotune": option(
        "dict",
        "DDTREE: budget and top-k chosen per host from measurements (docs/autotune.md)",
        options=AUTOTUNE_FIELDS,
        example="autotune: {gpus: [2, 3], port: 30100} for the default grid",
    ),
}
# A service's fields, declared once: service_plan's argument spec is made from this, and the role's argument
# spec (sglang_services) and service_plan's DOCUMENTATION are checked against it (tests/unit/test_schemas.py).
# Every mapping a service sets declares its fields, but `environment`, whose keys are variable names: it declares
# what its names and values are instead (ENVIRONMENT).
# `health` holds the gate settings a service may set for itself (gate_options.GATE_SETTINGS).
SERVICE_FIELDS = {
    "name": option("str", "Service name (unit C(sglang-<name>.service))", required=True),
    "model_path": option("str", "Target model path on the host", required=True),
    "served_model_name": option("str", "Name in C(/v1/models); defaults to I(name)"),
    "draft_model_path": option("str", "Draft model path (DDTREE, DFLASH, EAGLE, EAGLE3, STANDALONE)"),
    "gpus": option("list", "GPU indices the service uses", elements="int", required=True),
    "tp_size": option("int", "Tensor-parallel size", default=1),
    "host": option("str", "Address to listen on", default="127.0.0.1"),
    "port": option("int", "Port to listen on", required=True, **PORT),
    "speculative": option(
        "dict",
        "Speculative decoding: algorithm and its parameters, or autotune",
        default={"algorithm": "NONE"},
        options=SPECULATIVE_FIELDS,
    ),
    "api_key": option("str", "API key (from Ansible Vault); never returned", no_log=True),
    "release": option("str", "candidate, or a release id or source revision to pin", default="candidate"),
    "shadow_of": option("str", "The production service on this host this one is the shadow of"),
    "shadow_max_slowdown": option("float", "A shadow's largest allowed share of lost tokens/s against production"),
    "metrics": option(
        "bool", "Export SGLang's Prometheus metrics (C(--enable-metrics)); the monitoring scrapes them", default=True
    ),
    "extra_args": option("list", "More launch_server flags", elements="str", default=[]),
    "environment": ENVIRONMENT,
    "health": option(
        "dict",
        "This service's own health-gate settings (sglang_health's options of the same name)",
        default={},
        options=settings_declarations(),
    ),
    "nodes": option(
        "dict",
        "The hosts one server spans, in rank order (docs/services.md, Services across hosts)",
        options=NODE_FIELDS,
    ),
    "guard": option(
        "dict", "The guard's settings after rollouts (docs/guard.md)", default={}, options=guard_settings_declarations()
    ),
}


def service_spec() -> dict:
    """service_plan's argument spec of one service, made from SERVICE_FIELDS (its mappings' fields included)."""
    return argument_spec(SERVICE_FIELDS)


def service_label(host: str, position: int, service) -> str:
    """How a problem names a service: "ct200: sglang_services[0] (coder)"."""
    name = service.get("name") if isinstance(service, dict) else None
    name = name if isinstance(name, str) or name is None else "?"
    return "%s: sglang_services[%d] (%s)" % (host, position, name)


def declared_problems(services, host="host", required: bool = False) -> list:
    """What is wrong with the services' declarations field by field, before any rule that needs several fields:
    unknown keys (naming the closest field), types, choices and ranges (schema.declaration_problems), and with
    `required` the required fields left unset (the action plugin's check, before ansible-core's)."""
    problems = []
    for position, service in enumerate(services or []):
        label = service_label(host, position, service)
        if not isinstance(service, dict):
            problems.append("%s is %r; a service is a mapping of %s" % (label, service, ", ".join(SERVICE_FIELDS)))
            continue
        if required:
            problems.extend(missing_problems(service, SERVICE_FIELDS, label))
        problems.extend(declaration_problems(service, SERVICE_FIELDS, label))
    return problems


def declared_values(service: dict) -> dict:
    """The service with its speculative settings as declared: the unset fields ansible-core fills with None
    left out (the guard compares them with what it recorded, and the tuning reads its grid from them)."""
    spec = service.get("speculative")
    if not isinstance(spec, dict):
        return service
    spec = {key: value for key, value in spec.items() if value is not None}
    if isinstance(spec.get("autotune"), dict):
        spec["autotune"] = {key: value for key, value in spec["autotune"].items() if value is not None}
    return dict(service, speculative=spec)


# launch_server flags whose value is a secret: never on a command line (docs/services.md, "The API key").
SECRET_FLAGS = ("--api-key", "--admin-api-key")
# The attention backend DDTREE runs on: the only one whose tree-verify mask is proven on the GPU, and the one
# the overlay's grouped tree-verify kernel hooks (docs/decisions/ddtree-attention-backend.md).
DDTREE_ATTENTION_BACKEND = "triton"
# SGLang 0.5.23's flags that choose the kernels a tree verify can run on (a verify is a prefill-mode extend by
# default, --speculative-attention-mode decode makes it a decode), each with its shortest abbreviation argparse
# accepts (no other flag starts with it).
ATTENTION_BACKEND_FLAGS = {
    "--attention-backend": "--attention-b",
    "--prefill-attention-backend": "--prefill-a",
    "--decode-attention-backend": "--decode-a",
}


def service_problems(services, gpu_indices, host="host", interfaces=None, addresses=None):
    """Every rule the services break on this host, each naming the service, the field and the value.
    interfaces and addresses: the host's own, for the rules of services across hosts (None: not checked)."""
    problems = declared_problems(services, host)
    # The rules below read what is declared right (a refused field reads as unset: said once, above).
    services = [well_declared(service, SERVICE_FIELDS) if isinstance(service, dict) else {} for service in services]
    seen_names, ports, gpu_owner = {}, {}, {}
    spare = spare_gpus(services, gpu_indices)
    for position, service in enumerate(services):
        name = service.get("name")
        label = service_label(host, position, service)
        if not isinstance(name, str) or not NAME.match(name):
            problems.append(
                "%s: name %r must be 1-40 lowercase letters, digits or '-', starting with a letter or digit"
                % (label, name)
            )
        elif name in seen_names:
            problems.append("%s: name %r is also used by sglang_services[%d]" % (label, name, seen_names[name]))
        else:
            seen_names[name] = position
        port = service.get("port")
        if port in ports:
            problems.append("%s: port %s is also used by service %s" % (label, port, ports[port]))
        else:
            ports[port] = name
        gpus = service.get("gpus") or []
        if not gpus:
            problems.append("%s: gpus is empty; list the GPU indices the service uses" % label)
        for gpu in gpus:
            if gpu not in gpu_indices:
                have = ", ".join(str(index) for index in gpu_indices) or "none"
                problems.append("%s: GPU index %s does not exist on %s, which has GPUs %s" % (label, gpu, host, have))
            elif gpu in gpu_owner and gpu_owner[gpu] != name and service.get("shadow_of"):
                problems.append(
                    "%s: a shadow needs spare GPUs of its own, but GPU %s is used by service %s; %s"
                    % (label, gpu, gpu_owner[gpu], _spare_text(spare, host))
                )
            elif gpu in gpu_owner and gpu_owner[gpu] != name:
                problems.append("%s: GPU %s is also used by service %s" % (label, gpu, gpu_owner[gpu]))
            else:
                gpu_owner[gpu] = name
        if len(set(gpus)) != len(gpus):
            problems.append("%s: gpus %s lists a GPU twice" % (label, gpus))
        tp_size = service.get("tp_size", 1)
        if gpus and tp_size and len(gpus) % tp_size and not spans_nodes(service):
            problems.append("%s: tp_size %s does not divide the %d GPU(s) %s" % (label, tp_size, len(gpus), gpus))
        problems.extend(_speculative_problems(label, service))
        problems.extend(_secret_flag_problems(label, service))
        problems.extend(attention_backend_problems(label, service))
        problems.extend(release_pin_problems(label, service))
        problems.extend(node_problems(label, service, host, services, interfaces, addresses))
    problems.extend(shadow_problems(services, host))
    problems.extend(autotune_host_problems(services, gpu_indices, host))
    return problems


def autotune_host_problems(services, gpu_indices, host="host"):
    """Where a tuned service's settings are measured (docs/autotune.md, "Where it measures"): a temporary
    instance on spare GPUs (speculative.autotune.gpus: as many as the service's, used by no service of the
    host, shadows included) and a port of its own (autotune.port), or on the service's own GPUs and port in
    the host's rollout window (autotune.own_gpus: true; the service stops while its grid runs). A tuned
    service that says neither is refused with both fixes: stopping production is never implied."""
    problems = []
    owners = {
        "gpus": {gpu: service.get("name") for service in services for gpu in service.get("gpus") or []},
        "ports": {service.get("port"): service.get("name") for service in services},
    }
    names = {service.get("name") for service in services}
    for position, service in enumerate(services):
        spec = service.get("speculative") or {}
        own = spec.get("autotune")
        if not isinstance(own, dict) or spec.get("algorithm") != "DDTREE":
            continue  # not tuned, or autotune_problems says what is wrong with it
        label = "%s: sglang_services[%d] (%s)" % (host, position, service.get("name"))
        problems.extend(_autotune_place_problems(label, service, own, gpu_indices, owners, host))
        if "%s%s" % (service.get("name"), TRIAL_SUFFIX) in names:
            problems.append(
                "%s: a service is named %s%s, the name of this service's temporary tuning instance; rename it"
                % (label, service.get("name"), TRIAL_SUFFIX)
            )
        if (service.get("release") or CANDIDATE) != CANDIDATE:
            problems.append(
                "%s: release %r is pinned, but speculative.autotune tunes for the candidate release (and may fall "
                "back to DFLASH, which runs the base release, not the pin): remove release to tune, or remove "
                "autotune and pin the setting tuned before (budget and top_k from autotune.json)"
                % (label, service.get("release"))
            )
    return problems


def _autotune_place_problems(label: str, service: dict, own: dict, gpu_indices, owners: dict, host: str) -> list:
    """Where a tuned service measures: its autotune.gpus (spare, as many as its own) and autotune.port (free),
    or own_gpus alone. owners: {"gpus": {gpu: service}, "ports": {port: service}} of the host's services."""
    problems = []
    spare = [gpu for gpu in gpu_indices if gpu not in owners["gpus"]]
    count = len(service.get("gpus") or [])
    free = ", ".join(str(gpu) for gpu in spare) or "none"
    gpus, port = own.get("gpus"), own.get("port")
    if own.get("own_gpus") is True and gpus is None and port is None:
        return []  # measured on its own GPUs and port, in the host's window: nothing beside it to place
    if gpus is None:
        problems.append(
            "%s: speculative.autotune.gpus is not set; each setting is measured on a temporary instance "
            "before the candidate takes traffic: set autotune.gpus to %d spare GPU(s) (free on %s: %s) and "
            "autotune.port to measure beside the service, or autotune.own_gpus: true to measure on its own "
            "GPUs in this host's rollout window (the service stops while its grid runs), or remove autotune "
            "and set budget and top_k" % (label, count, host, free)
        )
    elif isinstance(gpus, list):
        if len(gpus) != count:
            problems.append(
                "%s: speculative.autotune.gpus %s has %d GPU(s), but the service runs on %d; measure on as "
                "many as it runs on (free on %s: %s)" % (label, gpus, len(gpus), count, host, free)
            )
        for gpu in gpus:
            if gpu not in gpu_indices:
                problems.append(
                    "%s: speculative.autotune.gpus: GPU %s does not exist on %s, which has GPUs %s"
                    % (label, gpu, host, ", ".join(str(index) for index in gpu_indices) or "none")
                )
            elif gpu in owners["gpus"]:
                problems.append(
                    "%s: speculative.autotune.gpus: GPU %s is used by service %s; the temporary instances "
                    "need spare GPUs (free on %s: %s)" % (label, gpu, owners["gpus"][gpu], host, free)
                )
    if gpus is not None and port is None:
        problems.append(
            "%s: speculative.autotune.port is not set; give the temporary instances a port of their own, "
            "e.g. %s" % (label, (service.get("port") or 30000) + 100)
        )
    elif port is not None and port in owners["ports"]:
        problems.append(
            "%s: speculative.autotune.port %s is used by service %s; give the temporary instances a port "
            "of their own" % (label, port, owners["ports"][port])
        )
    return problems


def spare_gpus(services, gpu_indices):
    """The host's GPUs that no production service (one that is not a shadow) uses."""
    used = {gpu for service in services if not service.get("shadow_of") for gpu in service.get("gpus") or []}
    return [gpu for gpu in gpu_indices if gpu not in used]


def _spare_text(spare, host):
    if not spare:
        return "%s has no spare GPU (every GPU serves production); remove the shadow or free GPUs for it" % host
    return "give it spare GPUs (free on %s: %s)" % (host, ", ".join(str(gpu) for gpu in spare))


def shadow_problems(services, host="host"):
    """The rules of shadow services (docs/services.md, "Shadow services"): a shadow names a production
    service of the host, runs the candidate (DDTREE, never pinned), on its own GPUs and port (checked
    with every service's GPUs and ports)."""
    problems = []
    by_name = {service.get("name"): service for service in services}
    shadows_of = {}
    for position, service in enumerate(services):
        target = service.get("shadow_of")
        if not target:
            continue
        label = "%s: sglang_services[%d] (%s)" % (host, position, service.get("name"))
        if target == service.get("name"):
            problems.append(
                "%s: shadow_of %r names the service itself; name the production service it runs beside"
                % (label, target)
            )
        elif target not in by_name:
            names = (
                ", ".join(sorted(str(other.get("name")) for other in services if not other.get("shadow_of"))) or "none"
            )
            problems.append(
                "%s: shadow_of %r names no service on %s (production services there: %s)" % (label, target, host, names)
            )
        elif by_name[target].get("shadow_of"):
            problems.append(
                "%s: shadow_of %r names a shadow; name the production service %r it shadows"
                % (label, target, by_name[target]["shadow_of"])
            )
        algorithm = (service.get("speculative") or {}).get("algorithm", "NONE")
        if not loads_overlay(algorithm):
            problems.append(
                "%s: a shadow runs the candidate release, so its algorithm must be %s, not %s"
                % (label, " or ".join(OVERLAY_ALGORITHMS), algorithm)
            )
        if (service.get("release") or CANDIDATE) != CANDIDATE:
            problems.append("%s: a shadow follows the candidate; remove release %r" % (label, service["release"]))
        if target in shadows_of and target != service.get("name"):
            problems.append(
                "%s: %s has a shadow already, %s; give a production service one shadow (it decides its promotion)"
                % (label, target, shadows_of[target])
            )
        shadows_of.setdefault(target, service.get("name"))
    for position, service in enumerate(services):
        slowdown = service.get("shadow_max_slowdown")
        if slowdown is None:
            continue
        label = "%s: sglang_services[%d] (%s)" % (host, position, service.get("name"))
        if not service.get("shadow_of"):
            problems.append(
                "%s: shadow_max_slowdown is set, but the service is no shadow; set shadow_of or remove it" % label
            )
        elif isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or not 0 <= slowdown < 1:
            problems.append(
                "%s: shadow_max_slowdown is %r; it is a share of production's tokens/s, at least 0 and below 1 "
                "(0.1: 90%%)" % (label, slowdown)
            )
    return problems


def _secret_flag_problems(label, service):
    """A secret flag in extra_args would be in the server's argv, which every local user can read.
    The message names the flag only: the value is the secret."""
    problems = []
    for arg in service.get("extra_args") or []:
        flag = str(arg).split("=", 1)[0]
        if flag in SECRET_FLAGS:
            problems.append(
                "%s: extra_args holds %s, which would put its value in the server's command line; "
                "set the service's api_key instead (it reaches the server on standard input)" % (label, flag)
            )
    return problems


def attention_backends(extra_args: list) -> dict:
    """{flag: value} of the attention-backend flags in extra_args, by their full names; a flag written
    as an abbreviation or as --flag=value counts too. A flag without its value maps to None."""
    args = [str(arg) for arg in extra_args or []]
    found = {}
    for position, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        for flag, shortest in ATTENTION_BACKEND_FLAGS.items():
            if name.startswith(shortest) and flag.startswith(name):
                if not equals:
                    value = args[position + 1] if position + 1 < len(args) else None
                found[flag] = value
    return found


def attention_backend_problems(label: str, service: dict) -> list:
    """A DDTREE service runs on the Triton attention backend: any other backend for its verify is refused,
    naming the flag, the value and the fix (docs/decisions/ddtree-attention-backend.md)."""
    algorithm = (service.get("speculative") or {}).get("algorithm", "NONE")
    if algorithm != "DDTREE":
        return []
    return [
        "%s: %s %s is not proven with DDTREE's tree mask; use %s (or drop the flag: the collection sets "
        "--attention-backend %s for DDTREE) or run the service with DFLASH"
        % (label, flag, value, DDTREE_ATTENTION_BACKEND, DDTREE_ATTENTION_BACKEND)
        for flag, value in attention_backends(service.get("extra_args")).items()
        if value is not None and value != DDTREE_ATTENTION_BACKEND
    ]


def _speculative_problems(label, service):
    spec = service.get("speculative") or {}
    algorithm = spec.get("algorithm", "NONE")
    problems = []
    if algorithm in NEEDS_DRAFT_MODEL and not service.get("draft_model_path"):
        problems.append("%s: speculative.algorithm %s needs draft_model_path (its drafter model)" % (label, algorithm))
    if algorithm == "DDTREE":
        value = spec.get("top_k")
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append("%s: speculative.top_k is %r; DDTREE needs an integer >= 1" % (label, value))
    for key in ("num_steps", "eagle_topk", "num_draft_tokens"):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append("%s: speculative.%s is %r; it must be an integer >= 1" % (label, key, value))
    problems.extend("%s: %s" % (label, problem) for problem in autotune_problems(spec))
    problems.extend(guard_problems(service, label))
    return problems


def service_flags(service, host=None):
    """The launch_server flags of a service, which end up in its argv: never the API key (the unit hands
    it to the server on standard input; roles/sglang_service/files/sglang_launch.py). On a service across
    hosts, host's rank in it (service_nodes.node_flags)."""
    spec = service.get("speculative") or {}
    if spec.get("autotune") is not None:
        # Its budget and top_k, even its algorithm, are the tuning's: autotune.tuned_service resolves them.
        raise ValueError(
            "service %s declares speculative.autotune: its flags come from its tuned choice "
            "(autotune.tuned_service), not from the declaration" % service.get("name")
        )
    flags = [
        "--model-path",
        service["model_path"],
        "--served-model-name",
        service.get("served_model_name") or service["name"],
        "--host",
        service.get("host", "127.0.0.1"),
        "--port",
        str(service["port"]),
        "--tp-size",
        str(service.get("tp_size", 1)),
    ] + node_flags(service, host)
    if service.get("metrics", True) and "--enable-metrics" not in (service.get("extra_args") or []):
        # /metrics for the monitoring (docs/monitoring.md); opted out per service with metrics: false.
        flags.append("--enable-metrics")
    algorithm = spec.get("algorithm", "NONE")
    if algorithm != "NONE":
        flags += ["--speculative-algorithm", algorithm]
        if service.get("draft_model_path"):
            flags += ["--speculative-draft-model-path", service["draft_model_path"]]
        if algorithm == "DDTREE":
            if spec.get("budget") is not None:
                flags += ["--speculative-ddtree-budget", format_budget(spec["budget"])]
            if spec.get("top_k") is not None:
                flags += ["--speculative-ddtree-top-k", str(spec["top_k"])]
            if spec.get("allow_hybrid_unsafe"):
                flags.append("--speculative-ddtree-allow-hybrid-unsafe")
            if "--attention-backend" not in attention_backends(service.get("extra_args")):
                flags += ["--attention-backend", DDTREE_ATTENTION_BACKEND]
        for key, flag in (
            ("num_steps", "--speculative-num-steps"),
            ("eagle_topk", "--speculative-eagle-topk"),
            ("num_draft_tokens", "--speculative-num-draft-tokens"),
        ):
            if spec.get(key) is not None:
                flags += [flag, str(spec[key])]
    return flags + [str(arg) for arg in service.get("extra_args") or []]


def service_environment(service):
    """The environment file's variables: the GPUs, then the service's own. Never the API key: it has a
    file of its own, written by the role, so the secret never passes through a module's result."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in service.get("gpus") or [])}
    env.update(node_environment(service))
    env.update({str(key): str(value) for key, value in (service.get("environment") or {}).items()})
    return env


def gate_settings(service: dict, defaults: dict, compared: bool = False) -> dict:
    """The health-gate settings of a service: its own `health` values over the role's defaults
    (gate_options.merged_settings).

    The one place that decides them, so the gate after a deploy and the gate after a rollback run with
    the same settings (a slow-starting model needs its start_timeout on the way back too). Settings
    set neither way are left out: the module's defaults apply. A shadow's acceptance length is read from
    one /generate request, the one its production service is measured with when compared with it
    (`compared`: the plan's compare_gate, which the role's shadow comparison gates with).
    """
    settings = gate_options.merged_settings(GATE_SETTINGS, service.get("health") or {}, defaults or {})
    if compared or service.get("shadow_of"):
        # A shadow and its production service are compared on the same /generate request (docs/services.md).
        settings["accept_length_from"] = "generate"
    return settings


def systemd_quote(arg):
    """Quote one ExecStart argument for systemd (keeps ${VAR} expandable)."""
    if arg and re.fullmatch(r"[A-Za-z0-9_@%+=:,./${}-]+", arg):
        return arg
    return '"%s"' % arg.replace("\\", "\\\\").replace('"', '\\"')


def unit_entry(service, host=None):
    """The fields the unit and environment templates read for one service (the service plan's entry, and
    an autotune trial's temporary instance): its unit name, flags and their ExecStart form, environment,
    algorithm and whether it loads the overlay, where it listens and on which GPUs; on a service across hosts,
    host's rank (0: the head, which serves HTTP) and the group's hosts."""
    flags = service_flags(service, host)
    algorithm = (service.get("speculative") or {}).get("algorithm", "NONE")
    return {
        "name": service["name"],
        "unit": "sglang-%s.service" % service["name"],
        "flags": flags,
        "exec_args": " ".join(systemd_quote(arg) for arg in flags),
        "environment": service_environment(service),
        "algorithm": algorithm,
        "loads_overlay": loads_overlay(algorithm),
        "gpus": service["gpus"],
        "port": service["port"],
        "host": service.get("host") or "127.0.0.1",
        "has_api_key": bool(service.get("api_key")),
        "served_model_name": service.get("served_model_name") or service["name"],
        "node_rank": node_rank(service, host) or 0,
        "node_hosts": list((service.get("nodes") or {}).get("hosts") or []),
    }
