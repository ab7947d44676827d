"""How ``--speculative-algorithm DDTREE`` goes through SGLang's server-argument resolution.

Decision: DDTREE *is* DFLASH for everything but the verify step. So the first resolution step
declares ``speculative_algorithm = "DFLASH"`` (SGLang's own ``declare_resolution``; the raw input
on the record keeps saying DDTREE) and stores the DDTree settings on the record as bookkeeping.
From then on SGLang's own code does all DFLASH setup unchanged, including everything a plain plugin
algorithm lacks (docs/adapter.md lists the gaps):

* ``_handle_dflash`` runs (draft path check, num_steps = topk = 1, block size / draft-token count,
  draft attention backend, max_running_requests 48);
* the ~dozen places that compare the algorithm string with "DFLASH" (kv-cache, attention,
  validation, LoRA, CP/TP sharing, model overrides, metrics, spec_utils, ...) see "DFLASH";
* the scheduler and model runners build ``SpeculativeAlgorithm.DFLASH`` from the resolved config,
  so target hidden-state capture, future maps, ``need_topk`` etc. are DFLASH's.

The one runtime difference, the worker, is chosen by an AROUND hook on
``SpeculativeAlgorithm.create_worker`` (see ``hooks.py``): DFLASH + DDTree settings on the record ->
the DDTree worker. A record without DDTree settings gets SGLang's DFLASH worker, untouched.

Both steps are wrapped through SGLang's ``register_resolution_hook`` (the supported plugin API for
pipeline steps), not by patching the pipeline.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

from . import settings as s
from .flags import CLI_BOOKKEEPING_ATTR, is_ddtree_name

logger = logging.getLogger(__name__)

# Bookkeeping attributes on ServerArgs (leading underscore, not fields: SGLang's record allows
# them at any time and pickles them to child processes with the record).
REQUESTED_ATTR = "_ddtree_requested"  # DDTreeSettings.to_dict(), set when DDTREE is seen
RESOLVED_ATTR = "_ddtree"  # ResolvedDDTree.to_dict(), set once the verify window is known

# The first step of sglang.srt.arg_groups.pipeline.run_resolution_pipeline, and the step that
# runs _handle_dflash. Both are in resolution_hooks._OVERRIDABLE_HOOKS in 0.5.23.
FIRST_STEP = "handle_deprecated_dp_attention"
SPECULATIVE_STEP = "handle_speculative_decoding"


def _declare(server_args: Any, **fields: Any) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution

    declare_resolution(server_args, "ddtree", **fields)


def _view(server_args: Any):
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(server_args)


def requested_settings(server_args: Any) -> Optional[s.DDTreeSettings]:
    data = getattr(server_args, REQUESTED_ATTR, None)
    return None if data is None else s.DDTreeSettings.from_dict(data)


def resolved_settings(server_args: Any) -> Optional[s.ResolvedDDTree]:
    """The DDTree settings a resolved record carries, or None (then it is not a DDTree server)."""
    data = getattr(server_args, RESOLVED_ATTR, None) if server_args is not None else None
    return None if data is None else s.ResolvedDDTree.from_dict(data)


def canonicalize_ddtree(server_args: Any, environ: Optional[dict] = None) -> bool:
    """If the algorithm is DDTREE: validate the DDTree settings and declare DFLASH.

    Returns True when it did so. Raises DDTreeConfigError on a bad flag/variable value or a
    hybrid target (unless allowed).
    """
    cfg = _view(server_args)
    if not is_ddtree_name(cfg.speculative_algorithm):
        return False
    flags = getattr(server_args, CLI_BOOKKEEPING_ATTR, None) or {}
    requested = s.resolve_settings(flags, os.environ if environ is None else environ)
    allowed_reason = s.check_hybrid_target(cfg.model_path, requested)
    if allowed_reason is not None:
        logger.warning(
            "DDTREE on a hybrid target (%s) because %s is set: unsupported and untested.",
            allowed_reason,
            requested.allow_hybrid_unsafe_source,
        )
    setattr(server_args, REQUESTED_ATTR, requested.to_dict())
    _declare(server_args, speculative_algorithm="DFLASH")
    logger.info(
        "DDTREE: resolving as DFLASH (DFlash drafter and setup) with tree verification; "
        "requested budget=%s (%s), top_k=%s (%s).",
        s.format_budget(requested.budget),
        requested.budget_source,
        "auto" if requested.top_k is None else requested.top_k,
        requested.top_k_source,
    )
    return True


def _refusals(cfg: Any) -> list[str]:
    """Options DDTREE does not support in this version (each a sentence naming the option)."""
    from sglang.srt.runtime_context import attn_dp_enabled_of

    out = []
    if cfg.speculative_use_rejection_sampling:
        out.append("--speculative-use-rejection-sampling (needs draft distributions per node)")
    if cfg.speculative_use_block_verification:
        out.append("--speculative-use-block-verification")
    if cfg.speculative_adaptive:
        out.append("--speculative-adaptive")
    if cfg.speculative_draft_window_size is not None:
        out.append("--speculative-draft-window-size (compact draft KV cache)")
    if attn_dp_enabled_of(cfg):
        out.append("DP attention (--attn-dp-size > 1)")
    if str(cfg.disaggregation_mode) != "null":
        out.append(f"--disaggregation-mode {cfg.disaggregation_mode}")
    return out


def finalize_ddtree(server_args: Any) -> Optional[s.ResolvedDDTree]:
    """After DFLASH's setup ran: fix the budget against the verify window and check options."""
    requested = requested_settings(server_args)
    if requested is None:
        return None
    cfg = _view(server_args)
    if cfg.speculative_algorithm != "DFLASH":
        # e.g. --enable-return-aux-hidden-states turned speculative decoding off.
        logger.info("DDTREE: speculative decoding resolved to %r; DDTree is off.", cfg.speculative_algorithm)
        setattr(server_args, REQUESTED_ATTR, None)
        return None
    refused = _refusals(cfg)
    if refused:
        raise s.DDTreeConfigError("--speculative-algorithm DDTREE does not support: " + "; ".join(refused))
    resolved = s.resolve_for_window(requested, cfg.speculative_num_draft_tokens)
    _check_memory(cfg, resolved, requested.budget_source)
    _check_tree_state_memory(cfg, resolved, requested.budget_source)
    if resolved.window != resolved.block:
        # SGLang sizes everything target-side from speculative_num_draft_tokens: the KV reserved
        # per decode step, the target's verify graphs and their buffers, the logits rows. The
        # drafter keeps its block: the worker builds DFlash's draft side with it (worker.py).
        _declare(server_args, speculative_num_draft_tokens=resolved.window)
    setattr(server_args, RESOLVED_ATTR, resolved.to_dict())
    logger.info(
        "DDTREE: budget=%s, top_k=%d (effective %d), drafter block=%d, verify window=%d tokens per "
        "request%s; the tree verify replays the target's CUDA graphs, captured with the tree mask.",
        s.format_budget(resolved.schedule or resolved.budget),
        resolved.top_k,
        resolved.effective_top_k,
        resolved.block,
        resolved.window,
        " (per batch size: %s)"
        % s.format_budget([(bs, res.window) for bs, res in ((b, resolved.for_batch(b)) for b, _ in resolved.schedule)])
        if resolved.schedule
        else "",
    )
    return resolved


