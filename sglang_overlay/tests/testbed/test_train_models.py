"""The offline acceptance the drafter levels report (tests/gpu_sglang/train_models.py): DFLASH's chain and
a DDTree built by the overlay's core, along the target's greedy text."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from .test_embed_models import load_harness  # noqa: E402

VOCAB = 32


def logits_ranking(rows):
    """[L, VOCAB] logits whose top candidates at position i are rows[i], best first."""
    out = torch.full((len(rows), VOCAB), -10.0)
    for i, ranked in enumerate(rows):
        for r, token in enumerate(ranked):
            out[i, token] = 5.0 - r
    return out


def test_chain_accepts_the_leading_argmax_matches():
    tm = load_harness("train_models")
    logits = logits_ranking([[3, 4], [5, 6], [7, 8]])
    assert tm.chain_accepted(logits, torch.tensor([3, 5, 9])) == 2
    assert tm.chain_accepted(logits, torch.tensor([4, 5, 7])) == 0


def test_tree_recovers_a_second_candidate_the_chain_misses():
    tm = load_harness("train_models")
    logits = logits_ranking([[3, 4], [5, 6], [7, 8]])
    truth = torch.tensor([4, 5, 7])  # the drafter's second choice first, then its first choices
    assert tm.chain_accepted(logits, truth) == 0
    assert tm.tree_accepted(logits, truth, budget=15) == 3
    assert tm.tree_accepted(logits, truth, budget=1) == 0  # one node: the chain's first only


def test_tree_stops_at_a_token_outside_its_nodes():
    tm = load_harness("train_models")
    logits = logits_ranking([[3, 4], [5, 6], [7, 8]])
    assert tm.tree_accepted(logits, torch.tensor([3, 9, 7]), budget=15) == 1


def test_offline_acceptance_over_longer_outputs_reports_the_chain_and_each_tree(tiny_dir):
    oa = load_harness("offline_accept")
    got = oa.offline_acceptance(str(tiny_dir), ["tiny-qwen3-dflash"], 48, [1, 63], 2, torch.device("cpu"))
    row = got["tiny-qwen3-dflash"]
    assert set(row) == {"chain", "1", "63"}
    # one node verifies only the chain's first token: at most 2 a step (it plus the bonus)
    assert 1.0 <= row["1"] <= 2.0
    # the trained pair's drafter accepts most of its block, and 63 nodes hold its chain and more
    assert row["chain"] > 4.0 and row["63"] >= row["chain"]
