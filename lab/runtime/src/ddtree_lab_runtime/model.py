"""The lab's target model: a deterministic byte-level language model built locally (no downloads).

``LabLM`` scores the next token from the whole context with two parts:

* an interpolated (Witten-Bell) byte n-gram model, counted from ``corpus.SEED_TEXT`` (plus the
  model config's ``extra_text``), of order ``ngram_order`` (default 6: five bytes of context), with
  a fixed per-context perturbation of the log-probabilities drawn from the model's seed ("its
  weights"): two model paths give two different, equally deterministic models;
* a "topic" term over the whole context: ``topic_scale * mean(W[token] for every byte token in
  the context)``, ``W`` a seeded ``[256, V]`` matrix. It makes the continuation depend on the
  prompt as a whole, not only on its last five bytes;
* a "novelty" term: ``-repeat_penalty`` for each token that would repeat, within the last
  ``repeat_window`` bytes, a ``repeat_match + 1``-byte sequence already there (as a trained model
  learns not to loop). Greedy decoding of a bare n-gram model falls into short loops
  ("and the test, and the test, ..."); this breaks them without touching ordinary text;
* an end of turn: once the current turn (the bytes since the last special token) is longer than
  ``reply_bytes`` and the context ends a sentence, the stop token (``<|im_end|>`` in a chat,
  ``<|endoftext|>`` otherwise) becomes the argmax, so replies end as a chat model's do.

Exactness: ``W`` holds multiples of 2**-10 in [-0.5, 0.5], so the running sum of its rows is exact
in float64 in any order; every logit is then computed by the same element-wise float64 operations
whatever the batch shape. A tree-verify row and a plain decoding step over the same context
therefore give bit-identical logits, and greedy speculative decoding must reproduce plain greedy
decoding token for token (no tolerance needed).

The model: ``--model-path`` names it. When ``<model-path>/config.json`` exists and holds a
``"lab_runtime"`` object, its keys override the defaults (``seed``, ``ngram_order``,
``topic_scale``, ``weight_noise``, ``repeat_penalty``, ``repeat_match``, ``repeat_window``,
``reply_bytes``, ``context_length``, ``extra_text``); otherwise the seed is
derived from the path string (sha256), so any path names a model.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from . import corpus
from .tokenizer import BYTE_OF_ID, EOS_ID, ID_OF_BYTE, IM_END_ID, IM_START_ID, NUM_BYTE_TOKENS, VOCAB_SIZE

#: Log-probability given to the special tokens: never the argmax, practically never sampled.
SPECIAL_LOGIT = -20.0
_CACHE_LIMIT = 16384
_NEWLINE = ord("\n")


def seed_from_text(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def mix_seed(*parts: Any) -> int:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
        h.update(b"\0")
    return int.from_bytes(h.digest()[:8], "little")


def read_json_config(path: Optional[str]) -> Optional[dict]:
    """``<path>/config.json`` (or ``path`` itself when it is a JSON file) as a dict, else None."""
    if not path:
        return None
    candidates = [os.path.join(path, "config.json")] if os.path.isdir(path) else [path]
    for candidate in candidates:
        try:
            with open(candidate, "r", encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


@dataclass(frozen=True)
class LabModelConfig:
    path: str
    seed: int
    ngram_order: int = 6
    topic_scale: float = 4.0
    weight_noise: float = 0.3
    repeat_penalty: float = 3.0
    repeat_match: int = 8
    repeat_window: int = 384
    reply_bytes: int = 600
    context_length: int = 8192
    extra_text: str = ""
    source: str = "path"  # "path" (seed from the path) or "config.json"

    @classmethod
    def from_path(cls, path: str, context_length: Optional[int] = None) -> "LabModelConfig":
        data = read_json_config(path)
        lab = data.get("lab_runtime") if isinstance(data, dict) else None
        kwargs: dict[str, Any] = {}
        source = "path"
        if isinstance(lab, dict):
            source = "config.json"
            for key in ("seed", "ngram_order", "context_length", "repeat_match", "repeat_window", "reply_bytes"):
                if key in lab:
                    kwargs[key] = int(lab[key])
            for key in ("topic_scale", "weight_noise", "repeat_penalty"):
                if key in lab:
                    kwargs[key] = float(lab[key])
            if "extra_text" in lab:
                kwargs["extra_text"] = str(lab["extra_text"])
        kwargs.setdefault("seed", seed_from_text(path))
        if context_length:
            kwargs["context_length"] = int(context_length)
        if kwargs.get("ngram_order", 6) < 1:
            raise ValueError(f"lab model {path!r}: ngram_order must be >= 1")
        return cls(path=path, source=source, **kwargs)


class Context:
    """What the model needs of a token sequence: its recent bytes, the topic sum, the byte count.

    ``recent`` holds the last ``repeat_window`` bytes (specials read as newlines); the n-gram
    context is its last ``ngram_order - 1`` bytes. ``turn``: bytes since the last special token;
    ``chat``: an ``<|im_start|>`` was seen.
    """

    __slots__ = ("recent", "hw", "n", "length", "turn", "chat")

    def __init__(self, recent: bytes, hw: np.ndarray, n: int, length: int, turn: int, chat: bool):
        self.recent = recent
        self.hw = hw
        self.n = n
        self.length = length
        self.turn = turn
        self.chat = chat

    def key(self) -> tuple:
        return (self.recent[-16:], self.n, self.length)


class LabLM:
    """The deterministic target model (see the module docstring)."""

    model_type = "lab_ngram"
    architectures = ["LabNgramForCausalLM"]
    vocab_size = VOCAB_SIZE

    def __init__(self, config: LabModelConfig):
        self.config = config
        self.k = config.ngram_order - 1
        data = (corpus.SEED_TEXT + config.extra_text).encode("utf-8")
        self._tables = self._count(data, self.k)
        rng = np.random.default_rng(config.seed)
        w = np.zeros((NUM_BYTE_TOKENS, VOCAB_SIZE), dtype=np.float64)
        w[:, :NUM_BYTE_TOKENS] = rng.integers(-512, 513, size=(NUM_BYTE_TOKENS, NUM_BYTE_TOKENS)) / 1024.0
        self.W = w
        self._zero = np.zeros(VOCAB_SIZE, dtype=np.float64)
        self._cache: dict[bytes, np.ndarray] = {}
        self._window = max(int(config.repeat_window), self.k, 1)
        self.num_parameters = int(w.size + sum(len(ids) for table in self._tables for ids, _, _ in table.values()))

    # ---- construction ----------------------------------------------------------------------

    @staticmethod
    def _count(data: bytes, k: int) -> list[dict[bytes, tuple[np.ndarray, np.ndarray, int]]]:
        tables = []
        for order in range(k + 1):
            counts: dict[bytes, dict[int, int]] = {}
            for i in range(order, len(data)):
                ctx = data[i - order : i]
                nxt = ID_OF_BYTE[data[i]]
                row = counts.setdefault(ctx, {})
                row[nxt] = row.get(nxt, 0) + 1
            table = {}
            for ctx, row in counts.items():
                ids = np.fromiter(row.keys(), dtype=np.int64, count=len(row))
                cnt = np.fromiter(row.values(), dtype=np.float64, count=len(row))
                table[ctx] = (ids, cnt, int(cnt.sum()))
            tables.append(table)
        return tables

    # ---- contexts ------------------------------------------------------------------------------

    def context(self, ids: Sequence[int]) -> Context:
        arr = np.asarray(list(ids), dtype=np.int64)
        byte_ids = arr[(arr >= 0) & (arr < NUM_BYTE_TOKENS)]
        hw = self.W[byte_ids].sum(axis=0) if byte_ids.size else self._zero.copy()
        window = self._window
        recent = bytes(BYTE_OF_ID[i] if 0 <= i < NUM_BYTE_TOKENS else _NEWLINE for i in arr[-window:].tolist())
        specials = np.flatnonzero((arr < 0) | (arr >= NUM_BYTE_TOKENS))
        turn = int(arr.size - 1 - specials[-1]) if specials.size else int(arr.size)
        chat = bool((arr == IM_START_ID).any())
        return Context(recent, hw, int(byte_ids.size), int(arr.size), turn, chat)

    def push(self, ctx: Context, token: int) -> Context:
        token = int(token)
        if 0 <= token < NUM_BYTE_TOKENS:
            recent = (ctx.recent + bytes((BYTE_OF_ID[token],)))[-self._window :]
            return Context(recent, ctx.hw + self.W[token], ctx.n + 1, ctx.length + 1, ctx.turn + 1, ctx.chat)
        recent = (ctx.recent + b"\n")[-self._window :]
        return Context(recent, ctx.hw, ctx.n, ctx.length + 1, 0, ctx.chat or token == IM_START_ID)

    # ---- scoring -------------------------------------------------------------------------------

    def _ngram_logits(self, tail: bytes) -> np.ndarray:
        cached = self._cache.get(tail)
        if cached is not None:
            return cached
        probs = np.full(NUM_BYTE_TOKENS, 1.0 / NUM_BYTE_TOKENS, dtype=np.float64)
        for order in range(0, len(tail) + 1):
            entry = self._tables[order].get(tail[len(tail) - order :])
            if entry is None:
                break
            ids, cnt, total = entry
            types = len(ids)
            nxt = probs * types
            nxt[ids] += cnt
            probs = nxt / (total + types)
        logits = np.full(VOCAB_SIZE, SPECIAL_LOGIT, dtype=np.float64)
        logits[:NUM_BYTE_TOKENS] = np.log(probs)
        if self.config.weight_noise:
            rng = np.random.default_rng(mix_seed(self.config.seed, tail))
            logits[:NUM_BYTE_TOKENS] += self.config.weight_noise * rng.standard_normal(NUM_BYTE_TOKENS)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[tail] = logits
        return logits

    def _repeats(self, recent: bytes) -> list[int]:
        """Token ids that would repeat a ``repeat_match + 1``-byte sequence of ``recent``."""
        m = self.config.repeat_match
        if m < 1 or len(recent) <= m:
            return []
        key = recent[-m:]
        body = recent[:-1]  # every earlier occurrence of the key, each followed by a byte
        found = set()
        start = body.find(key)
        while start != -1:
            found.add(ID_OF_BYTE[recent[start + m]])
            start = body.find(key, start + 1)
        return sorted(found)

    def logits(self, ctx: Context) -> np.ndarray:
        """Next-token logits ``[V]`` (float64) after ``ctx``."""
        tail = ctx.recent[-self.k :] if self.k else b""
        out = self._ngram_logits(tail).copy()
        if ctx.n and self.config.topic_scale:
            out += self.config.topic_scale * (ctx.hw / ctx.n)
        if self.config.repeat_penalty:
            repeats = self._repeats(ctx.recent)
            if repeats:
                out[repeats] -= self.config.repeat_penalty
        if ctx.turn >= self.config.reply_bytes and ctx.recent[-1:] in (b".", b"!", b"?", b"\n"):
            out[IM_END_ID if ctx.chat else EOS_ID] = float(out.max()) + 5.0
        return out


@dataclass(frozen=True)
class LabDraftConfig:
    """The lab drafter named by ``--speculative-draft-model-path``.

    ``<draft-path>/config.json`` may give ``block_size`` (top level or under ``dflash_config``,
    as SGLang's DFlash drafts do: it is the default DFlash window) and a ``"lab_runtime"`` object
    with ``seed``, ``noise`` (std of the Gaussian noise on the drafter's logits at depth 1) and
    ``noise_growth`` (added per depth). Without a config the seed comes from the path.
    """

    path: str
    seed: int
    noise: float = 1.2
    noise_growth: float = 0.15
    block_size: Optional[int] = None
    raw: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_path(cls, path: str) -> "LabDraftConfig":
        data = read_json_config(path) or {}
        lab = data.get("lab_runtime") if isinstance(data.get("lab_runtime"), dict) else {}
        block = None
        dflash = data.get("dflash_config") if isinstance(data.get("dflash_config"), dict) else {}
        raw_block = dflash.get("block_size", data.get("block_size"))
        if raw_block is not None:
            block = int(raw_block)
        return cls(
            path=path,
            seed=int(lab.get("seed", seed_from_text("draft:" + path))),
            noise=float(lab.get("noise", cls.noise)),
            noise_growth=float(lab.get("noise_growth", cls.noise_growth)),
            block_size=block,
            raw=data,
        )

    def sigmas(self, num_positions: int) -> np.ndarray:
        return self.noise + self.noise_growth * np.arange(num_positions, dtype=np.float64)
