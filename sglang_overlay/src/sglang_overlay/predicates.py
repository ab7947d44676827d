"""Predicate matrix of SGLang's speculative algorithms, as the running process sees them.

    python -m sglang_overlay.predicates --json            # after SGLang's load_plugins()
    python -m sglang_overlay.predicates --json --no-plugins   # pristine: no plugin loaded
    python path/to/predicates.py --json                   # the file alone works the same

For each algorithm name (every ``SpeculativeAlgorithm`` member, the reserved aliases such as
NEXTN, every plugin-registered name, and DDTREE whether or not it is known) it reports the value of
every zero-argument ``is_*`` / ``supports_*`` / ``has_*`` / ``carries_*`` / ``need_*`` method of
``SpeculativeAlgorithm`` (found by introspection, not listed here) plus other per-algorithm
behaviour the scheduler reads (draft-token width of the target-verify forward, overlap support).
The deploy tooling runs it in one stack with and without the overlay release on PYTHONPATH and
requires every built-in row to be identical.

This file imports only the standard library and sglang, so it can run from a copy.
Exit status: 0; with ``--check-ddtree``, 1 when DDTREE is missing or not DFlash-family.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import Any

# Zero-argument query methods whose values make up the matrix.
PREDICATE_PREFIXES = ("is_", "supports_", "has_", "carries_", "need_")
# Names always reported, known or not (so a pristine run shows DDTREE as unknown).
ALWAYS_REPORTED = ("DDTREE",)
# Widths at which get_num_tokens_per_req_for_target_verify is sampled.
SAMPLE_DRAFT_TOKENS = (4, 16)


def predicate_names() -> list[str]:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    names = []
    for name, value in vars(SpeculativeAlgorithm).items():
        if not name.startswith(PREDICATE_PREFIXES) or not inspect.isfunction(value):
            continue
        params = list(inspect.signature(value).parameters.values())
        if len(params) == 1:  # self only
            names.append(name)
    return sorted(names)


def algorithm_names() -> list[str]:
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    names = [member.name for member in SpeculativeAlgorithm]
    names += sorted(spec_registry._RESERVED_ALIASES)
    names += sorted(getattr(spec_registry, "_REGISTRY", {}))
    names += list(ALWAYS_REPORTED)
    seen: set[str] = set()
    return [n for n in names if not (n in seen or seen.add(n))]


def _call(fn, *args) -> Any:
    try:
        value = fn(*args)
    except Exception as exc:  # reported, not raised: the matrix must always come out
        return {"error": f"{type(exc).__name__}: {exc}"}
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def algorithm_row(name: str, predicates: list[str]) -> dict[str, Any]:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        algo = SpeculativeAlgorithm.from_string(name)
    except Exception as exc:
        return {"known": False, "error": f"{type(exc).__name__}: {exc}"}
    row: dict[str, Any] = {
        "known": True,
        "resolves_to": getattr(algo, "name", str(algo)),
        "kind": "builtin" if isinstance(algo, SpeculativeAlgorithm) else "plugin",
        "predicates": {},
        "behaviour": {},
    }
    for pred in predicates:
        method = getattr(algo, pred, None)
        row["predicates"][pred] = {"error": "missing"} if method is None else _call(method)
    behaviour = row["behaviour"]
    per_req = getattr(algo, "get_num_tokens_per_req_for_target_verify", None)
    for width in SAMPLE_DRAFT_TOKENS:
        for is_draft in (False, True):
            key = f"target_verify_tokens_per_req(num_draft_tokens={width},draft_worker={is_draft})"
            behaviour[key] = {"error": "missing"} if per_req is None else _call(per_req, width, is_draft)
    # Plugins declare overlap support at registration; builtins have no such attribute.
    behaviour["plugin_supports_overlap"] = getattr(algo, "supports_overlap", None)
    for method_name in (
        "create_future_map",
        "build_disagg_draft_input",
        "create_worker",
        "handle_server_args",
        "get_platform_worker_cls",
    ):
        behaviour[f"has_{method_name}"] = callable(getattr(algo, method_name, None))
    return row


def predicate_matrix(load_plugins: bool = True) -> dict[str, Any]:
    """The matrix as a JSON-able dict. ``load_plugins`` runs SGLang's ``load_plugins()`` first."""
    import sglang

    plugin_names: list[str] = []
    if load_plugins:
        from importlib.metadata import entry_points

        from sglang.srt.plugins import GENERAL_PLUGINS_GROUP
        from sglang.srt.plugins import load_plugins as sglang_load_plugins

        plugin_names = sorted(ep.name for ep in entry_points(group=GENERAL_PLUGINS_GROUP))
        sglang_load_plugins()
    predicates = predicate_names()
    return {
        "sglang_version": getattr(sglang, "__version__", None),
        "plugins_loaded": load_plugins,
        "plugins_discovered": plugin_names,
        "predicates": predicates,
        "algorithms": {name: algorithm_row(name, predicates) for name in algorithm_names()},
    }


def ddtree_problem(matrix: dict[str, Any]) -> str | None:
    """None when DDTREE is known and DFlash-family, else why not."""
    row = matrix["algorithms"].get("DDTREE", {})
    if not row.get("known"):
        return f"DDTREE is not a known speculative algorithm: {row.get('error')}"
    preds = row["predicates"]
    wrong = [p for p in ("is_dflash", "is_dflash_family", "is_speculative") if preds.get(p) is not True]
    if wrong:
        return f"DDTREE is known but {', '.join(wrong)} is not True"
    dflash = matrix["algorithms"].get("DFLASH", {}).get("predicates", {})
    differs = sorted(p for p in preds if preds[p] != dflash.get(p))
    if differs:
        return f"DDTREE differs from DFLASH in {differs}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_overlay.predicates",
        description="Print SGLang's speculative-algorithm predicate matrix.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (the default format)")
    parser.add_argument("--no-plugins", action="store_true", help="do not run load_plugins()")
    parser.add_argument(
        "--check-ddtree",
        action="store_true",
        help="exit 1 unless DDTREE is known and answers every predicate as DFLASH does",
    )
    args = parser.parse_args(argv)
    matrix = predicate_matrix(load_plugins=not args.no_plugins)
    json.dump(matrix, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    if args.check_ddtree:
        problem = ddtree_problem(matrix)
        if problem:
            print(f"predicates: {problem}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
