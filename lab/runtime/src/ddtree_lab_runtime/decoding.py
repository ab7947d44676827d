"""Decoding in the lab: plain, and speculative with the overlay's core (DDTREE trees, DFLASH/EAGLE chains).

One request at a time (the scheduler thread calls ``Decoder.generate``). Every speculative step:

1. **draft**: ``L`` logit rows from a lab drafter (``DFlashDrafter``: one pass, row ``i`` = the
   target's distribution after its own greedy continuation of ``i`` tokens plus seeded Gaussian
   noise growing with depth -- DFlash's independent per-position distributions; ``EagleDrafter``:
   rows along the drafter's own top-1 chain, as EAGLE/NEXTN draft step by step);
2. **tree**: ``core.draft_topk`` then ``kernels.build_tree`` (the dispatcher: the Triton kernel on
   CUDA, ``core.build_tree_batched`` on CPU) or, without the kernels package, ``core.build_tree_batched``
   -- DDTREE: budget/top-k from the adapter's resolved settings; DFLASH: the chain, budget ``L`` and
   top-k 1; EAGLE: ``speculative_num_draft_tokens - 1`` nodes, top-k ``speculative_eagle_topk``;
3. **verify**: the target scores every tree slot with what ``core.ancestor_mask`` lets that slot
   see (the prefix plus its ancestors; the slot's parent is its nearest masked ancestor) at the
   position ``core.verify_positions`` gives (checked against the mask);
4. **accept**: ``core.greedy_walk`` (T = 0) or ``core.sampled_walk`` (T > 0, on the same processed
   target logits as plain sampling): the accepted path plus the bonus token are committed.

Greedy output is the target's plain greedy output token for token (the model's logits are exact,
see ``model.py``). Statistics follow SGLang: ``spec_verify_ct`` steps per request, accept length =
tokens committed per verify step (accepted drafts + bonus), accept rate = accepted drafts /
(steps x (speculative_num_draft_tokens - 1)).

The incident mode ``no_hidden_capture`` (a DFlash-draft plugin algorithm that is not
DFlash-family): the target's hidden states are never captured, so the drafter is fed zeros, and
the worker's logits, read from the same uncaptured buffer, are all zero: argmax id 0, ``"!"``.
(A simplification: the lab applies it from the first token on.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .model import Context, LabDraftConfig, LabLM, mix_seed
from .tokenizer import VOCAB_SIZE


def _overlay_core():
    """The overlay's core, or None where it is not importable: a service whose algorithm is not DDTREE
    runs without the overlay (docs/services.md, "Which release a service runs"), and there the lab
    stands in for SGLang's own chain verification (``Decoder._chain_step``)."""
    try:
        import sglang_overlay.core as core  # noqa: PLC0415

        return core
    except ImportError:
        return None


