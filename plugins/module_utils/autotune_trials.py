# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The temporary instances a tuned service's settings are measured on (docs/autotune.md, "Where it measures").

Each candidate setting (DFLASH, then every DDTREE budget and top-k of the grid) runs in turn as one
temporary instance of the service: the same model, drafter, tensor-parallel size, environment and extra
arguments, but on the spare GPUs and the port its `speculative.autotune` declares (or, with `own_gpus:
true`, on the service's own GPUs and port while the service is stopped in the host's rollout window),
under its own name (<service>-autotune) and unit. The role renders it with the services' own unit and
environment templates, so it starts exactly as the service would, and removes it after the measurement.
"""

from __future__ import annotations

import math

from ansible_collections.ddtree.sglang.plugins.module_utils.autotune import (
    TRIAL_SUFFIX,
    candidate_settings,
    declaration,
    in_own_window,
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
    if not in_own_window(service):
        running.update(port=own["port"], gpus=list(own["gpus"]))
    running["name"] = trial_name(service)
    running.pop("health", None)
    # The temporary instance answers under the service's own model name: the same requests as production.
    running["served_model_name"] = service.get("served_model_name") or service["name"]
    return unit_entry(running)


def trials(service: dict) -> list:
    """What the measuring step runs, in order: per candidate setting its label, the setting, the declared
    concurrencies and its temporary instance. DFLASH first: without it nothing can be chosen, so a
    DFLASH that does not start is found before the DDTREE settings are paid for."""
    tuning = declaration(service["speculative"])
    return [
        {
            "label": setting_name(item),
            "setting": item,
            "concurrency": list(tuning["concurrency"]),
            "instance": trial_instance(service, item),
        }
        for item in candidate_settings(tuning)
    ]


def window_restore_after(trial_count: int, start_timeout: float, measure_allowance: float) -> int:
    """Seconds after which a host whose service was stopped for a tuning in its own window starts the
    service again by itself (the role arms this as a systemd timer before stopping it and disarms it once
    the grid is measured): each trial's start timeout and measuring allowance, plus one more of each for
    the slack of stopping and starting units. A run that dies mid-grid (the controller killed, the
    connection lost) leaves the host serving again after this long, on the release it served before."""
    if trial_count < 1 or start_timeout <= 0 or measure_allowance <= 0:
        raise ValueError(
            "a window tuning needs at least one trial and positive timeouts, not %r trial(s), start_timeout %r, "
            "measure allowance %r" % (trial_count, start_timeout, measure_allowance)
        )
    return int(math.ceil((trial_count + 1) * (start_timeout + measure_allowance)))
