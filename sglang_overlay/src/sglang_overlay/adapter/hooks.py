"""Method hooks the adapter registers with SGLang's ``HookRegistry``.

Every target below exists in SGLang 0.5.23 (the plugin loads only there). Each hook changes
behaviour only for a DDTree server (a record carrying DDTree settings, or a batch carrying the
DDTree tree-verify input); any other server, built-in algorithms included, runs SGLang's code.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import knobs

logger = logging.getLogger(__name__)

TARGET_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
TARGET_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
# Registered by algorithm.register_worker_selection (it returns the DDTree worker, which imports this
# module: the worker selection lives beside the other worker factory so no import circle forms).
TARGET_CREATE_WORKER = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"
# Registered lazily by the worker (importing the graph runner pulls in the GPU stack, which
# tokenizer/detokenizer processes should not pay for).
TARGET_CAN_RUN_GRAPH = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph"
# TARGET_VERIFY is also an "extend" mode that the prefill (piecewise/full) graph runner may take.
TARGET_CAN_RUN_PREFILL_GRAPH = (
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph"
)
GRAPH_GUARD_TARGETS = (TARGET_CAN_RUN_GRAPH, TARGET_CAN_RUN_PREFILL_GRAPH)
# The dummy verify input a decode graph runner captures TARGET_VERIFY with. Registered at start-up:
# the target's graphs are captured before the DDTree worker exists.
TARGET_GRAPH_SPEC_INFO = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"

# Whether a hybrid target's speculative conv-window cache may be deduplicated into an overlapping
# sliding view (chain verifies only). Registered at start-up: the pools exist before the worker does.
TARGET_CONV_WINDOW_DEDUP = "sglang.srt.mem_cache.memory_pool.conv_window_dedup_enabled"
# SGLang's linear-attention backends whose verify takes the tree links (``topk > 1``).
LINEAR_TREE_BACKEND_BASE = "MambaAttnBackendBase"

# Attribute that marks the DDTree tree-verify input (see tree_verify.DDTreeVerifyInput).
TREE_VERIFY_MARKER = "ddtree_tree_verify"
# Set on a decode graph runner whose TARGET_VERIFY graphs read the tree mask (see after_get_spec_info).
TREE_MASK_CAPTURED = "ddtree_tree_mask_captured"


def eager_tree_verify() -> bool:
    """``knobs.EAGER_TREE_VERIFY``: capture DFLASH's causal verify graphs as they are and run the tree
    verify eagerly (the guard refuses every replay). For A/B measurements."""
    return knobs.EAGER_TREE_VERIFY.get()


#: Attention backends whose ``extend_attention_fwd`` attribute the tree verify calls with SGLang's
#: FULL mask (``forward_extend`` -> ``_forward_extend_kernel``): the ones the wrapper may replace.
TREE_ATTENTION_BACKENDS = ("TritonAttnBackend",)


def tree_attention_wanted() -> bool:
    """``knobs.TREE_ATTENTION``: the target's tree verify attention runs the overlay's grouped kernel
    (``kernels.tree_attention``) instead of SGLang's Triton extend kernel with the FULL mask."""
    return knobs.TREE_ATTENTION.get()


def install_tree_attention(*backends: Any) -> int:
    """Route the tree verify attention of these target backends to ``kernels.tree_attention``.

    Not with ``knobs.TREE_ATTENTION`` off; only on SGLang's Triton backend, whose ``forward_extend``
    calls its ``extend_attention_fwd`` attribute (set per instance in its ``__init__``); the wrapper
    (``tree_attention.extend_fn``) passes every call without a custom mask (prefill, and any other
    mode) to SGLang's function unchanged, and is never applied twice. Must run before the target
    captures its verify graphs (``after_get_spec_info``) so the graphs hold the new kernel; also run
    by the worker for the eager verify. Returns how many backends were wrapped now.
    """
    if not tree_attention_wanted():
        return 0
    from ..kernels.tree_attention import WRAPPED, extend_fn, tree_attention_available

    if not tree_attention_available():
        return 0
    wrapped = 0
    for backend in backends:
        if backend is None or type(backend).__name__ not in TREE_ATTENTION_BACKENDS:
            continue
        fn = getattr(backend, "extend_attention_fwd", None)
        if fn is None or getattr(fn, WRAPPED, False):
            continue
        backend.extend_attention_fwd = extend_fn(fn)
        wrapped += 1
    if wrapped:
        logger.info(
            "DDTREE tree verify attention: the grouped kernel on %d backend(s) (%s=0: SGLang's)",
            wrapped,
            knobs.TREE_ATTENTION.name,
        )
    return wrapped


