"""Compile every overlay Triton kernel, as the services launch it, for each GPU the collection targets, and check
what a block of it needs (shared memory, registers) against that GPU's limits. No GPU needed.

    python check_kernels.py --repo REPO --report .cache/kernel-resources.json [--cache-dir DIR] [--list]

Which GPUs: every compute capability of plugins/module_utils/kernel_targets.py's KERNEL_GPUS (the list preflight
refuses DDTREE outside of), and every one the repository's inventories declare (preflight_compute_capabilities in
inventories/*/group_vars and host_vars); an inventory's GPU without a row there fails the check, naming it.

Which launches: each kernel's own wrapper is called with CPU tensors of the shapes the services use (the
inventories' models and tensor-parallel sizes, MODEL_SHAPES; the budgets, windows and top-k below) while
Triton's launcher is replaced by a recorder, so the constexprs, block sizes and warps are exactly the wrapper's.
Each recorded launch is then compiled for each GPU as sglang_overlay.kernels.warmup cross-compiles
(triton.compile with an explicit GPUTarget): shared memory from the compiled metadata, registers and spills
from ptxas's own report of that compile. Compiled kernels stay in a Triton cache of their own (--cache-dir),
with ptxas's report beside them by kernel hash, so only a changed kernel compiles again.

Exit status 1 when a kernel needs more than a GPU gives a block, or spills registers (each message names the
kernel, the GPU and the resource), 2 when the inputs are wrong (an inventory's GPU or model that has no row).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
import time

# What the services run (sglang_overlay/docs/adapter.md): DDTREE budgets up to 511 nodes (the tree kernel's
# MAX_BUDGET is the largest it takes), a verify window of budget + 1 tokens, top-k from 8 (the default) to
# the budget's default_top_k (32) and the fused kernel's MAX_FUSED_K; drafter blocks of 16 (L = 15).
BUDGETS = (15, 63, 255, 511)
TOP_KS = (8, 15, 32)
DEPTH_LIMIT = 15
# The longest accepted path: the drafter's block (the root and one node per draft position).
DRAFTER_BLOCK = DEPTH_LIMIT + 1
# The models the inventories serve, by the name of their directory (model_path's last part): attention heads,
# KV heads, head dim (config.json) and the vocabulary the drafter's top-k runs over.
MODEL_SHAPES = {
    "Qwen3-Coder-30B-A3B-Instruct": {"q_heads": 32, "kv_heads": 4, "head_dim": 128, "vocab": 151936},
    "GLM-4.5-Air": {"q_heads": 96, "kv_heads": 8, "head_dim": 128, "vocab": 151552},
}


class InputError(Exception):
    """The inventories name a GPU or a model this check has no row for."""


def load_kernel_targets(repo: str):
    path = os.path.join(repo, "plugins", "module_utils", "kernel_targets.py")
    spec = importlib.util.spec_from_file_location("ddtree_kernel_targets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inventory_vars(repo: str) -> list[tuple[str, dict]]:
    """(path, variables) of every group_vars and host_vars file of the repository's inventories, once each."""
    import yaml

    seen, found = set(), []
    for pattern in ("inventories/*/group_vars/*.yml", "inventories/*/host_vars/*.yml"):
        for path in sorted(glob.glob(os.path.join(repo, pattern))):
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            with open(path) as handle:
                found.append((os.path.relpath(real, repo), yaml.safe_load(handle) or {}))
    return found


def inventory_capabilities(repo: str) -> dict[str, list[str]]:
    """{compute capability: [files declaring it]} from preflight_compute_capabilities."""
    declared: dict[str, list[str]] = {}
    for path, variables in inventory_vars(repo):
        for capability in variables.get("preflight_compute_capabilities") or []:
            declared.setdefault(str(capability), []).append(path)
    return declared


