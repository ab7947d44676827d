"""Flags -> what to run: SGLang's parser and registry, the plugins' resolution hooks, lab stand-ins.

``ServerArgs.resolve_once()`` cannot run in the lab (it imports transformers and torchvision,
which the lab stack does not have). What matters of it for the lab is the speculative part, so this module runs:

1. SGLang's ``run_hook`` for the first pipeline step (``handle_deprecated_dp_attention``) with a
   no-op stand-in: plugins' wrappers of that step run for real (the DDTree adapter's
   ``canonicalize_ddtree`` turns DDTREE into DFLASH + DDTree settings there);
2. ``run_hook`` for ``handle_speculative_decoding`` with ``handle_speculative_decoding`` below, a
   lab stand-in of SGLang's step (upper-case the name, NEXTN -> EAGLE without reading the draft's HF
   config, ``SpeculativeAlgorithm.from_string`` -- an unknown name raises SGLang's ValueError --
   then DFLASH's / the EAGLE family's setup, or a plugin algorithm's ``handle_server_args``):
   plugins' wrappers run around it (the adapter's ``finalize_ddtree``: budget vs window, refusals).

DFLASH's setup here mirrors ``_handle_dflash`` of SGLang 0.5.23 (same checks and messages) except
the device check (the lab has no GPU) and the draft attention backend. The window default comes
from the draft's ``config.json`` (``block_size`` or ``dflash_config.block_size``), else 16.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .decoding import DecodePlan
from .model import LabDraftConfig

logger = logging.getLogger("ddtree_lab_runtime")

SOURCE = "lab_runtime"


def _declare(server_args: Any, **fields: Any) -> None:
    from sglang.srt.arg_groups.overrides import declare_resolution

    declare_resolution(server_args, SOURCE, **fields)


def _view(server_args: Any):
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(server_args)


# ---- stand-ins for the two pipeline steps (the names select the registered hooks) -------------


def handle_deprecated_dp_attention(server_args: Any) -> None:  # noqa: ARG001 - SGLang's step name
    """The first pipeline step; nothing of it matters in the lab (plugins' wrappers still run)."""


def handle_speculative_decoding(server_args: Any) -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    cfg = _view(server_args)
    if cfg.speculative_algorithm is None:
        return
    name = cfg.speculative_algorithm.upper()
    if name == "NEXTN":  # SGLang's _resolve_speculative_algorithm_alias (no Gemma-4 draft in the lab)
        name = "EAGLE"
    _declare(server_args, speculative_algorithm=name)
    if cfg.speculative_draft_model_path is not None and cfg.speculative_draft_model_revision is None:
        _declare(server_args, speculative_draft_model_revision="main")

    algo = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)  # unknown -> ValueError
    if isinstance(algo, CustomSpecAlgo):
        from sglang.srt.arg_groups.overrides import record_foreign_defaults

        if algo.validate_server_args is not None:
            record_foreign_defaults(
                server_args, "handle_speculative_decoding.custom_validate", algo.validate_server_args
            )
        record_foreign_defaults(server_args, "handle_speculative_decoding.custom_algo", algo.handle_server_args)
    elif algo.is_dflash():
        _handle_dflash(server_args)
    elif algo.is_eagle() or algo.is_standalone() or algo.is_frozen_kv_mtp():
        _handle_eagle_family(server_args)
    # NGRAM, UNO, DSPARK: not modelled (plain decoding, see plan_from_args)


def _max_running_48(server_args: Any) -> None:
    if _view(server_args).max_running_requests is None:
        _declare(server_args, max_running_requests=48)
        logger.warning(
            "Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests."
        )


def _handle_dflash(server_args: Any) -> None:
    """SGLang 0.5.23's ``_handle_dflash``, less the device check and the draft attention backend."""
    cfg = _view(server_args)
    if cfg.pp_size != 1:
        raise ValueError("Currently DFLASH speculative decoding only supports pp_size == 1.")
    if cfg.speculative_draft_model_path is None:
        raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    for field_name in ("speculative_num_steps", "speculative_eagle_topk"):
        value = getattr(cfg, field_name)
        if value is not None and int(value) != 1:
            logger.warning("DFLASH only supports %s == 1; overriding %s=%s to 1.", field_name, field_name, value)
        if value is None or int(value) != 1:
            _declare(server_args, **{field_name: 1})
    if cfg.speculative_dflash_block_size is not None:
        if int(cfg.speculative_dflash_block_size) <= 0:
            raise ValueError(
                "DFLASH requires --speculative-dflash-block-size to be positive, "
                f"got {cfg.speculative_dflash_block_size}."
            )
        if cfg.speculative_num_draft_tokens is not None and int(cfg.speculative_num_draft_tokens) != int(
            cfg.speculative_dflash_block_size
        ):
            raise ValueError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                "but they differ. For DFLASH they must match. "
                f"speculative_num_draft_tokens={cfg.speculative_num_draft_tokens}, "
                f"speculative_dflash_block_size={cfg.speculative_dflash_block_size}."
            )
        _declare(server_args, speculative_num_draft_tokens=int(cfg.speculative_dflash_block_size))
    if cfg.speculative_num_draft_tokens is None:
        block = LabDraftConfig.from_path(cfg.speculative_draft_model_path).block_size
        if block is None:
            block = 16
            logger.warning("speculative_num_draft_tokens is not set; defaulting to %d for DFLASH.", block)
        _declare(server_args, speculative_num_draft_tokens=int(block))
    if cfg.speculative_draft_window_size is not None:
        draft_tokens = int(cfg.speculative_num_draft_tokens)
        if cfg.speculative_draft_window_size < draft_tokens:
            raise ValueError(
                "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). "
                f"window_size={cfg.speculative_draft_window_size}, block_size={draft_tokens}."
            )
    _max_running_48(server_args)