def _model_config(cfg: Any) -> dict:
    return s.read_local_hf_config(getattr(cfg, "model_path", None)) or {}


def _check_memory(cfg: Any, resolved: s.ResolvedDDTree, source: str) -> None:
    """Refuse windows whose verify buffers would not fit beside the KV pool (before any process starts).

    Needs the GPU's memory (SGLang's own query) and a local model config for the context and the
    vocabulary; without them nothing is refused here.
    """
    if resolved.window <= resolved.block:
        return
    gpu_mib = _gpu_mib(cfg)
    model = _model_config(cfg)
    context_len = getattr(cfg, "context_length", None) or model.get("max_position_embeddings")
    vocab = model.get("vocab_size")
    fraction = getattr(cfg, "mem_fraction_static", None)
    if not gpu_mib or not context_len or not vocab or fraction is None:
        return
    limit = int(gpu_mib * (1 << 20) * (1.0 - float(fraction)) / 2)
    max_bs = int(getattr(cfg, "max_running_requests", None) or 48)
    s.check_verify_memory(resolved, source, max_bs, int(context_len), int(vocab), limit)


def _check_tree_state_memory(cfg: Any, resolved: s.ResolvedDDTree, source: str) -> None:
    """On a hybrid target, the per-node recurrent state snapshots of the widest window (before any process
    starts): refused when not even one request's fit in ``hybrid.TREE_STATE_SHARE`` of SGLang's static
    memory; else logged, with how many requests' snapshots fit there at this window and at the drafter's
    block (SGLang sizes the mamba pool to what fits, so a wider window serves fewer requests at once).

    Needs the GPU's memory and a local ``config.json`` of a GDN or Mamba2 target; without them nothing
    is checked here.
    """
    from .hybrid import TREE_STATE_SHARE, check_tree_state_memory, state_shapes_of

    model = _model_config(cfg)
    shapes = state_shapes_of(model, int(getattr(cfg, "tp_size", None) or 1)) if model else None
    fraction = getattr(cfg, "mem_fraction_static", None)
    gpu_mib = _gpu_mib(cfg) if shapes is not None and fraction is not None else None
    if not gpu_mib:
        return
    limit = int(gpu_mib * (1 << 20) * float(fraction) * TREE_STATE_SHARE)
    need = check_tree_state_memory(shapes, resolved, source, 1, limit)
    per_block = need.bytes_per_request * min(resolved.block, need.window) // need.window
    logger.info(
        "DDTREE hybrid target: %.1f MiB of recurrent state snapshots per request at the %d-token window; "
        "%.1f GiB (%.0f%% of the static pool) holds about %d requests' (%d at the drafter's block).",
        need.bytes_per_request / (1 << 20),
        need.window,
        limit / (1 << 30),
        100 * TREE_STATE_SHARE,
        limit // need.bytes_per_request - 1,
        limit // per_block - 1,
    )


def _gpu_mib(cfg: Any) -> Optional[float]:
    """The GPU's memory in MiB (SGLang's own query), or None where it cannot be asked."""
    try:
        from sglang.srt.utils.common import get_device_memory_capacity

        return get_device_memory_capacity(getattr(cfg, "device", None))
    except Exception:  # noqa: BLE001 (no GPU query: SGLang's start-up reports memory itself)
        return None


# ---- resolution-hook wrappers (fn(server_args, previous)) --------------------------------------


def first_step_hook(server_args: Any, previous: Callable[[Any], None]) -> None:
    canonicalize_ddtree(server_args)
    previous(server_args)


def speculative_step_hook(server_args: Any, previous: Callable[[Any], None]) -> None:
    # A pipeline whose first step was replaced by another plugin without calling `previous`
    # still gets DDTREE canonicalized here, before DFLASH's setup runs.
    canonicalize_ddtree(server_args)
    previous(server_args)
    finalize_ddtree(server_args)


def register_resolution_hooks() -> None:
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook(FIRST_STEP)(first_step_hook)
    register_resolution_hook(SPECULATIVE_STEP)(speculative_step_hook)
