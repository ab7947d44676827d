"""Ahead-of-time compilation of the DDTree tree kernel into a Triton cache, with a JSON manifest.

    python -m sglang_overlay.kernels.warmup --arch sm_90 --cache-dir DIR --budgets 16,64,256 \\
        [--depth-limits 15] [--top-k 8] [--top-k-caps none] [--manifest PATH] \\
        [--cross-compile] [--allow-no-gpu] [--no-verify]

The service later finds the compiled kernels through the same ``TRITON_CACHE_DIR`` (set it to
``--cache-dir`` in the service's environment) and compiles nothing at its first step.

Two modes:

* **device** (default; needs a CUDA GPU): each kernel variant is compiled through Triton's own
  JIT path on the GPU (``JITFunction.warmup``, then one real launch that also builds Triton's
  small C launcher and is checked against ``build_tree_batched``). The cache entries are exactly
  the ones the service's launches look up. ``--arch`` must then match the GPU (or be omitted).
* **cross-compile** (``--cross-compile``; no GPU needed): ``triton.compile`` with an explicit
  ``GPUTarget`` for ``--arch``, with the same specialisation, options and source the JIT computes,
  so the cache key matches -- **provided the service runs the identical Triton installation** (the
  key includes a hash of Triton itself). Triton's C launcher is not built (it needs libcuda); the
  service builds it at its first launch (about a second, needs a C compiler).

Without a GPU and without ``--cross-compile`` the command fails (exit status 2) with a message;
with ``--allow-no-gpu`` it prints that nothing was compiled, writes no manifest and exits 0.

Kernel variants: one per ``(budget, W, HAS_ROOT, num_warps)`` where ``W`` (int64 words of a packed
rank tuple) follows from ``L`` and ``min(top_k_cap, K)``; ``L``, ``K`` and the cap themselves are
runtime arguments, so every shape with the same ``W`` shares a variant. Both ``HAS_ROOT`` values
(``root_tokens`` given or not) are compiled.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Sequence

__all__ = ["WarmupError", "warmup_kernels", "parse_arch", "main"]

MANIFEST_NAME = "ddtree-tree-kernel-manifest.json"


class WarmupError(RuntimeError):
    """The warm-up cannot run here (no GPU, architecture mismatch, triton missing, ...)."""


def parse_arch(arch: str | int) -> int:
    """``sm_90`` / ``sm_90a`` / ``90`` / ``9.0`` -> 90."""
    text = str(arch).strip().lower()
    if text.startswith("sm_"):
        text = text[3:]
    text = text.rstrip("a")
    try:
        if "." in text:
            major, minor = text.split(".", 1)
            return int(major) * 10 + int(minor)
        value = int(text)
    except ValueError:
        raise ValueError(f"cannot parse the GPU architecture {arch!r} (expected e.g. sm_90)") from None
    if value < 10:
        raise ValueError(f"cannot parse the GPU architecture {arch!r} (expected e.g. sm_90)")
    return value


@dataclass(frozen=True)
class _Shape:
    depth_limit: int
    top_k: int
    top_k_cap: int | None


def _set_cache_dir(cache_dir: str | None) -> str:
    if cache_dir:
        cache_dir = os.path.abspath(cache_dir)
        os.makedirs(cache_dir, exist_ok=True)
        os.environ["TRITON_CACHE_DIR"] = cache_dir
    import triton

    knobs = getattr(triton, "knobs", None)
    if cache_dir and knobs is not None:
        knobs.cache.dir = cache_dir
    if knobs is not None:
        return os.path.abspath(knobs.cache.dir)
    return os.path.abspath(os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache")))


def _cache_entry(cache_dir: str, kernel_hash: str) -> tuple[str, list[str]]:
    from triton.runtime.cache import _base32

    sub = _base32(kernel_hash)
    path = os.path.join(cache_dir, sub)
    files = sorted(os.listdir(path)) if os.path.isdir(path) else []
    return sub, files


def _gpu_capability() -> tuple[int, str] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor, torch.cuda.get_device_name()


def _dummy_inputs(shape: _Shape, device, has_root: bool, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    # A few distinct values: exact ties, so the check below covers the tie-breaking too.
    levels = torch.tensor([0.0, -0.5, -1.0, -2.0])
    lp = levels[torch.randint(0, 4, (2, shape.depth_limit, shape.top_k), generator=gen)]
    lp = lp.sort(dim=-1, descending=True).values.contiguous()
    ids = torch.randint(0, 1000, (2, shape.depth_limit, shape.top_k), generator=gen)
    roots = torch.tensor([1, 2]) if has_root else None

    def to(t):
        return None if t is None else t.to(device)

    return to(lp), to(ids), to(roots)


def _cross_compile(kernel, args, kwargs, capability: int):
    """Compile like ``JITFunction.run`` would on a GPU of ``capability``, without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    knobs = triton.knobs
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    src = ASTSource(kernel, signature, constexprs, attrs)
    return compile(src, target=target, options=options.__dict__)