def after_get_spec_info(result, self, *args, **kwargs):
    """A DDTREE server's target captures its TARGET_VERIFY graphs reading the tree-mask buffer.

    DFLASH's dummy verify input has no custom mask on backends with a causal verify path (Triton,
    FlashInfer, FA3, ...), so its graphs attend causally. For a DDTREE server's *target* runner the
    input gets the runner's mask buffer instead, as SGLang's own EAGLE top-k > 1 and NGRAM dummy
    inputs do: the backend then captures its masked verify kernel, which reads the mask from the
    backend's graph buffer; at replay the backend copies the step's tree mask into that buffer
    (``_update_target_verify_buffers``). The runner is marked so the guard lets tree verifies
    replay only through graphs captured this way. The drafter's runner and every other server: no
    change.
    """
    model_runner = getattr(self, "model_runner", None)
    if result is None or model_runner is None or getattr(model_runner, "is_draft_worker", True):
        return result
    if eager_tree_verify() or not hasattr(result, "custom_mask"):
        return result
    from .resolution import resolved_settings

    settings = resolved_settings(getattr(model_runner, "server_args", None))
    if settings is None:
        return result
    if result.custom_mask is None:
        result.custom_mask = self.buffers.custom_mask
    install_tree_attention(getattr(self, "attn_backend", None), getattr(model_runner, "attn_backend", None))
    plan = hybrid_plan_of(model_runner)
    if plan is not None and plan.tree_state:
        enable_linear_tree_verify(
            settings.effective_top_k, getattr(self, "attn_backend", None), model_runner.attn_backend
        )
    setattr(self, TREE_MASK_CAPTURED, True)
    return result


def around_conv_window_dedup(original, *args, **kwargs):
    """A DDTREE server keeps the dense speculative conv-window cache: a tree's nodes read their ancestors'
    windows, which the deduplicated sliding view (one shared buffer for a chain's consecutive steps) would
    overwrite. Every other server: SGLang's decision."""
    from .resolution import resolved_settings

    try:
        from sglang.srt.runtime_context import get_server_args

        server_args = get_server_args()
    except Exception:  # noqa: BLE001 (no published record: not a server process, SGLang decides)
        server_args = None
    if resolved_settings(server_args) is not None:
        return False
    return original(*args, **kwargs)


def hybrid_plan_of(model_runner):
    """``hybrid.hybrid_plan`` for a DDTREE server's target runner (None: not hybrid, or not DDTREE): its
    layout by SGLang's ``mambaish_config``, the resolved linear verify backend and ReplaySSM switch."""
    from .hybrid import classify_hybrid, hybrid_plan
    from .resolution import resolved_settings

    settings = resolved_settings(getattr(model_runner, "server_args", None))
    model_config = getattr(model_runner, "model_config", None)
    if settings is None or model_config is None:
        return None
    from sglang.srt.arg_groups.model_override_base import resolved_view
    from sglang.srt.configs.hybrid_arch import mambaish_config

    config = mambaish_config(model_config)
    if config is None:
        return None
    view = resolved_view(model_runner.server_args)
    verdict = classify_hybrid(
        type(config).__name__,
        use_kda=getattr(config, "use_kda", None),
        linear_attn_verify_backend=getattr(view, "linear_attn_verify_backend", None),
        replayssm_spec=bool(getattr(view, "enable_linear_replayssm_spec", False)),
    )
    return hybrid_plan(verdict, settings.allow_hybrid_unsafe)


def linear_tree_backends(*backends: Any) -> list:
    """The linear-attention backends (SGLang's ``MambaAttnBackendBase``) in these target backends, each
    once: a hybrid target's backend holds its linear one as ``linear_attn_backend``."""
    found: list = []
    for backend in backends:
        for candidate in (backend, getattr(backend, "linear_attn_backend", None)):
            if candidate is None or any(c is candidate for c in found):
                continue
            if any(cls.__name__ == LINEAR_TREE_BACKEND_BASE for cls in type(candidate).__mro__):
                found.append(candidate)
    return found


def dense_conv_windows(windows) -> bool:
    """Whether a mamba pool's speculative conv windows (``mamba_cache.intermediate_conv_window``) have one
    window per draft token of their own (the dense layout a tree needs): the deduplicated layout's views
    overlap, so they are not contiguous. None or no windows (not where SGLang keeps them): not dense."""
    return bool(windows) and all(bool(w.is_contiguous()) for w in windows)