def inventory_models(repo: str) -> list[dict]:
    """[{model, tp_size, file}] of every service the inventories declare."""
    models = []
    for path, variables in inventory_vars(repo):
        for service in variables.get("sglang_services") or []:
            models.append(
                {
                    "model": os.path.basename(str(service["model_path"]).rstrip("/")),
                    "tp_size": int(service.get("tp_size") or 1),
                    "file": path,
                }
            )
    return models


def kv_copy_config(stride_bytes: int) -> dict:
    """SGLang 0.5.23's MHATokenToKVPool._kv_copy_config for one layer buffer's bytes per slot (memory_pool.py):
    what the worker passes move_path_kv."""
    if stride_bytes >= 8192:
        tile = 512
    elif stride_bytes >= 4096:
        tile = 256
    else:
        tile = 128
    return {"bytes_per_tile": tile, "byte_tiles": -(-stride_bytes // tile), "num_warps": 4 if tile <= 256 else 8}


def launch_cases(models: list[dict], capabilities: dict[str, int]):
    """[(kernel, shape, call, gpus)]: each call runs a kernel wrapper once with CPU tensors of that shape; gpus, the
    compute capabilities it is compiled for (those of ``capabilities``, name -> Triton's number, that launch it so).
    """
    import torch

    from sglang_overlay.kernels import accept_path, draft_topk, full_mask, kv_move, tree_attention, tree_build

    cases = []
    windows = [budget + 1 for budget in BUDGETS]

    def tree(budget, depth, width):
        lp = torch.zeros((1, depth, width))
        ids = torch.zeros((1, depth, width), dtype=torch.int64)
        return lambda: tree_build.build_tree_kernel(lp, ids, budget, None, torch.zeros(1, dtype=torch.int64))

    for budget in BUDGETS + (tree_build.MAX_BUDGET,):
        cases.append(("tree_build", "budget %d L%d K8" % (budget, DEPTH_LIMIT), tree(budget, DEPTH_LIMIT, 8), None))
        cases.append(
            (
                "tree_build",
                "budget %d L%d K%d" % (budget, tree_build.MAX_DEPTH, tree_build.MAX_TOP_K),
                tree(budget, tree_build.MAX_DEPTH, tree_build.MAX_TOP_K),
                None,
            )
        )

    def topk(vocab, k, span):
        logits = torch.zeros((1, vocab), dtype=torch.bfloat16)
        return lambda: draft_topk.fused_draft_topk(logits, k, span=span)

    for vocab in sorted({MODEL_SHAPES[model["model"]]["vocab"] for model in models}):
        for k in TOP_KS + (draft_topk.MAX_FUSED_K,):
            cases.append(("draft_topk", "vocab %d k%d chunks" % (vocab, k), topk(vocab, k, 1), None))
            span = draft_topk.default_span(vocab, k, torch.bfloat16, draft_topk.DEFAULT_BLOCK, draft_topk.DEFAULT_GROUP)
            if span > 1:
                cases.append(("draft_topk", "vocab %d k%d span %d" % (vocab, k, span), topk(vocab, k, span), None))

    def attention(q_heads, kv_heads, head_dim, window, config):
        q = torch.zeros((window, q_heads, head_dim), dtype=torch.bfloat16)
        kv = torch.zeros((window, kv_heads, head_dim), dtype=torch.bfloat16)
        buffer = torch.zeros((window, kv_heads, head_dim), dtype=torch.bfloat16)
        indptr = torch.tensor([0, window], dtype=torch.int32)
        zero = torch.zeros(2, dtype=torch.int32)
        mask = torch.ones(window * window, dtype=torch.bool)
        return lambda: tree_attention.tree_verify_attention(
            q,
            kv,
            kv,
            torch.empty_like(q),
            buffer,
            buffer,
            indptr,
            zero,
            zero[:0],
            mask,
            torch.tensor([0, window * window], dtype=torch.int64),
            window,
            config=config,
        )

    # The tile the adapter runs on each GPU (DDTREE_TREE_ATTENTION_CONFIG, else that GPU's), on every window it serves.
    tiles: dict[tuple, list[str]] = {}
    for capability, number in capabilities.items():
        tiles.setdefault(tree_attention.config_from_env(capability=number), []).append(capability)
    shapes = sorted({(model["model"], model["tp_size"]) for model in models})
    for name, tp_size in shapes:
        shape = MODEL_SHAPES[name]
        q_heads, kv_heads = shape["q_heads"] // tp_size, max(1, shape["kv_heads"] // tp_size)
        for config, gpus in tiles.items():
            for window in [w for w in [16, 32, 64, 128, 512] if w <= tree_attention.MAX_WINDOW]:
                cases.append(
                    (
                        "tree_attention",
                        "%s/tp%d %dq/%dkv d%d W%d tile %s"
                        % (name, tp_size, q_heads, kv_heads, shape["head_dim"], window, ",".join(map(str, config))),
                        attention(q_heads, kv_heads, shape["head_dim"], window, config),
                        gpus,
                    )
                )
        stride = kv_heads * shape["head_dim"] * 2
        copy_config = kv_copy_config(stride)
        for window in windows:
            ptrs = torch.zeros(2, dtype=torch.int64)
            strides = torch.full((2,), stride, dtype=torch.int64)
            loc = torch.zeros(window, dtype=torch.int64)
            index = torch.zeros((1, window), dtype=torch.int64)
            lens = torch.ones(1, dtype=torch.int64)
            cases.append(
                (
                    "kv_move",
                    "%s/tp%d %d B/slot W%d" % (name, tp_size, stride, window),
                    (
                        lambda p=ptrs, s=strides, o=loc, i=index, n=lens, c=copy_config: kv_move.move_path_kv(
                            p, s, o, i, n, c, max_path=DRAFTER_BLOCK
                        )
                    ),
                    None,
                )
            )

    for window in windows:
        ancestors = torch.zeros((1, window, window), dtype=torch.bool)
        prefix = torch.zeros(1, dtype=torch.int64)
        out = torch.zeros(window * window, dtype=torch.bool)
        cases.append(
            (
                "full_mask",
                "W%d" % window,
                (lambda o=out, a=ancestors, p=prefix: full_mask.write_full_mask(o, a, p)),
                None,
            )
        )
        index = torch.zeros((1, window), dtype=torch.int64)
        one = torch.ones(1, dtype=torch.int64)
        predict = torch.zeros(window, dtype=torch.int64)
        cases.append(
            (
                "accept_path",
                "W%d" % window,
                (lambda i=index, n=one, p=predict: accept_path.accept_path(p, i, n, n)),
                None,
            )
        )
    return cases


def record_launches(cases):
    """[(kernel, shape, jit_function, args, kwargs, gpus)] of every launch the cases make, identical ones once
    (gpus: the compute capabilities it is compiled for, None for all)."""
    from triton.runtime.jit import JITFunction

    launches, seen = [], set()
    recorded = []

    def record(self, *args, grid, warmup, **kwargs):  # noqa: ARG001 - Triton's signature
        recorded.append((self, args, kwargs))

    original = JITFunction.run
    JITFunction.run = record
    try:
        for kernel, shape, call, gpus in cases:
            del recorded[:]
            call()
            for function, args, kwargs in recorded:
                key = (
                    function.__name__,
                    tuple(sorted((name, repr(value)) for name, value in kwargs.items())),
                    tuple(gpus or ()),
                )
                if key in seen:
                    continue
                seen.add(key)
                launches.append((kernel, shape, function, args, kwargs, gpus))
    finally:
        JITFunction.run = original
    return launches


PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
PTXAS_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas_log(text: str) -> dict | None:
    """ptxas -v's report of one kernel: registers per thread, stack frame and spill bytes."""
    registers, spills = PTXAS_REGISTERS.search(text), PTXAS_SPILLS.search(text)
    if not registers or not spills:
        return None
    return {
        "registers": int(registers.group(1)),
        "stack_bytes": int(spills.group(1)),
        "spill_store_bytes": int(spills.group(2)),
        "spill_load_bytes": int(spills.group(3)),
    }


def compile_for(function, args, kwargs, capability: int, cache_dir: str) -> tuple[object, dict, bool]:
    """The compiled kernel, ptxas's report of it, and whether it compiled now (False: found in the cache)."""
    import triton

    from sglang_overlay.kernels.warmup import _cross_compile

    reports = os.path.join(cache_dir, "ptxas")
    os.makedirs(reports, exist_ok=True)
    for cache in (os.path.join(cache_dir, "triton"), None):
        with contextlib.ExitStack() as stack:
            # A kernel found in the cache without its report (an interrupted run) compiles again in a fresh cache.
            triton.knobs.cache.dir = cache or stack.enter_context(tempfile.TemporaryDirectory())
            triton.knobs.nvidia.dump_ptxas_log = True
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                compiled = _cross_compile(function, args, kwargs, capability)
        path = os.path.join(reports, compiled.hash + ".json")
        report = parse_ptxas_log(out.getvalue())
        if report is not None:
            with open(path + ".tmp", "w") as handle:
                json.dump(report, handle)
            os.replace(path + ".tmp", path)
            return compiled, report, True
        if os.path.exists(path):
            with open(path) as handle:
                return compiled, json.load(handle), False
    raise RuntimeError("ptxas reported nothing for %s on sm_%d" % (function.__name__, capability))


def spill_problems(kernel: str, capability: str, report: dict, registers_per_thread: int) -> list[str]:
    """A kernel that spills needs more registers than a thread gets: its values go through local memory on every
    use, which the tiles are chosen to avoid (a GPU's tile in kernels/tree_attention.py's TILES)."""
    if not report["spill_store_bytes"]:
        return []
    return [
        "%s on compute capability %s: %d bytes of registers spilled to local memory (it needs more than the GPU's %d "
        "registers per thread); give this GPU a smaller tile or block"
        % (kernel, capability, report["spill_store_bytes"], registers_per_thread)
    ]


def status(problems: list) -> str:
    """over: beyond a limit, registers spilled included (the stage fails); else ok."""
    return "over" if problems else "ok"


def human(size: int) -> str:
    return "%d" % size if size < 1024 else "%.1fK" % (size / 1024)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="the repository (its inventories and plugins/module_utils)")
    parser.add_argument("--report", required=True, help="where the JSON report goes")
    parser.add_argument(
        "--cache-dir",
        default=os.path.join(tempfile.gettempdir(), "ddtree-kernel-check"),
        help="compiled kernels and ptxas reports, kept between runs",
    )
    parser.add_argument(
        "--list", action="store_true", help="print the launches (kernel, function, shape), compile nothing"
    )
    options = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    targets = load_kernel_targets(options.repo)

    declared = inventory_capabilities(options.repo)
    models = inventory_models(options.repo)
    errors = [
        "%s declares compute capability %s, which KERNEL_GPUS (plugins/module_utils/kernel_targets.py) has "
        "no row for: add it with that GPU's limits so the kernels are compiled and checked for it (preflight "
        "refuses DDTREE on it until then)" % (", ".join(files), capability)
        for capability, files in sorted(declared.items())
        if capability not in targets.KERNEL_GPUS
    ]
    errors += [
        "%s: model %s has no row in MODEL_SHAPES (sglang_overlay/scripts/check_kernels.py): add its attention "
        "heads, KV heads, head dim and vocabulary (config.json)" % (model["file"], model["model"])
        for model in models
        if model["model"] not in MODEL_SHAPES
    ]
    if errors:
        print("\n".join("error: " + error for error in errors), file=sys.stderr)
        return 2
    capabilities = sorted(set(targets.kernel_capabilities()) | set(declared), key=targets.capability_number)

    started = time.monotonic()
    launches = record_launches(
        launch_cases(models, {capability: targets.capability_number(capability) for capability in capabilities})
    )
    if options.list:
        for kernel, shape, function, _, kwargs, gpus in launches:
            print(
                "%s\t%s\t%s\tnum_warps=%s\t%s"
                % (kernel, function.__name__, shape, kwargs.get("num_warps"), ",".join(gpus or capabilities))
            )
        return 0
    rows, problems, compiled_count = [], [], 0
    for kernel, shape, function, args, kwargs, gpus in launches:
        for capability in gpus or capabilities:
            t0 = time.monotonic()
            compiled, report, fresh = compile_for(
                function, args, kwargs, targets.capability_number(capability), options.cache_dir
            )
            seconds = time.monotonic() - t0
            compiled_count += fresh
            warps = compiled.metadata.num_warps
            label = "%s (%s; %s)" % (kernel, function.__name__, shape)
            found = targets.resource_problems(label, capability, compiled.metadata.shared, report["registers"], warps)
            limits = targets.KERNEL_GPUS[capability]
            found += spill_problems(label, capability, report, limits["registers_per_thread"])
            problems += found
            rows.append(
                dict(
                    kernel=kernel,
                    function=function.__name__,
                    shape=shape,
                    capability=capability,
                    constexprs={name: value for name, value in kwargs.items() if name.isupper()},
                    num_warps=warps,
                    shared_bytes=compiled.metadata.shared,
                    shared_limit=limits["shared_bytes_per_block"],
                    registers_per_block=targets.registers_per_block(report["registers"], warps),
                    status=status(found),
                    problems=found,
                    hash=compiled.hash,
                    compile_seconds=round(seconds, 2),
                    **report,
                )
            )
    doc = {
        "capabilities": capabilities,
        "inventory_capabilities": declared,
        "models": models,
        "limits": {capability: targets.KERNEL_GPUS[capability] for capability in capabilities},
        "kernels": rows,
        "problems": problems,
        "seconds": round(time.monotonic() - started, 1),
    }
    os.makedirs(os.path.dirname(os.path.abspath(options.report)), exist_ok=True)
    with open(options.report, "w") as handle:
        json.dump(doc, handle, indent=1)
        handle.write("\n")

    print_table(rows, capabilities)
    print(
        "%d launches x %d GPUs (compute capabilities %s) in %.0f s, %d compiled now, the rest from %s; report: %s"
        % (
            len(launches),
            len(capabilities),
            ", ".join(capabilities),
            doc["seconds"],
            compiled_count,
            options.cache_dir,
            options.report,
        )
    )
    if problems:
        print("\n".join("error: " + problem for problem in problems), file=sys.stderr)
        return 1
    return 0


def print_table(rows: list[dict], capabilities: list[str]) -> None:
    """One line per launch: for each GPU, shared memory, registers per thread, spilled bytes and the verdict."""
    by_launch: dict[tuple, dict] = {}
    for row in rows:
        by_launch.setdefault((row["kernel"], row["function"], row["shape"]), {})[row["capability"]] = row
    head = "%-14s %-24s %-62s" % ("kernel", "function", "shape")
    head += "".join(" | %-26s" % ("sm_%s smem/regs/spill" % capability.replace(".", "")) for capability in capabilities)
    print(head)
    print("-" * len(head))
    for (kernel, function, shape), cells in by_launch.items():
        line = "%-14s %-24s %-62s" % (kernel, function, shape)
        for capability in capabilities:
            row = cells.get(capability)
            if row is None:  # a launch of another GPU's tile
                line += " | %-26s" % "-"
                continue
            line += " | %-26s" % (
                "%s/%d/%d w%d %s"
                % (
                    human(row["shared_bytes"]),
                    row["registers"],
                    row["spill_store_bytes"],
                    row["num_warps"],
                    row["status"],
                )
            )
        print(line)


if __name__ == "__main__":
    sys.exit(main())
