"""The tree stage (``tree_step.tree_stage``) and its CUDA-graph wrapper's eager fallbacks, on CPU.

The graph replay itself needs a GPU: ``tests/adapter/gpu_glue_check.py`` (section 7) compares it
with the eager stage bit for bit on the device.
"""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import torch

from sglang_overlay import knobs
from sglang_overlay.adapter.settings import ResolvedDDTree
from sglang_overlay.adapter.tree_stage import GraphedTreeStage, backend_mask_buffer
from sglang_overlay.adapter.tree_step import lattice_tree_stage, tree_stage
from sglang_overlay.adapter.tree_verify import (
    TreeLayout,
    build_tree_verify_tensors,
    full_custom_mask,
    full_mask_index,
    verify_tensors_from_layout,
)
from sglang_overlay.core.tree import DDTreeBatch, draft_topk
from sglang_overlay.core.verify import ancestor_mask, sglang_tree_mask

SETTINGS = ResolvedDDTree(budget=6, top_k=3, allow_hybrid_unsafe=False, window=8)
VOCAB, HIDDEN = 40, 12


def inputs(bs: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs, SETTINGS.window, HIDDEN, generator=g)
    weight = torch.randn(VOCAB, HIDDEN, generator=g)
    roots = torch.randint(0, VOCAB, (bs,), generator=g)
    prefix = torch.randint(0, 9, (bs,), generator=g)
    return hidden, weight, roots, prefix


def head(weight):
    return lambda rows, k: draft_topk(rows @ weight.T, k, stable=True)


def assert_same_verify_input(got, want):
    for f in (
        "draft_token",
        "positions",
        "custom_mask",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
    ):
        assert torch.equal(getattr(got, f), getattr(want, f)), f


def test_stage_equals_the_verify_tensors_of_the_drafter_rows():
    hidden, weight, roots, prefix = inputs(3, seed=1)
    got = verify_tensors_from_layout(tree_stage(head(weight), SETTINGS)(hidden, roots, prefix), prefix)
    # Rows 1..L of each block are the drafter's positions; row 0 (the root's) is not drafted.
    lp, ids = draft_topk(hidden[:, 1:, :] @ weight.T, SETTINGS.effective_top_k, stable=True)
    want = build_tree_verify_tensors(lp, ids, roots, prefix, SETTINGS.budget, SETTINGS.effective_top_k, SETTINGS.window)
    assert got.tree.equals(want.tree)
    assert_same_verify_input(got, want)


def test_a_lattice_whose_rows_ignore_the_parent_gives_the_marginal_trees_layout():
    # DFlash2's stage with every row of a slot the same is the marginal stage over the K candidates:
    # same tokens, positions, links and mask (the lattice reads rows 1..L and slot 0 from the root).
    hidden, weight, roots, prefix = inputs(3, seed=4)
    width = 5

    def candidates(rows):
        return (rows @ weight.T).topk(width, dim=-1)

    def lattice(hidden_rows, root_tokens):
        assert torch.equal(root_tokens, roots) and hidden_rows.shape[1] == SETTINGS.window - 1
        values, ids = candidates(hidden_rows)
        return ids, values.unsqueeze(2).expand(-1, -1, width, -1)

    def marginal_head(rows, k):
        values, ids = candidates(rows)
        return torch.log_softmax(values, dim=-1)[:, :k], ids[:, :k]

    got = verify_tensors_from_layout(lattice_tree_stage(lattice, SETTINGS)(hidden, roots, prefix), prefix)
    want = verify_tensors_from_layout(tree_stage(marginal_head, SETTINGS)(hidden, roots, prefix), prefix)
    assert int(got.tree.num_nodes.min()) == SETTINGS.budget
    assert_same_verify_input(got, want)


def test_a_lattice_stage_caps_siblings_at_top_k_and_at_its_candidates():
    hidden, _weight, roots, prefix = inputs(2, seed=6)
    g = torch.Generator().manual_seed(7)
    for width, cap in ((2, 2), (6, SETTINGS.effective_top_k)):
        ids = torch.randint(0, VOCAB, (2, SETTINGS.window - 1, width), generator=g)
        # Flat rows: best-first takes every sibling it may before going deeper.
        scores = torch.zeros(2, SETTINGS.window - 1, width, width)
        layout = lattice_tree_stage(lambda h, r, ids=ids, scores=scores: (ids, scores), SETTINGS)(hidden, roots, prefix)
        tree = layout.tree
        assert int(tree.ranks[tree.ranks >= 0].max()) == cap - 1
        assert int((tree.depths == 1).sum(dim=1).max()) == cap
        assert torch.equal(tree.tokens[:, 0], roots)


