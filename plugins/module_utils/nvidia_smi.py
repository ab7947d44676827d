# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parse nvidia-smi output into GPU facts.

Plain functions that take text and return data, so they are tested directly on captures from real
GPUs. The queries asked are fixed here, in one place, and the lab's nvidia-smi answers exactly these.
"""

from __future__ import annotations

import re

# --query-gpu fields, in the order asked; the parser maps columns by this order. This is the query
# of the real captures in tests/fixtures/nvidia-smi, so they are the parser's test input as they are.
GPU_QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "compute_cap",
    "memory.total",
    "memory.used",
    "memory.free",
    "persistence_mode",
    "temperature.gpu",
    "power.draw",
    "utilization.gpu",
)
# --query-compute-apps fields. nvidia-smi prints "used_memory" as "used_gpu_memory" in the header.
APP_QUERY_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")

NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]")


class NvidiaSmiParseError(ValueError):
    """nvidia-smi printed something this parser does not understand."""


def gpu_query_args():
    return ["--query-gpu=" + ",".join(GPU_QUERY_FIELDS), "--format=csv"]


def apps_query_args():
    return ["--query-compute-apps=" + ",".join(APP_QUERY_FIELDS), "--format=csv"]


def _header_name(column):
    """'memory.total [MiB]' -> 'memory.total'."""
    return column.split(" [", 1)[0].strip()


def parse_csv(text, fields, what):
    """Rows of `nvidia-smi --query-*=<fields> --format=csv` as dicts keyed by the asked field names.

    The header must have one column per asked field; values keep their units (see the value parsers).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise NvidiaSmiParseError("%s: nvidia-smi printed nothing (expected a CSV header)" % what)
    header = [_header_name(col) for col in lines[0].split(",")]
    if len(header) != len(fields):
        raise NvidiaSmiParseError(
            "%s: header has %d columns, expected %d (%s): %r"
            % (what, len(header), len(fields), ", ".join(fields), lines[0])
        )
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        values = [value.strip() for value in line.split(",")]
        if len(values) != len(fields):
            raise NvidiaSmiParseError(
                "%s: line %d has %d values, expected %d: %r" % (what, number, len(values), len(fields), line)
            )
        rows.append(dict(zip(fields, values)))
    return rows


def parse_mib(value, what):
    """'143771 MiB' -> 143771; N/A -> None."""
    if value in NOT_AVAILABLE:
        return None
    match = re.fullmatch(r"(\d+)\s*MiB", value)
    if not match:
        raise NvidiaSmiParseError("%s: %r is not a size in MiB" % (what, value))
    return int(match.group(1))


def parse_unit_number(value, unit, what):
    """'125.43 W' -> 125.43, '0 %' -> 0.0 (unit ' W' / ' %'); N/A -> None."""
    if value in NOT_AVAILABLE:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*" + re.escape(unit), value)
    if not match:
        raise NvidiaSmiParseError("%s: %r is not a number in %s" % (what, value, unit))
    return float(match.group(1))


def parse_int(value, what):
    if not re.fullmatch(r"\d+", value):
        raise NvidiaSmiParseError("%s: %r is not an integer" % (what, value))
    return int(value)


def parse_compute_capability(value, what):
    """'12.0' -> ('12.0', 120): the capability as printed and as the sm number."""
    match = re.fullmatch(r"(\d+)\.(\d+)", value)
    if not match:
        raise NvidiaSmiParseError("%s: %r is not a compute capability like 9.0" % (what, value))
    return value, int(match.group(1)) * 10 + int(match.group(2))


def parse_enabled(value, what):
    if value in NOT_AVAILABLE:
        return None
    if value not in ("Enabled", "Disabled"):
        raise NvidiaSmiParseError("%s: %r is neither Enabled nor Disabled" % (what, value))
    return value == "Enabled"


def parse_gpus(text):
    """GPUs from `nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv`."""
    gpus = []
    for row in parse_csv(text, GPU_QUERY_FIELDS, "--query-gpu"):
        what = "--query-gpu GPU %s" % row["index"]
        capability, sm = parse_compute_capability(row["compute_cap"], what + " compute_cap")
        gpus.append(
            {
                "index": parse_int(row["index"], what + " index"),
                "name": row["name"],
                "uuid": row["uuid"],
                "pci_bus_id": row["pci.bus_id"],
                "driver_version": row["driver_version"],
                "compute_capability": capability,
                "sm": sm,
                "memory_total_mib": parse_mib(row["memory.total"], what + " memory.total"),
                "memory_used_mib": parse_mib(row["memory.used"], what + " memory.used"),
                "memory_free_mib": parse_mib(row["memory.free"], what + " memory.free"),
                "persistence_mode": parse_enabled(row["persistence_mode"], what + " persistence_mode"),
                "temperature_c": None
                if row["temperature.gpu"] in NOT_AVAILABLE
                else parse_int(row["temperature.gpu"], what + " temperature.gpu"),
                "power_draw_w": parse_unit_number(row["power.draw"], "W", what + " power.draw"),
                "utilization_pct": parse_unit_number(row["utilization.gpu"], "%", what + " utilization.gpu"),
            }
        )
    return gpus


