# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""SGLang's speculative-algorithm predicate matrix, with and without an overlay release, compared.

The matrices come from the overlay's own `python -m sglang_overlay.predicates --json` (which finds the
predicates by introspecting SGLang's SpeculativeAlgorithm), run in the service's stack.
"""

from __future__ import annotations

# What the checks' process imports once before forking a child per check (module_utils/forked_jobs.py):
# SGLang imports torch before anything of its own, and a plugin cannot change it.
PRELOAD = ("torch",)

# `python -m sglang_overlay.predicates --json`, as a job: the module found on the release's path.
PREDICATES_WITH_PLUGINS = (
    'import runpy; runpy.run_module("sglang_overlay.predicates", run_name="__main__", alter_sys=True)'
)

# Run in the stack as `python -c FLAGS_PROBE <flags...>`: load plugins as SGLang does, parse the flags
# with SGLang's own parser (exit 2 on a bad flag, like launch_server), resolve the algorithm.
FLAGS_PROBE = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(sys.argv[1:])
from importlib.metadata import entry_points
result = {"model_path": args.model_path, "port": args.port, "algorithm": args.speculative_algorithm,
          "resolves_to": None,
          "plugins": sorted(({"name": ep.name, "value": ep.value} for ep in entry_points(group="sglang.srt.plugins")),
                            key=lambda plugin: plugin["name"])}
if args.speculative_algorithm:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    try:
        algorithm = SpeculativeAlgorithm.from_string(args.speculative_algorithm)
        result["resolves_to"] = getattr(algorithm, "name", str(algorithm))
        result["is_dflash_family"] = bool(algorithm.is_dflash_family())
    except Exception as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(result))
"""

# Run in the stack with the release on the path: the overlay's hybrid layouts (adapter.hybrid.layout_table,
# pure Python), or why the release cannot say (one that predates the table).
HYBRID_LAYOUTS_PROBE = r"""
import json
try:
    from sglang_overlay.adapter.hybrid import layout_table
except ImportError as exc:
    print(json.dumps({"layouts": None, "why": "%s: %s" % (type(exc).__name__, exc)}))
else:
    print(json.dumps({"layouts": layout_table()}))
"""


def hybrid_layout_lines(answer):
    """The release's hybrid layouts as lines for people: each layout, whether DDTREE verifies a tree on it
    (and what of that is proven) or refuses it (and why)."""
    layouts = (answer or {}).get("layouts")
    if layouts is None:
        return ["the release does not list its hybrid layouts (%s)" % (answer or {}).get("why", "no answer")]
    lines = []
    for layout in layouts:
        head = "%s (%s)" % (layout.get("name"), layout.get("backend"))
        if layout.get("status") == "tree":
            lines.append("%s: tree verify; proven %s" % (head, layout.get("proven")))
        else:
            lines.append("%s: refused: %s" % (head, layout.get("reason")))
    return lines


# The overlay's package: a plugin whose entry point lives in it is the overlay's.
OVERLAY_PACKAGE = "sglang_overlay"


def overlay_plugins(plugins):
    """The names of the discoverable SGLang plugins ({name, value}) that are the overlay's."""
    return sorted(
        plugin["name"]
        for plugin in plugins
        if str(plugin.get("value", "")).split(":", 1)[0].split(".", 1)[0] == OVERLAY_PACKAGE
    )


DFLASH_FAMILY = ("is_dflash", "is_dflash_family", "is_speculative")


def builtin_differences(pristine, with_release):
    """Every predicate or behaviour of a built-in algorithm that the release changes."""
    differences = []
    for name, row in sorted(pristine["algorithms"].items()):
        if row.get("kind") == "plugin" or row.get("known") is False:
            continue  # not a built-in of pristine SGLang (the plugin's name, probed to show it is unknown)
        other = with_release["algorithms"].get(name)
        if other is None:
            differences.append("%s: present in pristine SGLang, missing with the release" % name)
            continue
        for section in ("predicates", "behaviour"):
            for key in sorted(set(row.get(section, {})) | set(other.get(section, {}))):
                before, after = row.get(section, {}).get(key), other.get(section, {}).get(key)
                if before != after:
                    differences.append("%s.%s: %r in pristine SGLang, %r with the release" % (name, key, before, after))
        if row.get("resolves_to") != other.get("resolves_to"):
            differences.append(
                "%s resolves to %r in pristine SGLang, %r with the release"
                % (name, row.get("resolves_to"), other.get("resolves_to"))
            )
    return differences


def dflash_family_problems(with_release, algorithm="DDTREE"):
    """Why the plugin algorithm is not a DFlash-family algorithm answering every predicate as DFLASH does."""
    row = with_release["algorithms"].get(algorithm)
    if not row or not row.get("known", True):
        return ["%s is not a known speculative algorithm with the release (is the plugin loaded?)" % algorithm]
    predicates = row.get("predicates", {})
    problems = [
        "%s.%s is %r, must be True" % (algorithm, key, predicates.get(key))
        for key in DFLASH_FAMILY
        if predicates.get(key) is not True
    ]
    dflash = with_release["algorithms"].get("DFLASH", {}).get("predicates", {})
    for key in sorted(set(predicates) | set(dflash)):
        if key not in DFLASH_FAMILY and predicates.get(key) != dflash.get(key):
            problems.append("%s.%s is %r, DFLASH's is %r" % (algorithm, key, predicates.get(key), dflash.get(key)))
    return problems


def matrix_lines(pristine, with_release, columns=("is_dflash", "is_dflash_family", "is_eagle", "is_ngram", "is_none")):
    """The matrix as people read it: one line per algorithm, and whether it matches pristine SGLang."""
    lines = ["%-14s %s  vs pristine" % ("algorithm", " ".join("%-17s" % column for column in columns))]
    for name, row in sorted(with_release["algorithms"].items()):
        values = " ".join("%-17s" % row.get("predicates", {}).get(column) for column in columns)
        if row.get("kind") == "plugin":
            verdict = "plugin"
        elif name not in pristine["algorithms"] or pristine["algorithms"][name].get("known") is False:
            verdict = "new"
        else:
            verdict = (
                "same"
                if not builtin_differences({"algorithms": {name: pristine["algorithms"][name]}}, with_release)
                else "DIFFERS"
            )
        lines.append("%-14s %s  %s" % (name, values, verdict))
    return lines


def verify_summary(results):
    """What the role shows after spec_verify's loop: the matrix of its first result that has one, and the services
    whose pass was recorded (not checked again in this run); empty when no result has a matrix (check mode)."""
    with_matrix = [result for result in results if "matrix" in result]
    if not with_matrix:
        return []
    recorded = [result["item"]["name"] for result in results if result.get("recorded")]
    lines = list(with_matrix[0]["matrix"])
    if recorded:
        lines.append("recorded passes, not checked again: " + ", ".join(recorded))
    return lines
