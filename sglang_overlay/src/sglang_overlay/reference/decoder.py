"""Reference DDTree decoder for Hugging Face causal LMs (one sequence, CPU or GPU, no sglang).

Per step:
  1. the drafter gives ``L`` per-position logit rows after the context (which ends with the root);
  2. ``draft_topk`` + ``build_tree_batched`` make the tree (slot 0 = the root);
  3. one target forward over the tree's slots with ``position_ids = start + depth`` and a 4-D
     additive mask: the cached prefix fully visible, inside the tree ancestors only;
  4. ``greedy_walk`` (T = 0) or ``sampled_walk`` (T > 0) picks the accepted path and the bonus;
  5. the KV cache keeps the prefix plus the root and accepted rows (``compaction_plan``); the
     bonus becomes the next root.

``generate_ar`` is plain autoregressive decoding with the same model, for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..core.tree import DDTreeBatch, build_tree_batched, draft_topk
from ..core.verify import ancestor_mask
from ..core.walk import WalkResult, compaction_plan, greedy_walk, sampled_walk
from .toy import Drafter

__all__ = ["DecodeResult", "WalkFn", "generate_ar", "generate_ddtree", "tree_attention_mask_4d", "compact_kv_cache"]

# (tree, target_logits [1, n, V], temperature, generator) -> WalkResult
WalkFn = Callable[[DDTreeBatch, torch.Tensor, float, "torch.Generator | None"], WalkResult]


@dataclass
class DecodeResult:
    """Generated tokens (prompt excluded) and, for DDTree, the accepted drafted nodes per step."""

    tokens: list[int]
    accept_lens: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.accept_lens)


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.to(torch.float32) / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _new_cache():
    from transformers import DynamicCache

    return DynamicCache()


def _as_ids(input_ids: torch.Tensor | list[int], device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.int64, device=device).reshape(1, -1)
    if ids.shape[1] == 0:
        raise ValueError("the prompt must not be empty")
    return ids


def _finish(tokens: list[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
    tokens = tokens[:max_new_tokens]
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    return tokens


@torch.no_grad()
def generate_ar(
    model,
    input_ids: torch.Tensor | list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> DecodeResult:
    """Plain autoregressive decoding with a KV cache (argmax at T = 0, sampling at T > 0)."""
    device = next(model.parameters()).device
    ids = _as_ids(input_ids, device)
    cache = _new_cache()
    out = model(
        input_ids=ids,
        position_ids=torch.arange(ids.shape[1], device=device)[None],
        past_key_values=cache,
        use_cache=True,
    )
    tokens: list[int] = []
    pos = ids.shape[1]
    while len(tokens) < max_new_tokens:
        tok = _pick(out.logits[0, -1], temperature, generator)
        tokens.append(tok)
        if tok == eos_token_id or len(tokens) == max_new_tokens:
            break
        out = model(
            input_ids=torch.tensor([[tok]], device=device),
            position_ids=torch.tensor([[pos]], device=device),
            past_key_values=cache,
            use_cache=True,
        )
        pos += 1
    return DecodeResult(_finish(tokens, max_new_tokens, eos_token_id))


def tree_attention_mask_4d(tree: DDTreeBatch, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, n, prefix_len + n]`` additive mask: 0 where visible, ``finfo(dtype).min`` elsewhere."""
    anc = ancestor_mask(tree)
    visible = torch.cat(
        [torch.ones((tree.batch_size, tree.num_slots, prefix_len), dtype=torch.bool, device=tree.device), anc],
        dim=2,
    )
    mask = torch.zeros(visible.shape, dtype=dtype, device=tree.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


def compact_kv_cache(cache, src_rows: torch.Tensor, dst_start: int) -> None:
    """Keep cache rows ``[0, dst_start)`` plus rows ``src_rows`` (in that order), drop the rest.

    Works on transformers' ``DynamicCache`` with full-attention layers (``layer.keys`` /
    ``layer.values`` shaped ``[B, H, S, D]``).
    """
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise NotImplementedError("DDTree KV compaction does not support sliding-window layers")
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        idx = src_rows.to(layer.keys.device)
        layer.keys = torch.cat([layer.keys[..., :dst_start, :], layer.keys.index_select(-2, idx)], dim=-2)
        layer.values = torch.cat([layer.values[..., :dst_start, :], layer.values.index_select(-2, idx)], dim=-2)


def _default_walk(
    tree: DDTreeBatch, logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> WalkResult:
    if temperature <= 0:
        return greedy_walk(tree, logits)
    return sampled_walk(tree, logits, temperature, generator)


@torch.no_grad()
def generate_ddtree(
    target,
    drafter: Drafter,
    input_ids: torch.Tensor | list[int],
    max_new_tokens: int,
    budget: int,
    draft_len: int,
    top_k: int | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
    draft_temperature: float | None = None,
    walk: WalkFn | None = None,
) -> DecodeResult:
    """DDTree speculative decoding of one sequence with a Hugging Face causal LM.

    Args:
        target: the Hugging Face causal LM whose output distribution is kept.
        drafter: gives ``draft_len`` per-position logit rows per step (``Drafter``).
        input_ids: the prompt.
        max_new_tokens: tokens to generate (prompt excluded).
        budget: drafted nodes per tree.
        draft_len: ``L``, the drafter's positions per step (DFlash: block_size - 1).
        top_k: top-k kept per draft position; default ``min(budget, V)`` (as the reference code).
        temperature: the target's sampling temperature; 0 is greedy.
        generator: the random source for T > 0 (the first token and every walk).
        eos_token_id: stop after this token.
        draft_temperature: temperature applied to the draft logits before ``log_softmax``.
        walk: replaces the verification walk (tests use it to plant a broken rule).
    """
    walk = walk or _default_walk
    device = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    ids = _as_ids(input_ids, device)
    cache = _new_cache()
    prompt_len = ids.shape[1]
    out = target(
        input_ids=ids, position_ids=torch.arange(prompt_len, device=device)[None], past_key_values=cache, use_cache=True
    )
    root = _pick(out.logits[0, -1], temperature, generator)
    tokens = [root]
    accept_lens: list[int] = []
    past = prompt_len  # cached rows; the root sits at position `past`
    k = min(top_k if top_k is not None else max(budget, 1), int(out.logits.shape[-1]))

    while len(tokens) < max_new_tokens and root != eos_token_id:
        context = torch.cat([ids[0], torch.tensor(tokens, dtype=torch.int64, device=device)])
        draft_logits = drafter.draft(context, draft_len).to(device)
        log_probs, token_ids = draft_topk(draft_logits[None], k, temperature=draft_temperature)
        tree = build_tree_batched(log_probs, token_ids, budget, root_tokens=torch.tensor([root], device=device))
        tree = tree.truncate(int(tree.num_nodes[0]) + 1)

        positions = past + tree.depths.to(torch.int64)
        mask = tree_attention_mask_4d(tree, past, dtype)
        out = target(
            input_ids=tree.tokens, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True
        )
        result = walk(tree, out.logits, temperature, generator)

        plan = compaction_plan(result, base=past)
        num_keep = int(plan.num_keep[0])
        compact_kv_cache(cache, plan.src[0, :num_keep], past)
        past += num_keep

        accept_lens.append(int(result.accept_len[0]))
        tokens.extend(result.emitted_tokens[0, :num_keep].tolist())
        root = int(result.bonus[0])
        if eos_token_id is not None and eos_token_id in tokens:
            break
    return DecodeResult(_finish(tokens, max_new_tokens, eos_token_id), accept_lens)