def parse_apps(text):
    """Compute processes from `nvidia-smi --query-compute-apps=<APP_QUERY_FIELDS> --format=csv`."""
    apps = []
    for row in parse_csv(text, APP_QUERY_FIELDS, "--query-compute-apps"):
        what = "--query-compute-apps pid %s" % row["pid"]
        apps.append(
            {
                "pid": parse_int(row["pid"], what + " pid"),
                "name": row["process_name"],
                "used_memory_mib": parse_mib(row["used_memory"], what + " used_memory"),
                "gpu_uuid": row["gpu_uuid"],
            }
        )
    return apps


def parse_version(text):
    """`nvidia-smi --version` -> {'driver_version', 'cuda_version', 'nvml_version'} (None where absent)."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            found[key.strip().lower()] = value.strip()
    result = {
        "driver_version": found.get("driver version"),
        "cuda_version": found.get("cuda version"),
        "nvml_version": found.get("nvml version"),
    }
    if not result["driver_version"] or not result["cuda_version"]:
        raise NvidiaSmiParseError("--version: no 'DRIVER version' and 'CUDA Version' lines in %r" % text.strip()[:200])
    return result


def systemd_unit_from_cgroup(text):
    """The systemd service a process runs in, from /proc/<pid>/cgroup text; None when it is in none."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed(path.split("/")):
            if part.endswith(".service"):
                return part
    return None


def version_tuple(version):
    """'580.65.06' -> (580, 65, 6); raises ValueError naming the value when it is not dotted numbers."""
    if not re.fullmatch(r"\d+(\.\d+)*", str(version)):
        raise ValueError("%r is not a dotted version like 580.65.06" % (version,))
    return tuple(int(part) for part in str(version).split("."))


def version_at_least(found, required):
    return version_tuple(found) >= version_tuple(required)


def inventory_lines(facts):
    """Human-readable GPU inventory: a header line, one line per GPU, one per process."""
    lines = ["driver %s, CUDA %s, %d GPU(s)" % (facts["driver_version"], facts["cuda_version"], facts["gpu_count"])]
    for gpu in facts["gpus"]:
        lines.append(
            "GPU %d: %s, sm_%d, %s of %s MiB free, persistence %s, %s"
            % (
                gpu["index"],
                gpu["name"],
                gpu["sm"],
                gpu["memory_free_mib"],
                gpu["memory_total_mib"],
                {True: "on", False: "off", None: "n/a"}[gpu["persistence_mode"]],
                "%d process(es)" % len(gpu["processes"]) if gpu["processes"] else "idle",
            )
        )
    for app in facts["processes"]:
        lines.append(
            "process %d (%s) holds %s MiB on GPU %d, unit %s"
            % (app["pid"], app["name"], app["used_memory_mib"], app["gpu_index"], app["unit"] or "none")
        )
    return lines


def gpu_facts(gpus_text, apps_text, version_text, unit_of_pid=None):
    """Assemble the facts from the three outputs.

    unit_of_pid: optional callable pid -> systemd unit name or None, so a caller can tell the
    processes of our own services from foreign ones.
    """
    gpus = parse_gpus(gpus_text)
    apps = parse_apps(apps_text)
    version = parse_version(version_text)
    by_uuid = {gpu["uuid"]: gpu for gpu in gpus}
    for gpu in gpus:
        gpu["processes"] = []
    for app in apps:
        gpu = by_uuid.get(app["gpu_uuid"])
        if gpu is None:
            raise NvidiaSmiParseError(
                "--query-compute-apps: pid %d uses GPU %s, which --query-gpu did not list"
                % (app["pid"], app["gpu_uuid"])
            )
        app["gpu_index"] = gpu["index"]
        app["unit"] = unit_of_pid(app["pid"]) if unit_of_pid else None
        gpu["processes"].append(app)
    facts = {
        "driver_version": version["driver_version"],
        "cuda_version": version["cuda_version"],
        "gpu_count": len(gpus),
        "gpus": gpus,
        "processes": apps,
    }
    facts["summary"] = inventory_lines(facts)
    return facts