def test_mask_index_gives_sglangs_full_mask():
    hidden, weight, roots, prefix = inputs(4, seed=2)
    layout = tree_stage(head(weight), SETTINGS)(hidden, roots, prefix)
    assert torch.equal(layout.mask_index, full_mask_index(prefix, SETTINGS.window))
    mask = full_custom_mask(layout.ancestors, prefix, prefix.clone(), mask_index=layout.mask_index)
    assert torch.equal(mask, sglang_tree_mask(layout.tree, prefix, full=True))
    assert torch.equal(mask, full_custom_mask(ancestor_mask(layout.tree), prefix))


class StandInGraphs(GraphedTreeStage):
    """The wrapper with a CPU stand-in for a CUDA graph: a replay reruns the stage on the static inputs
    and writes into the captured outputs (what a graph replay does), so the padding, the input copies
    and the output views are tested without a GPU."""

    def _can_capture(self, hidden):
        return True

    def _capture(self, static, stream=None):
        out = self.stage(*static)

        def replay():
            new = self.stage(*static)
            for a, b in zip(layout_tensors(out), layout_tensors(new)):
                a.copy_(b)

        return replay, out


def layout_tensors(layout):
    tree = [getattr(layout.tree, f.name) for f in fields(DDTreeBatch)]
    rest = [getattr(layout, f.name) for f in fields(TreeLayout) if f.name != "tree"]
    return tree + [t for t in rest if t is not None]


def assert_same_layout(got, want):
    assert len(layout_tensors(got)) == len(layout_tensors(want))
    for a, b in zip(layout_tensors(got), layout_tensors(want)):
        assert torch.equal(a, b)


def test_graphed_stage_pads_to_the_captured_sizes_and_equals_the_eager_stage():
    _, weight, _, _ = inputs(1, seed=4)
    stage = tree_stage(head(weight), SETTINGS)
    graphed = StandInGraphs(stage, batch_sizes=[8, 1, 2, 4])
    for seed, bs in enumerate([3, 1, 3, 8, 2, 5, 3]):  # new inputs every call, sizes revisited
        hidden, _, roots, prefix = inputs(bs, seed=10 + seed)
        assert_same_layout(graphed(hidden, roots, prefix), stage(hidden, roots, prefix))
    assert graphed.captured_sizes == [1, 2, 4, 8]


def test_graphed_stage_runs_eagerly_where_it_cannot_capture():
    hidden, weight, roots, prefix = inputs(3, seed=3)
    calls = []
    stage = tree_stage(head(weight), SETTINGS)

    def counted(*args):
        calls.append(args[0].shape[0])
        return stage(*args)

    class FailingCapture(StandInGraphs):
        def _capture(self, static, stream=None):
            raise RuntimeError("operation not permitted when stream is capturing")

    want = stage(hidden, roots, prefix)
    wrappers = (
        GraphedTreeStage(counted, batch_sizes=[4]),  # CPU tensors: no graphs
        StandInGraphs(counted, batch_sizes=[1, 2]),  # batch above the captured sizes
        StandInGraphs(counted, batch_sizes=[4], enabled=False),
        StandInGraphs(counted, batch_sizes=[]),  # the target has no decode graphs
        FailingCapture(counted, batch_sizes=[4]),
    )
    for wrapper in wrappers:
        assert_same_layout(wrapper(hidden, roots, prefix), want)
        assert wrapper.captured_sizes == []
    assert calls == [3] * len(wrappers)
    assert not wrappers[-1].enabled


# ---- the FULL mask written by the stage into the attention backend's buffer ------------------------


def test_stage_writes_the_full_mask_and_the_verify_input_is_a_view_of_the_buffer():
    hidden, weight, roots, prefix = inputs(3, seed=5)
    want = verify_tensors_from_layout(tree_stage(head(weight), SETTINGS)(hidden, roots, prefix), prefix)
    buffer = torch.full((4096,), 7, dtype=torch.uint8)  # the Triton backend's dtype
    layout = tree_stage(head(weight), SETTINGS, mask_out=buffer)(hidden, roots, prefix)
    assert layout.mask_buffer is buffer
    got = verify_tensors_from_layout(layout, prefix, prefix.clone())
    assert got.custom_mask.data_ptr() == buffer.data_ptr()  # no copy: the backend's copy is onto itself
    assert torch.equal(got.custom_mask.bool(), want.custom_mask)
    assert got.custom_mask.numel() == want.custom_mask.numel()


