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


def trial_release_id(trial: dict, candidate_id: str, base_id: str | None) -> str:
    """The release a trial runs on: the candidate for a setting that loads the overlay (DDTREE), else the base
    release, as the service would run that setting (DFLASH). Raises ValueError when that is the base release and
    there is none."""
    if trial["instance"].get("loads_overlay"):
        return candidate_id
    if not base_id:
        raise ValueError("%s runs on the base release, and no base_release_id was given" % trial["label"])
    return base_id


def trial_start_timeout(service: dict, default: float) -> float:
    """Seconds a trial's server may take to answer /health: the service's own health.start_timeout (a slow
    model starts as slowly on a temporary instance), else `default` (the role's start timeout)."""
    return float((service.get("health") or {}).get("start_timeout") or default)


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


def window_units(service: str) -> dict:
    """The units of a tuning in the service's own window: the service's, the host's restore (a transient timer
    and service of that name) and the temporary instance's, which the restore stops before it starts the service."""
    return {
        "unit": "sglang-%s.service" % service,
        "restore": "sglang-%s%s-restore" % (service, TRIAL_SUFFIX),
        "trial": "sglang-%s%s.service" % (service, TRIAL_SUFFIX),
    }


def window_stop_commands(service: str, unit_active: bool, restore_active: bool, restore_after: int) -> dict:
    """What stops a service for its grid: {serving, commands}. serving: it serves now, or served before a tuning
    that was cut short (its restore still armed). A restore left armed is cancelled (this run restores the
    service itself); then, when serving, the host's own restore is armed before the service stops, so a run that
    dies midway leaves it serving again after `restore_after` seconds. Nothing serving: nothing to stop."""
    units = window_units(service)
    serving = bool(unit_active or restore_active)
    commands = [["systemctl", "stop", units["restore"] + ".timer"]] if restore_active else []
    if serving:
        # argv without a shell: systemd-run escapes a ';' inside an argument, and systemd then splits the
        # restored command line at it. --collect unloads the restore even when it failed, so a later run
        # can arm it again under the same name.
        commands.append(
            [
                "systemd-run",
                "--unit",
                units["restore"],
                "--on-active",
                "%ds" % restore_after,
                "--timer-property",
                "AccuracySec=1s",
                "--collect",
                "--description",
                "Restart %s after an interrupted tuning" % units["unit"],
                "--property",
                "ExecStartPre=-/bin/systemctl stop %s" % units["trial"],
                "/bin/systemctl",
                "start",
                units["unit"],
            ]
        )
        commands.append(["systemctl", "stop", units["unit"]])
    return {"serving": serving, "commands": commands}


def window_start_commands(service: str, unit_active: bool, restore_active: bool) -> list:
    """What ends a tuning in the service's window: the restore disarmed (when it has not fired yet) and the
    service started again on the release it served (unless the restore started it already)."""
    units = window_units(service)
    commands = [["systemctl", "stop", units["restore"] + ".timer"]] if restore_active else []
    if not unit_active:
        commands.append(["systemctl", "start", units["unit"]])
    return commands


def window_restarted(service: str, window_stop: dict) -> list:
    """The services a tuning in their window started again in this run (`window_stop` is the window's stop
    result): [service] when it was serving before the stop, else []. A service restarted so is gated even if
    nothing else of it changes."""
    return [service] if (window_stop or {}).get("serving") else []


def trial_params(trial: dict) -> dict:
    """What a trial runs (an entry of service_autotune's `trials`) as the measuring step's parameters: the
    instance's name, unit, host and port, its release, setting, concurrencies and start timeout. A ValueError
    names a field the instance lacks."""
    instance = trial["instance"]
    missing = [field for field in ("name", "unit", "port") if instance.get(field) in (None, "")]
    if missing:
        raise ValueError("trial %s: its instance has no %s" % (trial.get("label") or "?", ", ".join(missing)))
    return {
        "name": instance["name"],
        "unit": instance["unit"],
        "host": instance.get("host") or "127.0.0.1",
        "port": int(instance["port"]),
        "release_dir": trial["release_dir"],
        "setting": trial["setting"],
        "concurrency": trial["concurrency"],
        "start_timeout": trial["start_timeout"],
    }


def trial_files(name: str, unit: str, services_root: str, config_dir: str, state_root: str, systemd_dir: str) -> dict:
    """Where a temporary instance's files live, as the services' own (units.yml): {unit, environment, api_key,
    unit_dir (its current link inside), state_dir}. All of them are removed after its measurement."""
    return {
        "unit": "%s/%s" % (systemd_dir, unit),
        "environment": "%s/%s.env" % (config_dir, name),
        "api_key": "%s/%s.api-key" % (config_dir, name),
        "unit_dir": "%s/%s" % (services_root, name),
        "state_dir": "%s/%s" % (state_root, name),
    }


def trial_start_commands(unit: str) -> list:
    """What starts a temporary instance once its files are written: systemd reads the new unit, then starts it
    (restarted: one left running by a run that died mid-measurement starts afresh on this setting)."""
    return [["systemctl", "daemon-reload"], ["systemctl", "restart", unit]]


def trial_stop_commands(unit: str) -> list:
    """What ends a temporary instance: stopped (before its files are removed), and, after, systemd told to
    forget its unit."""
    return [["systemctl", "stop", unit], ["systemctl", "daemon-reload"]]