def _handle_eagle_family(server_args: Any) -> None:
    """EAGLE/NEXTN defaults as SGLang picks them for an ordinary model: 3 steps, top-k 1, 4 draft tokens."""
    cfg = _view(server_args)
    steps, topk, tokens = cfg.speculative_num_steps, cfg.speculative_eagle_topk, cfg.speculative_num_draft_tokens
    if steps is None and topk is None and tokens is None:
        steps, topk, tokens = 3, 1, 4
    steps = 3 if steps is None else int(steps)
    topk = 1 if topk is None else int(topk)
    if tokens is None or (topk == 1 and int(tokens) != steps + 1):
        if tokens is not None:
            logger.warning(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
            )
        tokens = steps + 1 if topk == 1 else max(steps * topk, 2)
    _declare(
        server_args, speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=int(tokens)
    )
    _max_running_48(server_args)


# ---- the whole resolution ---------------------------------------------------------------------


def resolve_server_args(server_args: Any) -> DecodePlan:
    """Run the speculative part of SGLang's resolution (with plugin hooks) and pick the decoder."""
    from sglang.srt.arg_groups.resolution_hooks import run_hook

    run_hook(handle_deprecated_dp_attention, server_args)
    cfg = _view(server_args)
    if cfg.served_model_name is None:
        _declare(server_args, served_model_name=cfg.model_path)
    run_hook(handle_speculative_decoding, server_args)
    return plan_from_args(server_args)


def plan_from_args(server_args: Any) -> DecodePlan:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    cfg = _view(server_args)
    requested = getattr(server_args, "speculative_algorithm", None)
    name = cfg.speculative_algorithm
    if name is None or name.upper() == "NONE":
        return DecodePlan("none", algorithm=None, requested=requested)
    algo = SpeculativeAlgorithm.from_string(name)
    draft = cfg.speculative_draft_model_path
    common = dict(algorithm=name, requested=requested, draft_path=draft)

    if isinstance(algo, CustomSpecAlgo):
        # A plugin algorithm: a plugin is loaded, so the overlay is importable.
        from sglang_overlay.adapter import settings as dd_settings

        window = int(
            cfg.speculative_num_draft_tokens
            or cfg.speculative_dflash_block_size
            or (LabDraftConfig.from_path(draft).block_size if draft else None)
            or 16
        )
        if draft is not None and not algo.is_dflash_family():
            # The incident: a DFlash-draft algorithm SGLang does not treat as DFlash-family.
            try:
                tree = dd_settings.resolve_for_window(dd_settings.resolve_settings({}, os.environ), window)
                budget, top_k = tree.budget, tree.effective_top_k
            except dd_settings.DDTreeConfigError:
                budget, top_k = window - 1, dd_settings.default_top_k(window - 1)
            return DecodePlan(
                "no_hidden_capture",
                draft_len=window - 1,
                budget=budget,
                top_k=top_k,
                num_draft_tokens=window,
                hidden_capture=False,
                note=f"{algo!r}: is_dflash_family() is False, so target hidden states are not captured",
                **common,
            )
        if draft is not None and algo.is_dflash_family():
            return DecodePlan(
                "dflash",
                draft_len=window - 1,
                budget=window - 1,
                top_k=1,
                num_draft_tokens=window,
                note=f"plugin algorithm {algo!r} decoded as a DFlash chain",
                **common,
            )
        return DecodePlan("none", note=f"plugin algorithm {algo!r} has no lab decoder: plain decoding", **common)

    if algo.is_dflash():
        window = int(cfg.speculative_num_draft_tokens)
        try:
            from sglang_overlay.adapter.resolution import resolved_settings
        except ImportError:  # a service without the overlay: DFLASH is only ever SGLang's own
            tree = None
        else:
            tree = resolved_settings(server_args)
        if tree is not None:
            # The lab serves one request at a time: the schedule's budget for one request.
            single = tree.for_batch(1)
            return DecodePlan(
                "ddtree",
                draft_len=tree.block - 1,
                budget=single.budget,
                top_k=single.effective_top_k,
                num_draft_tokens=single.window,
                note="DDTREE (adapter-resolved) on the DFlash drafter",
                **common,
            )
        return DecodePlan("dflash", draft_len=window - 1, budget=window - 1, top_k=1, num_draft_tokens=window, **common)
    if algo.is_eagle() or algo.is_standalone() or algo.is_frozen_kv_mtp():
        steps, topk, tokens = (
            int(cfg.speculative_num_steps),
            int(cfg.speculative_eagle_topk),
            int(cfg.speculative_num_draft_tokens),
        )
        return DecodePlan(
            "eagle",
            draft_len=steps,
            budget=max(1, min(tokens - 1, steps * topk)),
            top_k=topk,
            num_draft_tokens=tokens,
            **common,
        )
    return DecodePlan("none", note=f"{name} is not modelled by the lab runtime: plain decoding", **common)