def test_a_mask_larger_than_the_buffer_is_built_as_before():
    hidden, weight, roots, prefix = inputs(3, seed=6)
    want = verify_tensors_from_layout(tree_stage(head(weight), SETTINGS)(hidden, roots, prefix), prefix)
    buffer = torch.zeros(want.custom_mask.numel() - 1, dtype=torch.uint8)
    got = verify_tensors_from_layout(
        tree_stage(head(weight), SETTINGS, mask_out=buffer)(hidden, roots, prefix), prefix, prefix.clone()
    )
    assert got.custom_mask.data_ptr() != buffer.data_ptr()
    assert torch.equal(got.custom_mask, want.custom_mask)


def test_graphed_stage_writes_the_mask_of_the_real_requests_at_every_padded_size():
    _, weight, _, _ = inputs(1, seed=7)
    graphed_buffer, eager_buffer = (torch.zeros(8192, dtype=torch.uint8) for _ in range(2))
    graphed = StandInGraphs(tree_stage(head(weight), SETTINGS, mask_out=graphed_buffer), batch_sizes=[8, 2, 4])
    eager = tree_stage(head(weight), SETTINGS, mask_out=eager_buffer)
    for seed, bs in enumerate([3, 1, 8, 2, 5]):
        hidden, _, roots, prefix = inputs(bs, seed=20 + seed)
        got = verify_tensors_from_layout(graphed(hidden, roots, prefix), prefix, prefix.clone())
        want = verify_tensors_from_layout(eager(hidden, roots, prefix), prefix, prefix.clone())
        assert got.custom_mask.data_ptr() == graphed_buffer.data_ptr()
        assert torch.equal(got.custom_mask, want.custom_mask)


def triton_backend(buffer, mode="FULL_MASK", is_read=True, name="TritonAttnBackend"):
    backend_type = type(name, (), {})
    backend = backend_type()
    backend.verify_mask = SimpleNamespace(buffer=buffer, mode=SimpleNamespace(name=mode), is_read=is_read)
    return backend


def test_backend_mask_buffer_only_for_a_full_layout_buffer_of_the_triton_backend(monkeypatch):
    monkeypatch.setenv(knobs.IN_PLACE_TREE_MASK.name, "1")
    buffer = torch.zeros(64, dtype=torch.uint8)
    assert backend_mask_buffer(triton_backend(buffer)) is buffer
    assert backend_mask_buffer(triton_backend(buffer.view(torch.bool))) is not None
    refused = [
        triton_backend(buffer, name="FlashInferAttnBackend"),  # packs the mask into bits
        triton_backend(buffer, mode="QLEN_ONLY"),
        triton_backend(buffer, is_read=False),
        triton_backend(torch.zeros(64, dtype=torch.int32)),
        triton_backend(torch.zeros(8, 8, dtype=torch.uint8)),
        triton_backend(torch.zeros(128, dtype=torch.uint8)[::2]),
        None,
    ]
    for backend in refused:
        assert backend_mask_buffer(backend) is None
    no_mask = triton_backend(buffer)
    no_mask.verify_mask = None  # no target CUDA graphs: SGLang allocates none
    assert backend_mask_buffer(no_mask) is None
    # Off unless asked for (not yet proven on the GPU).
    monkeypatch.delenv(knobs.IN_PLACE_TREE_MASK.name)
    assert backend_mask_buffer(triton_backend(buffer)) is None


def test_every_capture_runs_inside_the_capture_context_on_its_stream():
    # At TP > 1 the worker passes SGLang's graph_capture: entered once around all captures, whose
    # stream every capture uses (the vocab-parallel all-gather inside the graph needs it).
    events, seen_streams = [], []

    class Context:
        stream = "the capture stream"

        def __enter__(self):
            events.append("enter")
            return self

        def __exit__(self, *exc):
            events.append("exit")
            return False

    class Recording(StandInGraphs):
        def _capture(self, static, stream=None):
            seen_streams.append(stream)
            events.append("capture %d" % static[0].shape[0])
            return super()._capture(static, stream)

    hidden, weight, roots, prefix = inputs(3, seed=5)
    graphed = Recording(tree_stage(head(weight), SETTINGS), batch_sizes=[1, 4], capture_context=Context)
    got = graphed(hidden, roots, prefix)
    assert events == ["enter", "capture 4", "capture 1", "exit"]
    assert seen_streams == ["the capture stream"] * 2
    want = tree_stage(head(weight), SETTINGS)(hidden, roots, prefix)
    assert torch.equal(got.tree.tokens, want.tree.tokens)
