"""The planted path (the step-cost benchmark's instrument): the Triton kernel (interpreted on CPU) against the
host reference, on trees the real builder makes, and the plant's text forms."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_overlay.core.tree import build_tree_batched
from sglang_overlay.kernels import plant_path as pp

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and pp.triton is not None
needs_interpreter = pytest.mark.skipif(not INTERPRETED, reason="needs triton with TRITON_INTERPRET=1 (CPU)")

BLOCK = 16  # the drafter's block: trees at most 15 deep


def trees(bs: int, budget: int, top_k: int, seed: int, window: int):
    """Padded trees from random per-position top-k distributions, as the tree stage builds them."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, BLOCK - 1, top_k, generator=g) * 2.0
    log_probs, _ = torch.sort(torch.log_softmax(logits, -1), dim=-1, descending=True)
    token_ids = torch.randint(4, 500, (bs, BLOCK - 1, top_k), generator=g)
    tree = build_tree_batched(log_probs, token_ids, budget, root_tokens=torch.full((bs,), 7))
    pad = window - tree.num_slots
    parents = torch.cat([tree.parents.to(torch.int64), torch.full((bs, pad), -1)], 1)
    tokens = torch.cat([tree.tokens, torch.zeros(bs, pad, dtype=torch.int64)], 1)
    return parents, tokens


def acceptance(bs: int, window: int, seed: int):
    """What eagle_sample hands back before the plant: a one-token acceptance and random predictions."""
    g = torch.Generator().manual_seed(seed)
    predict = torch.randint(0, 500, (bs * window,), generator=g, dtype=torch.int32)
    accept_index = torch.full((bs, window), -1, dtype=torch.int32)
    accept_index[:, 0] = torch.arange(bs, dtype=torch.int32) * window
    return predict, accept_index, torch.ones(bs, dtype=torch.int32)


def reference_path(parents: list, rank: str, depth: int) -> list:
    node, path = 0, [0]
    for _ in range(depth):
        children = [s for s, p in enumerate(parents) if s > 0 and p == node]
        if not children:
            break
        node = children[{"first": 0, "middle": (len(children) - 1) // 2, "last": len(children) - 1}[rank]]
        path.append(node)
    return path


@pytest.mark.parametrize("rank", sorted(pp.RANKS))
@pytest.mark.parametrize("budget,top_k,window,depth", [(15, 8, 16, 15), (31, 8, 32, 8), (63, 4, 64, 15), (7, 2, 16, 3)])
def test_host_reference_takes_the_named_child_at_every_depth(rank, budget, top_k, window, depth):
    parents, tokens = trees(3, budget, top_k, seed=budget + depth, window=window)
    predict, accept_index, accept_lens = acceptance(3, window, seed=1)
    pp.plant_path_torch(parents, tokens, predict, accept_index, accept_lens, pp.PathPlant(rank, depth))
    for b in range(3):
        path = reference_path(parents[b].tolist(), rank, depth)
        assert int(accept_lens[b]) == len(path)
        assert accept_index[b, : len(path)].tolist() == [b * window + s for s in path]
        assert (accept_index[b, len(path) :] == -1).all()
        # every path node predicts its child's token: the walk over the path is consistent
        for parent, child in zip(path, path[1:]):
            assert int(predict[b * window + parent]) == int(tokens[b, child])


@needs_interpreter
@pytest.mark.parametrize("rank", sorted(pp.RANKS))
@pytest.mark.parametrize("budget,top_k,window,depth", [(15, 8, 16, 15), (31, 8, 32, 8), (63, 4, 64, 15), (7, 2, 16, 3)])
def test_kernel_plants_the_reference_path(rank, budget, top_k, window, depth):
    parents, tokens = trees(4, budget, top_k, seed=budget * 3 + depth, window=window)
    want = acceptance(4, window, seed=2)
    got = acceptance(4, window, seed=2)
    plant = pp.PathPlant(rank, depth)
    pp.plant_path_torch(parents, tokens, *want, plant)
    pp.plant_path(parents, tokens, *got, plant, max_depth=BLOCK - 1)
    for w, g in zip(want, got):
        assert torch.equal(w, g)


def test_plants_differ_where_the_tree_branches():
    parents, tokens = trees(1, 31, 8, seed=5, window=32)
    paths = {}
    for rank in pp.RANKS:
        predict, accept_index, accept_lens = acceptance(1, 32, seed=3)
        pp.plant_path_torch(parents, tokens, predict, accept_index, accept_lens, pp.PathPlant(rank, 15))
        paths[rank] = accept_index[0, : int(accept_lens[0])].tolist()
    assert paths["first"] != paths["last"]
    assert all(len(p) >= 2 for p in paths.values())


@pytest.mark.parametrize(
    "text,want",
    [("first 8", pp.PathPlant("first", 8)), (" last  15\n", pp.PathPlant("last", 15)), ("none", None), ("", None)],
)
def test_parse_plant(text, want):
    assert pp.parse_plant(text) == want


@pytest.mark.parametrize(
    "text,words", [("second 3", "RANK DEPTH"), ("last x", "'x' is not an integer"), ("first 0", "at least 1")]
)
def test_parse_plant_names_the_bad_part(text, words):
    with pytest.raises(ValueError, match=words):
        pp.parse_plant(text)


def test_plant_file_is_reread_when_it_changes(tmp_path):
    spec = tmp_path / "plant"
    source = pp.PlantSource("@%s" % spec)
    assert source.current() is None  # no file yet: nothing planted
    spec.write_text("middle 4")
    assert source.current() == pp.PathPlant("middle", 4)
    spec.write_text("last 9")
    os.utime(spec, ns=(1, 10**18))  # a new modification time, however fast the writes came
    assert source.current() == pp.PathPlant("last", 9)
    spec.write_text("bogus")
    os.utime(spec, ns=(1, 2 * 10**18))
    assert source.current() is None