def warmup_kernels(
    arch: str | int | None = None,
    cache_dir: str | None = None,
    budgets: Sequence[int] = (16, 64, 256),
    depth_limits: Sequence[int] = (15,),
    top_ks: Sequence[int] = (8,),
    top_k_caps: Sequence[int | None] = (None,),
    num_warps: int | None = None,
    cross_compile: bool = False,
    verify: bool = True,
    manifest: str | None = None,
    log=print,
) -> dict:
    """Compile every kernel variant the given sizes need into the Triton cache; return the manifest.

    Raises:
        WarmupError: no GPU (device mode), ``arch`` differs from the GPU, triton missing, or a
            verification launch disagreed with ``build_tree_batched``.
        ValueError: sizes beyond the kernel's limits (naming the parameter), bad ``arch``.
    """
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        raise WarmupError(f"the warm-up needs torch and triton: {exc}") from None
    gpu = None if cross_compile else _gpu_capability()
    if cross_compile:
        if arch is None:
            raise WarmupError("--cross-compile needs --arch (e.g. sm_90)")
        capability = parse_arch(arch)
        device_name = None
    else:
        if gpu is None:
            raise WarmupError(
                "no CUDA GPU is visible: the warm-up compiles the kernel by launching it on the GPU that will run "
                "it. Run it on the GPU host, pass --cross-compile --arch sm_XX to compile without a GPU, or "
                "--allow-no-gpu to skip (nothing is compiled then)."
            )
        capability, device_name = gpu
        if arch is not None and parse_arch(arch) != capability:
            raise WarmupError(
                f"this GPU ({device_name}) is sm_{capability} but --arch {arch} was asked for; run the warm-up on a "
                f"GPU of that architecture or use --cross-compile"
            )

    from . import tree_build as tb

    # One variant per (budget, W, HAS_ROOT, num_warps); remember which shapes map to it.
    variants: dict[tuple, dict] = {}
    for budget in budgets:
        for depth_limit in depth_limits:
            for top_k in top_ks:
                for cap in top_k_caps:
                    cfg = tb.kernel_config(depth_limit, top_k, budget, cap, num_warps)
                    for has_root in (True, False):
                        key = (cfg.budget, cfg.block, cfg.words, has_root, cfg.num_warps)
                        entry = variants.setdefault(key, dict(cfg=cfg, has_root=has_root, shapes=[]))
                        entry["shapes"].append(_Shape(depth_limit, top_k, cap))

    if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off", "no"):
        raise WarmupError("TRITON_INTERPRET is set: the interpreter compiles nothing; unset it for the warm-up")
    cache_dir = _set_cache_dir(cache_dir)

    device = "cuda" if not cross_compile else "cpu"
    records = []
    for (budget, block, words, has_root, nw), entry in sorted(variants.items()):
        shape = entry["shapes"][0]
        lp, ids, roots = _dummy_inputs(shape, device, has_root, seed=budget * 7 + words)
        args, kwargs, _, _ = tb._launch_args(lp, ids, budget, shape.top_k_cap, roots, None, num_warps)
        before = set(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else set()
        t0 = time.perf_counter()
        if cross_compile:
            compiled = _cross_compile(tb._ddtree_build_kernel, args, kwargs, capability)
        else:
            compiled = tb._ddtree_build_kernel.warmup(*args, grid=(lp.shape[0],), **kwargs)
        compile_s = time.perf_counter() - t0
        verified = None
        if verify and not cross_compile:
            got = tb.build_tree_kernel(lp, ids, budget, shape.top_k_cap, roots, num_warps=num_warps)
            want = tb.build_tree_batched(lp, ids, budget, shape.top_k_cap, roots)
            torch.cuda.synchronize()
            verified = bool(got.equals(want))
            if not verified:
                raise WarmupError(f"variant budget={budget} W={words}: the kernel disagrees with build_tree_batched")
        sub, files = _cache_entry(cache_dir, compiled.hash)
        records.append(
            dict(
                constexprs=dict(BUDGET=budget, NP=block, W=words, HAS_ROOT=has_root),
                num_warps=nw,
                num_stages=kwargs["num_stages"],
                shapes=[dict(depth_limit=s.depth_limit, top_k=s.top_k, top_k_cap=s.top_k_cap) for s in entry["shapes"]],
                hash=compiled.hash,
                cache_subdir=sub,
                files=files,
                was_cached=sub in before,
                compile_s=round(compile_s, 3),
                verified=verified,
            )
        )
        log(
            f"{'found' if sub in before else 'compiled'} BUDGET={budget} NP={block} W={words} "
            f"HAS_ROOT={has_root} num_warps={nw} -> {sub} ({compile_s:.2f} s{', verified' if verified else ''})"
        )

    import triton

    doc = dict(
        kernel=f"{tb.__name__}._ddtree_build_kernel",
        mode="cross-compile" if cross_compile else "device",
        arch=f"sm_{capability}",
        capability=capability,
        device=device_name,
        triton=triton.__version__,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        cache_dir=cache_dir,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        limits=dict(max_budget=tb.MAX_BUDGET, max_depth=tb.MAX_DEPTH, max_top_k=tb.MAX_TOP_K),
        variants=records,
        usage=f"set TRITON_CACHE_DIR={cache_dir} in the service's environment",
    )
    path = manifest or os.path.join(cache_dir, MANIFEST_NAME)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    doc["manifest"] = os.path.abspath(path)
    log(f"wrote {doc['manifest']} ({len(records)} variants, {doc['mode']}, sm_{capability})")
    return doc


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _cap_list(text: str) -> list[int | None]:
    out: list[int | None] = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        out.append(None if x in ("none", "k") else int(x))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_overlay.kernels.warmup",
        description="Compile the DDTree GPU tree kernel ahead of time into a Triton cache and write a manifest.",
    )
    parser.add_argument("--arch", help="GPU architecture, e.g. sm_90 (default: the visible GPU's)")
    parser.add_argument("--cache-dir", help="Triton cache directory (default: $TRITON_CACHE_DIR or ~/.triton/cache)")
    parser.add_argument("--budgets", type=_int_list, default=[16, 64, 256], help="comma-separated (default 16,64,256)")
    parser.add_argument(
        "--depth-limits",
        type=_int_list,
        default=[15],
        help="draft positions L = block_size - 1, comma-separated (default 15)",
    )
    parser.add_argument("--top-k", type=_int_list, default=[8], help="K per position, comma-separated (default 8)")
    parser.add_argument(
        "--top-k-caps",
        type=_cap_list,
        default=[None],
        help="top_k_cap values, comma-separated, 'none' = K (default none)",
    )
    parser.add_argument("--num-warps", type=int, default=None, help="override warps per program")
    parser.add_argument("--manifest", help=f"manifest path (default CACHE_DIR/{MANIFEST_NAME})")
    parser.add_argument(
        "--cross-compile",
        action="store_true",
        help="compile for --arch without a GPU (needs the identical triton install at run time)",
    )
    parser.add_argument(
        "--allow-no-gpu",
        action="store_true",
        help="without a GPU (and without --cross-compile): compile nothing, exit 0",
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the checking launch of each variant")
    ns = parser.parse_args(argv)

    if not ns.cross_compile and ns.allow_no_gpu and _gpu_capability() is None:
        print("ddtree warmup: no CUDA GPU visible and --allow-no-gpu given: nothing was compiled, no manifest written")
        return 0
    try:
        warmup_kernels(
            arch=ns.arch,
            cache_dir=ns.cache_dir,
            budgets=ns.budgets,
            depth_limits=ns.depth_limits,
            top_ks=ns.top_k,
            top_k_caps=ns.top_k_caps,
            num_warps=ns.num_warps,
            cross_compile=ns.cross_compile,
            verify=not ns.no_verify,
            manifest=ns.manifest,
            log=lambda msg: print(f"ddtree warmup: {msg}", flush=True),
        )
    except (WarmupError, ValueError) as exc:
        print(f"ddtree warmup: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