def enable_linear_tree_verify(top_k: int, *backends: Any) -> int:
    """Make these target backends' linear attention verify the tree: ``topk > 1`` is SGLang's switch for
    building ``retrieve_parent_token`` from the verify input's tree links and copying the links into its
    CUDA-graph buffers, so each node's conv window and recurrent state start from its parent's snapshot.
    A chain (top-k 1) takes the same path. Must run before the target captures its verify graphs. Returns
    how many backends changed."""
    if knobs.HYBRID_CHAIN_STATE.get():
        logger.warning(
            "DDTREE hybrid target: %s=1 leaves the linear attention verifying a chain: lossy, a control only",
            knobs.HYBRID_CHAIN_STATE.name,
        )
        return 0
    changed = 0
    for backend in linear_tree_backends(*backends):
        want = max(2, int(top_k))
        if int(getattr(backend, "topk", 0) or 0) < want:
            backend.topk = want
            changed += 1
    if changed:
        logger.info("DDTREE hybrid target: tree verify on %d linear-attention backend(s) (topk %d)", changed, want)
    return changed


def around_can_run_graph(original, self, forward_batch, *args, **kwargs):
    """Replay a graph for a DDTree tree verify only where the graph reads the tree mask.

    A TARGET_VERIFY graph captured with DFLASH's mask-less dummy input would attend causally: a
    tree replayed through it would emit wrong tokens without any error. So a batch carrying the
    DDTree tree-verify input gets the runner's own decision only from a decode runner marked by
    ``after_get_spec_info``; the prefill runner and unmarked runners answer False (eager verify).
    Other batches (the DFlash draft forward, prefill, every other server) get the runner's decision.
    """
    spec_info = getattr(forward_batch, "spec_info", None)
    if spec_info is not None and getattr(spec_info, TREE_VERIFY_MARKER, False):
        if not getattr(self, TREE_MASK_CAPTURED, False):
            return False
    return original(self, forward_batch, *args, **kwargs)


def cuda_build() -> bool:
    """Whether this torch is built for CUDA (no driver call: safe before SGLang forks its processes).

    Without CUDA there are no graphs to capture, and SGLang's graph runner package does not import
    (a CPU stack such as the lab's): registering a hook on it there would print a traceback at every
    start, which the health gate rightly reads as a crash.
    """
    try:
        import torch
    except ImportError:
        return False
    return getattr(torch.version, "cuda", None) is not None


def register_startup_hooks() -> None:
    """Hooks needed in every process, from the first flag parse on (and ``algorithm.register_worker_selection``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .flags import after_add_cli_args, around_from_cli_args

    HookRegistry.register(TARGET_ADD_CLI_ARGS, after_add_cli_args, HookType.AFTER)
    HookRegistry.register(TARGET_FROM_CLI_ARGS, around_from_cli_args, HookType.AROUND)
    if cuda_build():
        HookRegistry.register(TARGET_GRAPH_SPEC_INFO, after_get_spec_info, HookType.AFTER)
        HookRegistry.register(TARGET_CONV_WINDOW_DEDUP, around_conv_window_dedup, HookType.AROUND)


_graph_guard_installed = False


def install_graph_guard() -> None:
    """Register and apply the CUDA-graph guard (called by the worker, in the scheduler process)."""
    global _graph_guard_installed
    if _graph_guard_installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in GRAPH_GUARD_TARGETS:
        HookRegistry.register(target, around_can_run_graph, HookType.AROUND)
    HookRegistry.apply_hooks()
    missing = [t for t in GRAPH_GUARD_TARGETS if t not in HookRegistry._patched]
    if missing:
        raise RuntimeError(
            f"DDTREE could not install its CUDA-graph guard on {missing}; refusing to run a tree "
            "verify that a captured graph could replay causally"
        )
    _graph_guard_installed = True


def hooks_applied() -> dict[str, bool]:
    """Which of the adapter's hook targets HookRegistry has patched (for diagnostics)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    targets = [
        TARGET_ADD_CLI_ARGS,
        TARGET_FROM_CLI_ARGS,
        TARGET_CREATE_WORKER,
        TARGET_GRAPH_SPEC_INFO,
        TARGET_CONV_WINDOW_DEDUP,
        *GRAPH_GUARD_TARGETS,
    ]
    return {t: t in HookRegistry._patched for t in targets}
