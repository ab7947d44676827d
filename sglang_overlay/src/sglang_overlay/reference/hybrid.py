"""A tiny hybrid target (causal attention + recurrent layers) and DDTree decoding over it (torch, CPU).

The hybrid-target reference: on a hybrid target a tree verify must give every tree node the recurrent
state computed from its **parent's** state, not from the state its predecessor in the verify window
left. SGLang 0.5.23 does this for EAGLE trees (``topk > 1``): the causal conv and the recurrent
kernels read ``retrieve_parent_token`` and start node ``i`` from the per-step snapshot of its parent
(``intermediate_ssm`` / ``intermediate_conv_window``, one per draft token and linear layer), and the
commit copies the snapshot of the last accepted node into the request's state.

This module is that rule, framework-free:

* ``HybridLM``: layers mixing causal attention (``"attn"``), a gated delta rule (``"gdn"``:
  ``S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T``, q/k L2-normalized, as Qwen3-Next's
  Gated DeltaNet) and a Mamba2-like diagonal SSM (``"mamba2"``: ``h_t = exp(dt_t A) h_{t-1} + dt_t
  x_t B_t^T``); each recurrent layer has a short causal conv in front whose window of past inputs is
  state too, as in SGLang. Float64 by default.
* ``HybridLM.step`` decodes one token; ``tree_verify(state, tokens, parents)`` runs a tree's slots
  in slot (topological) order, each from its parent's snapshot (``input_slot``); ``commit(state,
  verify, path)`` keeps the root and accepted path: attention rows in path order, the recurrent
  state of the path's last node.
* ``generate_hybrid_ddtree`` decodes a batch of requests with the core tree builder and walks;
  ``generate_hybrid_ar`` is plain decoding.

Every token runs through the same per-token code (``_token_forward``) whether stepped or verified,
so a node's logits equal sequential decoding along its root-to-node path bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..core.tree import build_tree_batched, draft_topk
from ..core.walk import greedy_walk, sampled_walk

__all__ = [
    "LAYER_KINDS",
    "HybridLM",
    "HybridState",
    "TreeVerifyOutput",
    "HybridDecodeResult",
    "HybridNoisyDrafter",
    "tree_paths",
    "generate_hybrid_ar",
    "generate_hybrid_ddtree",
]

LAYER_KINDS = ("attn", "gdn", "mamba2")


@dataclass(frozen=True)
class HybridState:
    """One request's committed state after ``length`` tokens.

    ``layers[i]``: for an attention layer ``(K, V)`` ``[length, heads, head_dim]``; for a recurrent
    layer ``(conv, ssm)``: the conv window (the last ``conv_kernel - 1`` conv inputs, oldest first)
    and the SSM state (``[heads, v_dim, k_dim]`` for GDN, as SGLang's ``[HV, V, K]``; ``[heads,
    head_dim, state]`` for Mamba2).
    """

    length: int
    layers: tuple


@dataclass(frozen=True)
class TreeVerifyOutput:
    """The result of ``tree_verify`` for one request's ``n`` slots.

    ``logits[i]`` is the target's next-token logits after slot ``i``; ``layer_out[i][l]`` is what slot
    ``i`` left in layer ``l``: its ``(k, v)`` row (attention) or its recurrent state snapshot (the
    per-node intermediate state SGLang keeps per draft token).
    """

    logits: torch.Tensor
    parents: list[int]
    depths: list[int]
    layer_out: list[list]


def tree_paths(parents: Sequence[int]) -> list[list[int]]:
    """Root-to-node slot paths (``paths[i]`` starts with 0 and ends with ``i``); parents[0] == -1."""
    paths: list[list[int]] = []
    for i, p in enumerate(parents):
        p = int(p)
        if i == 0:
            if p != -1:
                raise ValueError("slot 0 must be the root (parent -1)")
            paths.append([0])
            continue
        if not 0 <= p < i:
            raise ValueError(f"slot {i}: parent {p} must be an earlier slot (topological order)")
        paths.append(paths[p] + [i])
    return paths


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean() + 1e-6)


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class HybridLM:
    """A random-weight hybrid LM over ``vocab_size`` tokens (no training, no downloads)."""

    def __init__(
        self,
        layers: Sequence[str] = ("gdn", "attn", "mamba2", "gdn"),
        vocab_size: int = 24,
        hidden: int = 16,
        heads: int = 2,
        head_dim: int = 4,
        key_heads: int = 1,
        state_size: int = 4,
        conv_kernel: int = 3,
        max_positions: int = 256,
        logit_scale: float = 4.0,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ):
        kinds = tuple(layers)
        bad = [k for k in kinds if k not in LAYER_KINDS]
        if bad:
            raise ValueError(f"unknown layer kinds {bad}; known: {LAYER_KINDS}")
        if heads % key_heads:
            raise ValueError("heads must be a multiple of key_heads")
        self.kinds = kinds
        self.vocab_size, self.hidden, self.heads, self.head_dim = vocab_size, hidden, heads, head_dim
        self.key_heads, self.state_size, self.conv_kernel = key_heads, state_size, conv_kernel
        self.dtype = dtype
        gen = torch.Generator().manual_seed(seed)

        def w(*shape, scale=1.0):
            return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale / shape[0] ** 0.5).to(dtype)

        self.embed = (torch.randn(vocab_size, hidden, generator=gen, dtype=torch.float64)).to(dtype)
        self.pos = (0.3 * torch.randn(max_positions, hidden, generator=gen, dtype=torch.float64)).to(dtype)
        self.lm_head = w(hidden, vocab_size, scale=logit_scale)
        self.params: list[dict] = []
        for kind in kinds:
            p: dict = {"up": w(hidden, 2 * hidden), "down": w(2 * hidden, hidden)}
            if kind == "attn":
                p.update(q=w(hidden, heads * head_dim), k=w(hidden, heads * head_dim), v=w(hidden, heads * head_dim))
                p["o"] = w(heads * head_dim, hidden)
            else:
                if kind == "gdn":
                    conv_dim = 2 * key_heads * head_dim + heads * head_dim  # q, k, v
                    p.update(a=w(hidden, heads), b=w(hidden, heads))
                else:
                    conv_dim = heads * head_dim + 2 * state_size  # x, B, C
                    p.update(dt=w(hidden, heads), d_skip=w(heads, 1, scale=1.0).reshape(heads))
                p["in"] = w(hidden, conv_dim, scale=2.0)
                p["conv"] = w(conv_kernel, conv_dim, scale=1.5)
                p["A_log"] = (0.5 * torch.randn(heads, generator=gen, dtype=torch.float64)).to(dtype)
                p["dt_bias"] = (0.5 * torch.randn(heads, generator=gen, dtype=torch.float64)).to(dtype)
                p["o"] = w(heads * head_dim, hidden)
            self.params.append(p)

    # ---- state -------------------------------------------------------------------------------

    def initial_state(self) -> HybridState:
        layers = []
        for kind, p in zip(self.kinds, self.params):
            if kind == "attn":
                empty = torch.zeros(0, self.heads, self.head_dim, dtype=self.dtype)
                layers.append((empty, empty))
            else:
                conv = torch.zeros(self.conv_kernel - 1, p["in"].shape[1], dtype=self.dtype)
                if kind == "gdn":
                    ssm = torch.zeros(self.heads, self.head_dim, self.head_dim, dtype=self.dtype)
                else:
                    ssm = torch.zeros(self.heads, self.head_dim, self.state_size, dtype=self.dtype)
                layers.append((conv, ssm))
        return HybridState(0, tuple(layers))

    # ---- one token -----------------------------------------------------------------------------

    def _conv(self, p: dict, conv: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.cat([conv, u[None]], dim=0)  # [K, C], oldest first
        out = torch.nn.functional.silu((window * p["conv"]).sum(0))
        return out, window[1:]

    def _gdn(self, p: dict, x: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        conv, S = state
        u, conv = self._conv(p, conv, x @ p["in"])
        hk, hv, d = self.key_heads, self.heads, self.head_dim
        q = _l2(u[: hk * d].reshape(hk, d))
        k = _l2(u[hk * d : 2 * hk * d].reshape(hk, d))
        v = u[2 * hk * d :].reshape(hv, d)
        if hv != hk:  # each key head serves hv // hk value heads
            q, k = q.repeat_interleave(hv // hk, 0), k.repeat_interleave(hv // hk, 0)
        decay = torch.exp(-torch.exp(p["A_log"]) * torch.nn.functional.softplus(x @ p["a"] + p["dt_bias"]))
        beta = torch.sigmoid(x @ p["b"])
        # S_t = a S (I - b k k^T) + b v k^T, S as SGLang's [HV, V, K]
        S = decay[:, None, None] * S
        delta = beta[:, None] * (v - (S @ k[:, :, None])[..., 0])
        S = S + delta[:, :, None] * k[:, None, :]
        o = (S @ q[:, :, None])[..., 0] * d**-0.5
        return o.reshape(-1) @ p["o"], (conv, S)

    def _mamba2(self, p: dict, x: torch.Tensor, state: tuple) -> tuple[torch.Tensor, tuple]:
        conv, h = state
        u, conv = self._conv(p, conv, x @ p["in"])
        hn, d, n = self.heads, self.head_dim, self.state_size
        xs = u[: hn * d].reshape(hn, d)
        B, C = u[hn * d : hn * d + n], u[hn * d + n :]
        dt = torch.nn.functional.softplus(x @ p["dt"] + p["dt_bias"])
        dA = torch.exp(-torch.exp(p["A_log"]) * dt)
        h = dA[:, None, None] * h + dt[:, None, None] * xs[:, :, None] * B[None, None, :]
        y = h @ C + p["d_skip"][:, None] * xs
        return y.reshape(-1) @ p["o"], (conv, h)

    def _attn(self, p: dict, x: torch.Tensor, kv: tuple) -> tuple[torch.Tensor, tuple]:
        K, V = kv  # rows visible before this token, in sequence order
        h, d = self.heads, self.head_dim
        q, k, v = (x @ p["q"]).reshape(h, d), (x @ p["k"]).reshape(h, d), (x @ p["v"]).reshape(h, d)
        keys, values = torch.cat([K, k[None]], 0), torch.cat([V, v[None]], 0)
        att = torch.softmax((keys.transpose(0, 1) @ q[:, :, None])[..., 0] * d**-0.5, dim=-1)  # [h, s]
        o = (att[:, None, :] @ values.transpose(0, 1))[:, 0]
        return o.reshape(-1) @ p["o"], (k, v)

    def _token_forward(self, token: int, position: int, contexts: Sequence) -> tuple[torch.Tensor, list]:
        """One token at ``position`` given, per layer, the visible KV rows or the input recurrent state.

        Returns the logits and, per layer, the token's ``(k, v)`` row or its new recurrent state.
        """
        x = self.embed[int(token)] + self.pos[int(position)]
        outs = []
        for kind, p, ctx in zip(self.kinds, self.params, contexts):
            mixer = {"attn": self._attn, "gdn": self._gdn, "mamba2": self._mamba2}[kind]
            y, out = mixer(p, _rms(x), ctx)
            x = x + y
            x = x + torch.nn.functional.silu(_rms(x) @ p["up"]) @ p["down"]
            outs.append(out)
        return _rms(x) @ self.lm_head, outs

    # ---- decoding API --------------------------------------------------------------------------

    def step(self, state: HybridState, token: int) -> tuple[HybridState, torch.Tensor]:
        """Decode one token after ``state``: the new state and the next-token logits."""
        logits, outs = self._token_forward(token, state.length, state.layers)
        layers = []
        for kind, old, out in zip(self.kinds, state.layers, outs):
            if kind == "attn":
                layers.append((torch.cat([old[0], out[0][None]]), torch.cat([old[1], out[1][None]])))
            else:
                layers.append(out)
        return HybridState(state.length + 1, tuple(layers)), logits

    def prefill(self, tokens: Sequence[int]) -> tuple[HybridState, torch.Tensor]:
        """The state after ``tokens`` and the logits after the last one."""
        if len(tokens) == 0:
            raise ValueError("the prompt must not be empty")
        state, logits = self.initial_state(), None
        for tok in tokens:
            state, logits = self.step(state, int(tok))
        return state, logits

    @staticmethod
    def input_slot(parents: Sequence[int], slot: int) -> int:
        """The slot whose recurrent state slot ``slot`` continues from: its parent (-1: the committed state).

        This is the rule under test; SGLang's kernels get it from ``retrieve_parent_token``.
        """
        return int(parents[slot])

    def tree_verify(self, state: HybridState, tokens: Sequence[int], parents: Sequence[int]) -> TreeVerifyOutput:
        """Verify one request's tree (slot 0 = the root token, slots in topological order).

        Attention: slot ``i`` sees the committed rows and the rows of its ancestors (the tree mask).
        Recurrent layers: slot ``i`` starts from the snapshot ``input_slot(parents, i)`` left (the
        committed state for the root), never from whatever slot ``i - 1`` left.
        """
        paths = tree_paths(parents)
        n = len(tokens)
        logits, layer_out = [], []
        for i in range(n):
            src = self.input_slot(parents, i)
            ancestors = paths[i][:-1]
            contexts = []
            for li, (kind, committed) in enumerate(zip(self.kinds, state.layers)):
                if kind == "attn":
                    ks = [committed[0]] + [layer_out[a][li][0][None] for a in ancestors]
                    vs = [committed[1]] + [layer_out[a][li][1][None] for a in ancestors]
                    contexts.append((torch.cat(ks), torch.cat(vs)))
                else:
                    contexts.append(committed if src < 0 else layer_out[src][li])
            row, outs = self._token_forward(int(tokens[i]), state.length + len(paths[i]) - 1, contexts)
            logits.append(row)
            layer_out.append(outs)
        return TreeVerifyOutput(torch.stack(logits), [int(p) for p in parents], [len(p) - 1 for p in paths], layer_out)

    def commit(self, state: HybridState, verify: TreeVerifyOutput, path: Sequence[int]) -> HybridState:
        """Keep the root and the accepted path (slots, starting with 0): the state after those tokens.

        Attention layers append the path's rows in path order (KV compaction); recurrent layers take
        the snapshot of the path's last node (SGLang: ``intermediate_ssm[last accepted step]``).
        """
        path = [int(s) for s in path]
        if not path or path[0] != 0:
            raise ValueError("a committed path starts at the root (slot 0)")
        for a, b in zip(path, path[1:]):
            if verify.parents[b] != a:
                raise ValueError(f"slot {b} is not a child of slot {a}")
        layers = []
        for li, (kind, old) in enumerate(zip(self.kinds, state.layers)):
            if kind == "attn":
                ks = torch.stack([verify.layer_out[s][li][0] for s in path])
                vs = torch.stack([verify.layer_out[s][li][1] for s in path])
                layers.append((torch.cat([old[0], ks]), torch.cat([old[1], vs])))
            else:
                layers.append(verify.layer_out[path[-1]][li])
        return HybridState(state.length + len(path), tuple(layers))


class HybridNoisyDrafter:
    """The target's greedy continuation logits plus Gaussian noise, deterministic per context.

    With the noise the target's token is often not the draft's top-1, so accepted paths go through
    non-first siblings.
    """

    def __init__(self, target: HybridLM, noise_std: float = 1.0, seed: int = 0):
        self.target, self.noise_std, self.seed = target, noise_std, seed
        self._cache: dict[tuple, tuple] = {}  # context -> (state, logits): contexts only grow

    def _prefill(self, ids: list[int]) -> tuple[HybridState, torch.Tensor]:
        cut = len(ids)
        while cut > 0 and tuple(ids[:cut]) not in self._cache:
            cut -= 1
        state, logits = self._cache[tuple(ids[:cut])] if cut else (self.target.initial_state(), None)
        for j in range(cut, len(ids)):
            state, logits = self.target.step(state, ids[j])
            self._cache[tuple(ids[: j + 1])] = (state, logits)
        return state, logits

    def draft(self, context: torch.Tensor, num_positions: int) -> torch.Tensor:
        ids = [int(t) for t in context.reshape(-1).tolist()]
        state, logits = self._prefill(ids)
        rows = []
        for _ in range(num_positions):
            rows.append(logits)
            state, logits = self.target.step(state, int(logits.argmax()))
        key = (self.seed * 1_000_003 + sum((i + 1) * (t + 7) for i, t in enumerate(ids))) % (1 << 62)
        gen = torch.Generator().manual_seed(key)
        out = torch.stack(rows).to(torch.float32)
        return out + self.noise_std * torch.randn(out.shape, generator=gen, dtype=torch.float32)


@dataclass
class HybridDecodeResult:
    """Generated tokens (prompt excluded), accepted nodes per step, and accepted non-first siblings."""

    tokens: list[int]
    accept_lens: list[int] = field(default_factory=list)
    sibling_accepts: int = 0  # accepted nodes of rank > 0 (a sibling precedes them in the window)
    emitted: int = 0  # tokens emitted before the cut at max_new_tokens / EOS (a request may finish mid-step)


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.to(torch.float32) / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _finish(tokens: list[int], limit: int, eos: int | None) -> list[int]:
    tokens = tokens[:limit]
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens


def generate_hybrid_ar(
    model: HybridLM,
    prompt: Sequence[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> list[int]:
    """Plain autoregressive decoding (argmax at T = 0, sampling at T > 0)."""
    state, logits = model.prefill(prompt)
    tokens: list[int] = []
    while len(tokens) < max_new_tokens:
        tok = _pick(logits, temperature, generator)
        tokens.append(tok)
        if tok == eos_token_id:
            break
        state, logits = model.step(state, tok)
    return tokens


def generate_hybrid_ddtree(
    model: HybridLM,
    drafter,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    budget: int,
    draft_len: int,
    top_k: int | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> list[HybridDecodeResult]:
    """DDTree decoding of a batch of requests over a hybrid target.

    Per step, for the requests still running: the drafter's ``draft_len`` rows -> ``draft_topk`` ->
    ``build_tree_batched`` over the batch (the core builder) -> ``tree_verify`` per request ->
    ``greedy_walk`` (T = 0) or ``sampled_walk`` over the batch -> ``commit`` of the accepted path;
    the bonus is the next root. A request leaves the batch once it has ``max_new_tokens`` tokens or
    emitted ``eos_token_id`` (possibly in the middle of a step's accepted path).
    """
    count = len(prompts)
    limits = [int(max_new_tokens)] * count if isinstance(max_new_tokens, int) else [int(m) for m in max_new_tokens]
    states, roots, results = [], [], []
    for prompt in prompts:
        state, logits = model.prefill(prompt)
        root = _pick(logits, temperature, generator)
        states.append(state)
        roots.append(root)
        results.append(HybridDecodeResult([root]))
    k = min(top_k if top_k is not None else max(budget, 1), model.vocab_size)

    def running(b: int) -> bool:
        toks = results[b].tokens
        return len(toks) < limits[b] and (eos_token_id is None or eos_token_id not in toks)

    while True:
        active = [b for b in range(count) if running(b)]
        if not active:
            break
        drafts = torch.stack(
            [
                drafter.draft(torch.tensor(list(prompts[b]) + results[b].tokens, dtype=torch.int64), draft_len)
                for b in active
            ]
        )
        log_probs, token_ids = draft_topk(drafts, k)
        tree = build_tree_batched(
            log_probs, token_ids, budget, root_tokens=torch.tensor([roots[b] for b in active], dtype=torch.int64)
        )
        n = tree.num_slots
        all_logits = torch.zeros(len(active), n, model.vocab_size, dtype=model.dtype)
        verifies = []
        for row, b in enumerate(active):
            m = int(tree.num_nodes[row]) + 1
            out = model.tree_verify(states[b], tree.tokens[row, :m].tolist(), tree.parents[row, :m].tolist())
            all_logits[row, :m] = out.logits
            verifies.append(out)
        if temperature <= 0:
            walk = greedy_walk(tree, all_logits)
        else:
            walk = sampled_walk(tree, all_logits, temperature, generator)
        for row, b in enumerate(active):
            accept = int(walk.accept_len[row])
            path = walk.path_slots[row, : accept + 1].tolist()
            states[b] = model.commit(states[b], verifies[row], path)
            results[b].accept_lens.append(accept)
            results[b].sibling_accepts += sum(int(tree.ranks[row, s]) > 0 for s in path[1:])
            results[b].tokens.extend(walk.emitted_tokens[row, : accept + 1].tolist())
            roots[b] = int(walk.bonus[row])
    for b in range(count):
        results[b].emitted = len(results[b].tokens)
        results[b].tokens = _finish(results[b].tokens, limits[b], eos_token_id)
    return results