def sample_tokens(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One sample per row of ``logits [B, n, V]`` from ``softmax(logits / T)``, as the overlay core's
    ``sample_target_tokens`` draws it (same dtype, same one ``multinomial`` call: the same tokens for the
    same generator; ``test_chain_without_the_overlay_decodes_as_the_core`` holds the two together)."""
    batch, n, vocab = logits.shape
    probs = torch.softmax(logits.to(torch.float32) / temperature, dim=-1)
    return torch.multinomial(probs.reshape(batch * n, vocab), 1, generator=generator).reshape(batch, n)


def _tree_builder():
    """``kernels.build_tree`` (dispatch by device) when the kernels package is there, else the core's builder."""
    try:
        from sglang_overlay.kernels import build_tree  # noqa: PLC0415

        return build_tree, "sglang_overlay.kernels.build_tree"
    except Exception:  # kernels not shipped / triton missing
        from sglang_overlay.core import build_tree_batched  # noqa: PLC0415

        return build_tree_batched, "sglang_overlay.core.build_tree_batched"


# ---- plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodePlan:
    """What the resolved server arguments ask the scheduler to run."""

    mode: str  # "none" | "ddtree" | "dflash" | "eagle" | "no_hidden_capture"
    algorithm: Optional[str] = None  # as resolved (what /server_info says), e.g. "DFLASH" for DDTREE
    requested: Optional[str] = None  # as given on the command line
    draft_len: int = 0  # L: drafter rows per step
    budget: int = 0  # tree nodes besides the root
    top_k: int = 1
    num_draft_tokens: int = 0  # SGLang's speculative_num_draft_tokens (verify window)
    draft_path: Optional[str] = None
    hidden_capture: bool = True
    note: str = ""

    @property
    def speculative(self) -> bool:
        return self.mode != "none"

    def to_dict(self) -> dict:
        return {
            "decoder": self.mode,
            "algorithm": self.algorithm,
            "requested_algorithm": self.requested,
            "draft_len": self.draft_len,
            "budget": self.budget,
            "top_k": self.top_k,
            "num_draft_tokens": self.num_draft_tokens,
            "draft_model_path": self.draft_path,
            "target_hidden_state_capture": self.hidden_capture,
            "note": self.note,
        }


# ---- drafters -----------------------------------------------------------------------------------


def _noise(rng: np.random.Generator, config: LabDraftConfig, num_positions: int) -> np.ndarray:
    """Gaussian noise, std ``noise + depth * noise_growth`` times a per-step log-normal factor
    (some contexts are easy for a drafter, some hard)."""
    scale = config.sigmas(num_positions)[:, None] * float(np.exp(0.5 * rng.standard_normal()))
    return rng.standard_normal((num_positions, VOCAB_SIZE)) * scale


class DFlashDrafter:
    """DFlash-like: ``L`` independent per-position rows in one pass, derived from the target.

    Row ``i`` = target logits after the context and the target's own greedy continuation
    ``g_1..g_i`` (what the captured target hidden states let a good drafter know), plus Gaussian
    noise (``_noise``) from a seed of (drafter, context). Without hidden-state
    capture the target part is zeros.
    """

    def __init__(self, target: LabLM, config: LabDraftConfig):
        self.target = target
        self.config = config

    def rows(self, ctx: Context, num_positions: int, captured: bool = True) -> torch.Tensor:
        base = np.zeros((num_positions, VOCAB_SIZE), dtype=np.float64)
        if captured:
            c = ctx
            for i in range(num_positions):
                row = self.target.logits(c)
                base[i] = row
                c = self.target.push(c, int(np.argmax(row)))
        rng = np.random.default_rng(mix_seed(self.config.seed, "dflash", ctx.key()))
        noise = _noise(rng, self.config, num_positions)
        return torch.from_numpy(base + noise).to(torch.float32)


class EagleDrafter:
    """EAGLE/NEXTN-like: rows along the drafter's own top-1 chain (it drafts autoregressively)."""

    def __init__(self, target: LabLM, config: LabDraftConfig):
        self.target = target
        self.config = config

    def rows(self, ctx: Context, num_positions: int, captured: bool = True) -> torch.Tensor:
        rng = np.random.default_rng(mix_seed(self.config.seed, "eagle", ctx.key()))
        noise = _noise(rng, self.config, num_positions)
        rows = np.zeros((num_positions, VOCAB_SIZE), dtype=np.float64)
        c = ctx
        for j in range(num_positions):
            row = (self.target.logits(c) if captured else 0.0) + noise[j]
            rows[j] = row
            c = self.target.push(c, int(np.argmax(row)))
        return torch.from_numpy(rows).to(torch.float32)


# ---- sampling parameters -----------------------------------------------------------------------


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: list = field(default_factory=list)
    stop_token_ids: list = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """top-k / top-p / min-p as -inf masks on ``logits [..., V]`` (temperature is applied by the sampler)."""
    out = logits.clone()
    scaled = out.to(torch.float64) / params.temperature
    if params.top_k is not None and params.top_k > 0:
        k = min(int(params.top_k), out.shape[-1])
        kth = torch.topk(scaled, k, dim=-1).values[..., -1:]
        out = out.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled.masked_fill(torch.isinf(out), float("-inf")), dim=-1)
    if params.top_p is not None and params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = before > params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    if params.min_p and params.min_p > 0:
        top = probs.max(dim=-1, keepdim=True).values
        out = out.masked_fill(probs < params.min_p * top, float("-inf"))
    return out


# ---- statistics ---------------------------------------------------------------------------------


