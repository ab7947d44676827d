"""The worker's decode step (``tree_step.run_tree_step``) end to end with toy models on CPU.

The ports stand in for SGLang's GPU machinery the way the worker implements them:
* the "target" computes each verify row's logits only from what that row may see: the committed
  tokens plus the tree tokens its custom-mask row admits, ordered by the row's positions (so a
  wrong mask, position or link changes the output);
* acceptance is SGLang 0.5.23's own ``verify_tree_greedy`` Triton kernel (what ``eagle_sample``
  runs at temperature 0);
* the commit appends the tokens of ``path_rows`` to the committed sequence (what the KV moves do).
Decoding must then reproduce the target's plain greedy continuation exactly.
"""

from __future__ import annotations

import pytest
import torch

from sglang_overlay.adapter.settings import ResolvedDDTree
from sglang_overlay.adapter.tree_step import lattice_tree_stage, run_tree_step
from sglang_overlay.core.tree import draft_topk

VOCAB = 24


class ToyTarget:
    """A deterministic context -> logits function (depends on the last three tokens and length)."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.a = torch.randn(VOCAB, VOCAB, generator=g) * 2
        self.b = torch.randn(VOCAB, VOCAB, generator=g)
        self.c = torch.randn(VOCAB, VOCAB, generator=g) * 0.5
        self.p = torch.randn(5, VOCAB, generator=g)

    def logits(self, context: list[int]) -> torch.Tensor:
        x = self.p[len(context) % 5].clone()
        for weight, back in ((self.a, 1), (self.b, 2), (self.c, 3)):
            if len(context) >= back:
                x += weight[context[-back]]
        return x

    def greedy(self, context: list[int], n: int) -> list[int]:
        out, ctx = [], list(context)
        for _ in range(n):
            tok = int(self.logits(ctx).argmax())
            out.append(tok)
            ctx.append(tok)
        return out


class ToyPorts:
    def __init__(
        self,
        target: ToyTarget,
        prompts: list[list[int]],
        window: int,
        noise: float,
        sgl,
        seed: int,
        block: int | None = None,
    ):
        self.target = target
        self.window = window
        self.block = window if block is None else block
        self.noise = noise
        self.sgl = sgl
        self.gen = torch.Generator().manual_seed(seed)
        # committed[b]: tokens whose KV exists; the root (last prompt token here) is not yet in it.
        self.committed = [list(p[:-1]) for p in prompts]
        self.roots = torch.tensor([p[-1] for p in prompts])
        self.emitted: list[list[int]] = [[] for _ in prompts]
        self.commits = 0

    # 1. the drafter: a noisy copy of the target's greedy rollout, one distribution per depth
    def draft_hidden(self, root_tokens, prefix_lens):
        bs = len(self.committed)
        assert prefix_lens.tolist() == [len(c) for c in self.committed]
        out = torch.zeros(bs, self.block, VOCAB)
        for b in range(bs):
            ctx = self.committed[b] + [int(root_tokens[b])]
            for d in range(1, self.block):
                logits = self.target.logits(ctx)
                out[b, d] = logits + self.noise * torch.randn(VOCAB, generator=self.gen)
                ctx.append(int(out[b, d].argmax()))
        return out  # "hidden" = logits here; head_topk is the identity head

    def head_topk(self, rows, k):
        return draft_topk(rows, k)

    # 4. the target over the tree, each row seeing only what its mask row admits
    def verify(self, t):
        bs, w = len(self.committed), self.window
        tokens = t.draft_token.view(bs, w)
        positions = t.positions.view(bs, w)
        logits = torch.empty(bs, w, VOCAB)
        offset = 0
        for b in range(bs):
            prefix = len(self.committed[b])
            row_len = prefix + w
            for i in range(w):
                row = t.custom_mask[offset + i * row_len : offset + (i + 1) * row_len]
                assert row[:prefix].all()
                seen = sorted((int(positions[b, j]), int(tokens[b, j])) for j in range(w) if row[prefix + j])
                # The row sees exactly one token per position prefix..position(i): a path.
                assert [pos for pos, _ in seen] == list(range(prefix, int(positions[b, i]) + 1))
                logits[b, i] = self.target.logits(self.committed[b] + [tok for _, tok in seen])
            offset += w * row_len
        return logits

    # 5. SGLang's greedy tree acceptance
    def accept(self, t, logits):
        bs, w = len(self.committed), self.window
        device = t.draft_token.device
        predict = torch.zeros(bs * w, dtype=torch.int32, device=device)
        accept_index = torch.full((bs, w), -1, dtype=torch.int32, device=device)
        num_correct = torch.empty(bs, dtype=torch.int32, device=device)
        self.sgl.verify_tree_greedy(
            predict,
            accept_index,
            num_correct,
            t.draft_token.view(bs, w),
            t.retrieve_index,
            t.retrieve_next_token,
            t.retrieve_next_sibling,
            logits.argmax(-1),
        )
        return predict, num_correct + 1, accept_index

    # 6. the KV commit: root + accepted nodes, in path order, at consecutive positions
    def commit(self, t, logits, step):
        for b in range(len(self.committed)):
            n = int(step.accept_lens[b])
            path_tokens = t.draft_token[step.path_rows[b, :n]].tolist()
            assert path_tokens[0] == int(self.roots[b])
            assert step.path_positions[b, :n].tolist() == list(
                range(len(self.committed[b]), len(self.committed[b]) + n)
            )
            self.committed[b] += path_tokens
            self.emitted[b] += step.out_tokens[b, :n].tolist()
        self.roots = step.bonus.clone()
        self.commits += 1


class ToyLatticePorts(ToyPorts):
    """A DFlash2-style drafter: per slot the top-``width`` candidates of a noisy greedy rollout, and
    transition scores that read the candidate at the slot before (the target's own logits given it,
    plus noise), so the best child of a node depends on which sibling its parent is."""

    def __init__(self, *args, width: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.width = width

    def lattice(self, hidden_rows, root_tokens):
        bs, slots = int(hidden_rows.shape[0]), int(hidden_rows.shape[1])
        assert slots == self.block - 1
        ids = torch.zeros(bs, slots, self.width, dtype=torch.long)
        scores = torch.zeros(bs, slots, self.width, self.width)
        for b in range(bs):
            ctx = self.committed[b] + [int(root_tokens[b])]
            for e in range(slots):
                base = self.target.logits(ctx) + self.noise * torch.randn(VOCAB, generator=self.gen)
                ids[b, e] = base.topk(self.width).indices
                for p in range(self.width):
                    before = ctx if e == 0 else ctx[:-1] + [int(ids[b, e - 1, p])]
                    row = self.target.logits(before) + self.noise * torch.randn(VOCAB, generator=self.gen)
                    scores[b, e, p] = row[ids[b, e]]
                ctx.append(int(ids[b, e, 0]))
        return ids, scores


def decode_with_lattice(sgl, target, prompts, settings, noise, width, want, block=None):
    ports = ToyLatticePorts(target, prompts, settings.window, noise, sgl, seed=4, block=block, width=width)
    stage = lattice_tree_stage(ports.lattice, settings)
    steps = 0
    while min(len(e) for e in ports.emitted) < want:
        prefix = torch.tensor([len(c) for c in ports.committed])
        result = run_tree_step(ports, settings, ports.roots, prefix, prefix_lens_cpu=prefix.clone(), stage=stage)
        assert int(result.tensors.tree.num_nodes.max()) <= settings.budget
        steps += 1
        assert steps < 200
    return ports, steps


@pytest.mark.parametrize(
    "budget, top_k, width, window, block, noise",
    [(7, 3, 4, 8, None, 0.8), (15, 8, 4, 16, None, 1.5), (22, 4, 6, 23, 8, 0.5), (1, 1, 2, 4, None, 0.0)],
)
def test_trees_from_a_dflash2_lattice_reproduce_greedy_decoding(sgl, budget, top_k, width, window, block, noise):
    target = ToyTarget(seed=budget + width)
    prompts = [[1, 2, 3], [5], [7, 7, 7, 7, 2]]
    settings = ResolvedDDTree(budget, top_k, False, window, draft_block=block)
    ports, steps = decode_with_lattice(sgl, target, prompts, settings, noise, width, want=24, block=block)
    for prompt, emitted in zip(prompts, ports.emitted):
        assert emitted[:24] == target.greedy(prompt, 24)
    if noise <= 0.8 and budget > 1:
        assert steps < 24


@pytest.fixture(scope="module")
def sgl():
    from core import _sglang_kernels

    kernels = _sglang_kernels.load()
    if isinstance(kernels, str):
        pytest.skip(kernels)
    return kernels


@pytest.mark.parametrize(
    "budget, top_k, window, noise",
    [(7, 3, 8, 0.8), (3, 2, 8, 1.5), (15, 4, 16, 0.5), (1, 1, 4, 0.0)],
)
def test_tree_steps_reproduce_greedy_decoding(sgl, budget, top_k, window, noise):
    target = ToyTarget(seed=budget + window)
    prompts = [[1, 2, 3], [5], [7, 7, 7, 7, 2]]
    want = 24
    ports = ToyPorts(target, prompts, window, noise, sgl, seed=3)
    settings = ResolvedDDTree(budget=budget, top_k=top_k, allow_hybrid_unsafe=False, window=window)
    steps = 0
    while min(len(e) for e in ports.emitted) < want:
        prefix = torch.tensor([len(c) for c in ports.committed])
        result = run_tree_step(ports, settings, ports.roots, prefix, prefix_lens_cpu=prefix.clone())
        assert int(result.tensors.tree.num_nodes.max()) <= budget
        steps += 1
        assert steps < 200
    for prompt, emitted in zip(prompts, ports.emitted):
        assert emitted[:want] == target.greedy(prompt, want)
    # With a drafter close to the target, trees must accept more than one token per step.
    if noise <= 0.8 and budget > 1:
        assert steps < want


@pytest.mark.parametrize(
    "budget, top_k, block, noise",
    [(40, 4, 8, 1.5), (23, 6, 6, 2.5)],
)
def test_trees_wider_than_the_drafter_block_stay_lossless(sgl, budget, top_k, block, noise):
    # The verify window (budget + 1) exceeds the drafter's block: the tree is no deeper than the
    # block's draft positions, but spends its nodes on siblings.
    target = ToyTarget(seed=budget)
    prompts = [[1, 2, 3], [5], [7, 7, 7, 7, 2]]
    want = 24
    window = budget + 1
    ports = ToyPorts(target, prompts, window, noise, sgl, seed=5, block=block)
    settings = ResolvedDDTree(budget, top_k, False, window, draft_block=block)
    steps = 0
    while min(len(e) for e in ports.emitted) < want:
        prefix = torch.tensor([len(c) for c in ports.committed])
        result = run_tree_step(ports, settings, ports.roots, prefix, prefix_lens_cpu=prefix.clone())
        assert int(result.tensors.tree.num_nodes.max()) <= budget
        assert int(result.tensors.tree.depths.max()) <= block - 1
        assert int(result.step.accept_lens.max()) <= block
        steps += 1
        assert steps < 200
    for prompt, emitted in zip(prompts, ports.emitted):
        assert emitted[:want] == target.greedy(prompt, want)


def test_a_schedule_steps_each_batch_size_with_its_window(sgl):
    target = ToyTarget(seed=11)
    settings = ResolvedDDTree(30, 4, False, 31, draft_block=8, schedule=((1, 30), (4, 5)))
    for prompts, window in (([[1, 2, 3]], 31), ([[1, 2], [4], [6, 6]], 6), ([[3]] * 6, 6)):
        step_settings = settings.for_batch(len(prompts))
        assert step_settings.window == window and step_settings.block == 8
        ports = ToyPorts(target, prompts, window, 1.0, sgl, seed=1, block=8)
        for _ in range(4):
            prefix = torch.tensor([len(c) for c in ports.committed])
            run_tree_step(ports, step_settings, ports.roots, prefix, prefix_lens_cpu=prefix.clone())
        for prompt, emitted in zip(prompts, ports.emitted):
            assert emitted == target.greedy(prompt, len(emitted))


def test_drafter_width_must_match_its_block(sgl):
    target = ToyTarget(seed=0)
    ports = ToyPorts(target, [[1, 2]], window=8, noise=0.1, sgl=sgl, seed=0)
    settings = ResolvedDDTree(budget=5, top_k=2, allow_hybrid_unsafe=False, window=6)
    with pytest.raises(RuntimeError, match="block of 6"):
        run_tree_step(ports, settings, ports.roots, torch.tensor([1]))
