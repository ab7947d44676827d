"""Tiny random-weight causal LMs and drafters for tests and the lab (no downloads).

Drafters give ``L`` per-position logits in one call, like DFlash's block: row ``i`` is a
distribution for the token at depth ``i + 1`` after the root.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = [
    "ARCHITECTURES",
    "tiny_causal_lm",
    "Drafter",
    "NoisyTargetDrafter",
    "ModelDrafter",
]

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gpt_neox")


def _config(
    arch: str,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    initializer_range: float,
    max_positions: int,
):
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    if arch == "llama":
        return transformers.LlamaConfig(num_key_value_heads=num_kv_heads, **common)
    if arch == "qwen2":
        return transformers.Qwen2Config(num_key_value_heads=num_kv_heads, **common)
    if arch == "qwen3":
        return transformers.Qwen3Config(num_key_value_heads=num_kv_heads, head_dim=hidden_size // num_heads, **common)
    if arch == "mistral":
        return transformers.MistralConfig(num_key_value_heads=num_kv_heads, sliding_window=None, **common)
    if arch == "gpt_neox":
        return transformers.GPTNeoXConfig(use_parallel_residual=True, rotary_pct=1.0, **common)
    raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")


def tiny_causal_lm(
    arch: str = "llama",
    vocab_size: int = 256,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    initializer_range: float = 0.02,
    max_positions: int = 512,
):
    """A random-weight Hugging Face causal LM built from a config, in eval mode on CPU.

    ``initializer_range`` scales the weights: larger values give peakier next-token
    distributions. float64 by default, so that a tree forward and a token-by-token forward agree
    far below any argmax margin.
    """
    import transformers

    config = _config(
        arch, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, initializer_range, max_positions
    )
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.to(dtype).eval()


class Drafter(Protocol):
    """Something that drafts ``num_positions`` per-position logit rows after ``context``."""

    def draft(self, context: torch.Tensor, num_positions: int) -> torch.Tensor:
        """``context``: ``[S]`` int64 (prompt + generated, ending with the root token).

        Returns ``[num_positions, V]`` logits.
        """
        ...


@torch.no_grad()
def _greedy_chain_logits(model, context: torch.Tensor, num_positions: int) -> torch.Tensor:
    ids = context.reshape(1, -1)
    rows = []
    for _ in range(num_positions):
        logits = model(input_ids=ids).logits[0, -1]
        rows.append(logits)
        ids = torch.cat([ids, logits.argmax().reshape(1, 1)], dim=1)
    return torch.stack(rows).to(torch.float32)


class NoisyTargetDrafter:
    """The target's own greedy continuation logits plus Gaussian noise (a good but imperfect drafter).

    With the noise the target's token is often not the draft's top-1, which makes the tree's
    side branches matter.
    """

    def __init__(self, target, noise_std: float = 1.0, seed: int = 0):
        self.target = target
        self.noise_std = noise_std
        self.generator = torch.Generator().manual_seed(seed)

    def draft(self, context: torch.Tensor, num_positions: int) -> torch.Tensor:
        logits = _greedy_chain_logits(self.target, context, num_positions)
        noise = torch.randn(logits.shape, generator=self.generator, dtype=torch.float32)
        return logits + self.noise_std * noise


class ModelDrafter:
    """A second (small) model's greedy chain: row ``i`` is its logits after its own ``i`` greedy tokens."""

    def __init__(self, model):
        self.model = model

    def draft(self, context: torch.Tensor, num_positions: int) -> torch.Tensor:
        return _greedy_chain_logits(self.model, context, num_positions)