@dataclass
class RequestStats:
    completion_tokens: int = 0
    spec_verify_ct: int = 0
    spec_num_correct_drafts: int = 0
    spec_num_accept_tokens: int = 0  # committed tokens in verify steps (accepted drafts + bonus)
    # One entry per decode batch (every step after the prefill's first token), in order: (committed
    # tokens, accepted drafts) of a verify step, or None for a plain one-token decode step.
    decode_steps: list = field(default_factory=list)
    finish_reason: Optional[dict] = None
    decode_seconds: float = 0.0
    first_token_seconds: float = 0.0


# ---- the decoder ---------------------------------------------------------------------------------


class Decoder:
    """Generates for one request with the plan's decoder. ``emit(tokens) -> bool`` (False: stop)."""

    def __init__(
        self,
        target: LabLM,
        plan: DecodePlan,
        draft: Optional[LabDraftConfig] = None,
        degenerate_token: Optional[int] = None,
        per_token_delay: float = 0.0,
        accept_collapse: bool = False,
    ):
        self.target = target
        self.plan = plan
        # The fault accept_collapse: DDTREE's draft rows shifted by one token id, so its tree holds tokens the
        # target does not pick; verification keeps the output, only acceptance falls.
        self.accept_collapse = accept_collapse and plan.mode == "ddtree"
        self.degenerate_token = degenerate_token
        self.per_token_delay = per_token_delay
        self.core = _overlay_core()
        if self.core is not None:
            self.builder, self.builder_name = _tree_builder()
        elif plan.speculative and (plan.mode in ("ddtree", "no_hidden_capture") or plan.top_k != 1):
            raise RuntimeError(
                f"the lab decodes {plan.mode} with top-k {plan.top_k} only with the overlay's core importable"
            )
        else:
            self.builder, self.builder_name = None, "lab chain (no overlay)"
        self.drafter = None
        if plan.speculative:
            draft = draft or LabDraftConfig.from_path(plan.draft_path or "lab-draft")
            self.drafter = EagleDrafter(target, draft) if plan.mode == "eagle" else DFlashDrafter(target, draft)

    # -- the target, as the worker sees it --

    def target_logits(self, ctx: Context) -> np.ndarray:
        if self.plan.mode == "no_hidden_capture":
            return np.zeros(VOCAB_SIZE, dtype=np.float64)
        logits = self.target.logits(ctx)
        if self.degenerate_token is not None:
            logits = np.full(VOCAB_SIZE, -50.0)
            logits[self.degenerate_token] = 0.0
        return logits

    def _pick(self, logits: np.ndarray, params: SamplingParams, generator: torch.Generator) -> int:
        if params.greedy:
            return int(np.argmax(logits))
        processed = process_logits(torch.from_numpy(logits)[None, None], params)
        sample = self.core.sample_target_tokens if self.core is not None else sample_tokens
        return int(sample(processed, params.temperature, generator)[0, 0])

    def _chain_step(
        self, ctx: Context, root: int, params: SamplingParams, generator: torch.Generator
    ) -> tuple[list[int], int]:
        """A top-1 chain without the overlay: SGLang's own EAGLE/DFLASH verify, as the lab models it.
        The same tokens and random draws as the core's tree of top-k 1 (its slots: root + budget)."""
        plan = self.plan
        rows = self.drafter.rows(ctx, plan.draft_len, captured=plan.hidden_capture)
        depth = min(plan.budget, plan.draft_len)
        drafts = [int(token) for token in torch.argmax(rows[:depth].to(torch.float32), dim=-1)]
        contexts = [ctx]
        for token in drafts:
            contexts.append(self.target.push(contexts[-1], token))
        contexts += [ctx] * (plan.budget - depth)  # padding slots, as the tree has them
        logits = torch.from_numpy(np.stack([self.target_logits(c) for c in contexts]))[None]
        if params.greedy:
            targets = logits.argmax(dim=-1)[0].tolist()
        else:
            targets = sample_tokens(process_logits(logits, params), params.temperature, generator)[0].tolist()
        accepted = 0
        while accepted < depth and targets[accepted] == drafts[accepted]:
            accepted += 1
        return drafts[:accepted] + [targets[accepted]], accepted

    # -- one speculative step --

    def spec_step(
        self, ctx: Context, root: int, params: SamplingParams, generator: torch.Generator
    ) -> tuple[list[int], int]:
        """Draft, build, verify, walk. Returns (committed tokens: accepted + bonus, accepted drafts)."""
        if self.core is None:
            return self._chain_step(ctx, root, params, generator)
        draft_topk, ancestor_mask, verify_positions = (
            self.core.draft_topk,
            self.core.ancestor_mask,
            self.core.verify_positions,
        )
        greedy_walk, sampled_walk = self.core.greedy_walk, self.core.sampled_walk
        plan = self.plan
        rows = self.drafter.rows(ctx, plan.draft_len, captured=plan.hidden_capture)
        if self.accept_collapse:
            rows = torch.roll(rows, shifts=1, dims=-1)
        k = max(1, min(plan.top_k, plan.budget))
        temperature = None if params.greedy else params.temperature
        log_probs, token_ids = draft_topk(rows[None], k, temperature=temperature)
        tree = self.builder(log_probs, token_ids, plan.budget, top_k_cap=k, root_tokens=torch.tensor([root]))

        n = tree.num_slots
        num_nodes = int(tree.num_nodes[0])
        tokens = tree.tokens[0].tolist()
        mask = ancestor_mask(tree)[0].numpy()
        start = ctx.length - 1  # the root's position
        positions = verify_positions(tree, start)[0].tolist()
        contexts = [ctx]
        for i in range(1, n):
            if i > num_nodes:  # padding: attends to itself only; never walked
                contexts.append(ctx)
                continue
            ancestors = np.flatnonzero(mask[i, :i])  # slot 0 (root) and the ancestors, in depth order
            if ancestors.size == 0 or ancestors[0] != 0 or positions[i] != start + int(ancestors.size):
                raise RuntimeError(
                    f"tree verify inputs disagree at slot {i}: ancestors {ancestors.tolist()}, "
                    f"position {positions[i]}, root position {start}"
                )
            contexts.append(self.target.push(contexts[int(ancestors[-1])], tokens[i]))
        logits = torch.from_numpy(np.stack([self.target_logits(c) for c in contexts]))[None]  # [1, n, V]
        if params.greedy:
            walk = greedy_walk(tree, logits)
        else:
            walk = sampled_walk(tree, process_logits(logits, params), params.temperature, generator)
        accepted = int(walk.accept_len[0])
        committed = walk.emitted_tokens[0, : accepted + 1].tolist()
        return committed, accepted

    # -- a request --

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        emit: Callable[[list[int]], bool],
        stop_ids: frozenset = frozenset(),
    ) -> RequestStats:
        stats = RequestStats()
        t0 = time.perf_counter()
        generator = torch.Generator()
        generator.manual_seed(params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,))))
        ctx = self.target.context(prompt_ids)
        stops = set() if params.ignore_eos else set(stop_ids)
        stops.update(int(t) for t in params.stop_token_ids or [])
        produced = 0
        last = None
        while produced < params.max_new_tokens:
            if produced == 0 or not self.plan.speculative:
                chunk = [self._pick(self.target_logits(ctx), params, generator)]
                accepted = None
            else:
                chunk, accepted = self.spec_step(ctx, last, params, generator)
            chunk = chunk[: params.max_new_tokens - produced]
            hit_stop = None
            for j, tok in enumerate(chunk):
                if tok in stops:
                    hit_stop = tok
                    chunk = chunk[: j + 1]
                    break
            if accepted is not None:
                stats.spec_verify_ct += 1
                stats.spec_num_correct_drafts += min(accepted, len(chunk))
                stats.spec_num_accept_tokens += len(chunk)
                stats.decode_steps.append((len(chunk), min(accepted, len(chunk))))
            elif produced > 0:
                stats.decode_steps.append(None)
            for tok in chunk:
                ctx = self.target.push(ctx, tok)
            produced += len(chunk)
            last = chunk[-1]
            if self.per_token_delay:
                time.sleep(self.per_token_delay * len(chunk))
            if produced == len(chunk):
                stats.first_token_seconds = time.perf_counter() - t0
            keep_going = emit(chunk)
            if hit_stop is not None:
                stats.finish_reason = {"type": "stop", "matched": hit_stop}
                break
            if not keep_going:
                break
        stats.completion_tokens = produced
        stats.decode_seconds = time.perf_counter() - t0
        if stats.finish_reason is None and produced >= params.max_new_tokens:
            stats.finish_reason = {"type": "length", "length": params.max_new_tokens}
        return stats
