"""The reference decoder on tiny random-weight Hugging Face models: greedy DDTree equals greedy
autoregressive decoding token for token; sampled DDTree keeps the target's distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from broken_rules import accept_drafter_token
from ddtree_stats import ALPHA, chi_square_fit

from sglang_overlay.reference import decoder as decoder_module
from sglang_overlay.reference.decoder import generate_ar, generate_ddtree
from sglang_overlay.reference.toy import ModelDrafter, NoisyTargetDrafter, tiny_causal_lm

transformers = pytest.importorskip("transformers")

PROMPT = [3, 17, 42, 8, 99, 5]
NEW_TOKENS = 24
DRAFT_LEN = 4


@pytest.fixture(scope="module")
def targets():
    # initializer_range 0.5: peaked enough that drafts are often right, so trees go deep.
    return {
        arch: tiny_causal_lm(arch, vocab_size=160, seed=11, initializer_range=0.5)
        for arch in ("llama", "qwen3", "gpt_neox")
    }


@pytest.fixture(scope="module")
def ar_outputs(targets):
    return {arch: generate_ar(model, PROMPT, NEW_TOKENS).tokens for arch, model in targets.items()}


def test_ar_matches_hugging_face_generate(targets, ar_outputs):
    model = targets["llama"]
    out = model.generate(
        torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    assert out[0, len(PROMPT) :].tolist() == ar_outputs["llama"]


@pytest.mark.parametrize("budget", [1, 4, 16, 64])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_neox"])
def test_greedy_ddtree_equals_greedy_ar(targets, ar_outputs, arch, budget):
    target = targets[arch]
    drafter = NoisyTargetDrafter(target, noise_std=0.5, seed=budget)
    result = generate_ddtree(target, drafter, PROMPT, NEW_TOKENS, budget=budget, draft_len=DRAFT_LEN)
    assert result.tokens == ar_outputs[arch]
    assert sum(result.accept_lens) > 0  # drafted nodes were accepted, not only bonus tokens


def test_bigger_trees_accept_more(targets):
    # Not a correctness property, but the sign that the tree (not just a chain) is being used.
    target = targets["llama"]
    mean_accept = {}
    for budget in (1, 64):
        drafter = NoisyTargetDrafter(target, noise_std=0.5, seed=0)
        result = generate_ddtree(target, drafter, PROMPT, NEW_TOKENS, budget=budget, draft_len=DRAFT_LEN)
        mean_accept[budget] = sum(result.accept_lens) / result.steps
    assert mean_accept[64] > mean_accept[1] + 1.0, mean_accept


def test_greedy_ddtree_with_a_separate_drafter_model(targets, ar_outputs):
    drafter = ModelDrafter(tiny_causal_lm("llama", vocab_size=160, hidden_size=16, seed=5))
    result = generate_ddtree(targets["qwen3"], drafter, PROMPT, NEW_TOKENS, budget=16, draft_len=3, top_k=4)
    assert result.tokens == ar_outputs["qwen3"]


def test_eos_and_length_limits(targets, ar_outputs):
    ar = ar_outputs["llama"]
    eos = ar[7]
    drafter = NoisyTargetDrafter(targets["llama"], noise_std=0.5, seed=1)
    result = generate_ddtree(targets["llama"], drafter, PROMPT, 30, budget=16, draft_len=DRAFT_LEN, eos_token_id=eos)
    assert result.tokens == ar[: ar.index(eos) + 1]
    result = generate_ddtree(targets["llama"], drafter, PROMPT, 5, budget=16, draft_len=DRAFT_LEN)
    assert result.tokens == ar[:5]


def test_broken_kv_compaction_is_detected(targets, ar_outputs, monkeypatch):
    """Control: keeping the first verify rows instead of the accepted path must change the output."""
    real = decoder_module.compact_kv_cache

    def keep_prefix_rows(cache, src_rows, dst_start):
        real(cache, torch.arange(dst_start, dst_start + src_rows.numel()), dst_start)

    monkeypatch.setattr(decoder_module, "compact_kv_cache", keep_prefix_rows)
    target = targets["llama"]
    drafter = NoisyTargetDrafter(target, noise_std=0.5, seed=64)
    result = generate_ddtree(target, drafter, PROMPT, NEW_TOKENS, budget=64, draft_len=DRAFT_LEN)
    assert result.tokens != ar_outputs["llama"]


# --- T > 0 ------------------------------------------------------------------------------------

SMALL_VOCAB = 8
SMALL_PROMPT = [1, 5, 2]
SAMPLED_TOKENS = 3
RUNS = 800
TEMPERATURE = 1.0


@pytest.fixture(scope="module")
def small_target():
    # Larger weights: peaked next-token distributions, so drafts are often right.
    return tiny_causal_lm("llama", vocab_size=SMALL_VOCAB, hidden_size=32, seed=3, initializer_range=0.6)


def exact_first_tokens(model, prompt, temperature):
    """p(t1, t2, t3 | prompt) of the target, by enumeration."""
    v = SMALL_VOCAB
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        ctx2 = torch.tensor([prompt + [a] for a in range(v)])
        p2 = torch.softmax(model(ctx2).logits[:, -1] / temperature, -1)  # [a, b]
        ctx3 = torch.tensor([prompt + [a, b] for a in range(v) for b in range(v)])
        p3 = torch.softmax(model(ctx3).logits[:, -1] / temperature, -1).reshape(v, v, v)
    return (p1[:, None, None] * p2[:, :, None] * p3).double().numpy()


def sampled_counts(model, walk=None):
    drafter = NoisyTargetDrafter(model, noise_std=0.5, seed=0)
    counts = np.zeros((SMALL_VOCAB,) * SAMPLED_TOKENS)
    accepted = 0
    for seed in range(RUNS):
        gen = torch.Generator().manual_seed(seed)
        result = generate_ddtree(
            model,
            drafter,
            SMALL_PROMPT,
            SAMPLED_TOKENS,
            budget=6,
            draft_len=2,
            temperature=TEMPERATURE,
            generator=gen,
            walk=walk,
        )
        counts[tuple(result.tokens)] += 1
        accepted += sum(result.accept_lens)
    return counts, accepted


@pytest.mark.slow
def test_sampled_ddtree_keeps_the_target_distribution(small_target):
    counts, accepted = sampled_counts(small_target)
    fit = chi_square_fit(counts, exact_first_tokens(small_target, SMALL_PROMPT, TEMPERATURE))
    assert fit.p_value > ALPHA, str(fit)
    assert accepted > RUNS // 4  # the tree did part of the work


@pytest.mark.slow
def test_broken_rule_fails_the_same_test(small_target):
    counts, _ = sampled_counts(small_target, walk=accept_drafter_token)
    fit = chi_square_fit(counts, exact_first_tokens(small_target, SMALL_PROMPT, TEMPERATURE))
    assert fit.p_value < ALPHA, f"accepting the drafter's token was not detected: {fit}"
