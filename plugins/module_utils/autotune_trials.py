# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The temporary instances a tuned service's settings are measured on (docs/autotune.md, "Where it measures").

Each candidate setting (DFLASH, then every DDTREE budget and top-k of the grid) runs in turn as one
temporary instance of the service: the same model, drafter, tensor-parallel size, environment and extra
arguments, but on the spare GPUs and the port its `speculative.autotune` declares, under its own name
(<service>-autotune) and unit. The role renders it with the services' own unit and environment templates,
so it starts exactly as the service would, and removes it after the measurement.
"""

from __future__ import annotations

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune import (
    TRIAL_SUFFIX,
    candidate_settings,
    declaration,
    setting_name,
    tuned_service,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.services import unit_entry


def trial_name(service: dict) -> str:
    return "%s%s" % (service["name"], TRIAL_SUFFIX)


def trial_instance(service: dict, item: dict) -> dict:
    """The plan entry (the fields the unit and environment templates read) of the temporary instance that
    runs one setting ({"algorithm", "budget", "top_k"}) of a tuned service."""
    own = service["speculative"]["autotune"]
    running = tuned_service(service, item)  # a copy
    running.update(name=trial_name(service), port=own["port"], gpus=list(own["gpus"]))
    running.pop("health", None)
    # The temporary instance answers under the service's own model name: the same requests as production.
    running["served_model_name"] = service.get("served_model_name") or service["name"]
    return unit_entry(running)


def trials(service: dict) -> list:
    """What the measuring step runs, in order: per candidate setting its label, the setting, the declared
    concurrencies and its temporary instance. DFLASH first: without it nothing can be chosen, so a
    DFLASH that does not start is found before the DDTREE settings are paid for."""
    tuning = declaration(service["speculative"])
    return [{"label": setting_name(item), "setting": item, "concurrency": list(tuning["concurrency"]),
             "instance": trial_instance(service, item)} for item in candidate_settings(tuning)]
