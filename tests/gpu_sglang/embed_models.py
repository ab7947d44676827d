"""Embed the trained tiny Qwen3 pair into production-shaped weights: a real SGLang server then computes the
tiny target's and drafter's function (up to bf16 rounding) at the production shape's cost per step.

Usage: python embed_models.py MODELS_DIR OUT_DIR --shape qwen3-8b|qwen3-30b-a3b [--drafter NAME ...]
                              [--layers N] [--device cuda] [--seed S] [--reuse]
  MODELS_DIR holds tiny-qwen3 and the drafters (train_models.py); writes OUT_DIR/target and OUT_DIR/NAME per
  drafter (default tiny-qwen3-dflash): config.json, safetensors shards + index, the tiny model's tokenizer
  files; and OUT_DIR/embed.json (what was written, seconds, bytes). Serve with
  `--model-path OUT_DIR/target --speculative-draft-model-path OUT_DIR/NAME`. --layers trims the target's
  layer count (the 30B-A3B's 48 layers are ~61 GB). Tensors are built on --device (default cuda when there
  is one) and written shard by shard (8B: ~16 GB target, ~2 GB per drafter). --reuse: nothing is written
  when OUT_DIR/embed.json records the same request (shape, drafters, seed, the tiny weights' digests).

The embedding (D, d: big and tiny hidden size; m: copies; R = D / (m d)):
* Residual stream: the tiny stream sits in m equal blocks (dims k d .. k d + d - 1), plus one flag dim
  (m d) that holds FLAG = 2^-7 from every embedding row; all other dims stay 0. Layers read block 0 and
  write every block. m is the smallest count with R a power of 4 (8B: m 1, R 16; 30B-A3B: m 2, R 4), so
  every rescale below is a power of 2: exact in bf16.
* RMSNorm over D: mean square = (ms_tiny + FLAG^2 / (m d)) / R. Weights w / sqrt(R) on block 0 and
  eps = (eps_tiny - FLAG^2 / (m d)) / R give exactly the tiny norm, eps included.
* Heads: tiny KV head g -> big KV head g; tiny query head j (group g, rank r) -> big head g * (NH / NKV) + r.
  Head dims (RoPE, neox rotate-half): tiny i and hd/2 + i -> big 2i and HD/2 + 2i (the same frequency:
  theta^(-2i/hd) = theta^(-2(2i)/HD)); values use the same map. The query also writes a copy of itself
  into the odd dims, whose q_norm weight is 0: q's mean square over HD equals the tiny's over hd while k's
  is half, so the normalised q equals the tiny q, the normalised k is sqrt(2) times the tiny k, and
  q.k / sqrt(HD) = tiny q.k / sqrt(hd): the attention scale is compensated without rescaling a weight. The
  one inexact part: q's norm sees eps, k's 2 eps (tiny: eps_tiny; both smaller; relative effect eps / ms).
* Vocabulary: real lm_head rows read block 0 and are 0 at the flag; rows of unused ids are 0 except -1 at
  the flag, and the final norm's flag weight makes the flag after the norm 2^16 / sqrt(ms_tiny + eps_tiny):
  every unused logit is -2^16 / sqrt(ms_tiny + eps_tiny) (about -2000 at the tiny target's largest mean
  square), the real logits are the tiny ones. Unused embedding rows are 0 (the flag excepted).
* MLP: the tiny MLP in the first rows; MoE: in every expert, the router random over block 0 (diverse
  routing, a realistic cost); the renormalised top-k weights sum to 1, so the output is the MLP's.
* Layers: the tiny layers at 0..L-1; the rest are identities: o_proj and down_proj (every expert) zero,
  the other weights small random values (so every GEMM runs on finite data), norms 1.
* Drafter: the same maps. fc reads block 0 of each captured tiny layer's feature, writes every block, and
  copies the flag of the first feature (hidden_norm sees the same mean square). The big drafter captures
  the tiny ids plus the shape's last ones up to the shape's count (8B: [1, 2, 17, 25, 33]; the tiny layers
  sit at big layers 0..L-1 and an identity layer's output equals its input); extra layers are identities.
* DFlash2 drafter (DFlash2DraftModel): the big convolutions keep the tiny group size, so tiny group j of copy
  k is big group k d / g + j: its base_kernel channels and its kernel_projection rows (side, tap, group; the
  rows read block 0, where the normed input is the tiny one) are the tiny ones in every copy, and a
  sublayer's output convolves in every copy as the tiny one. The other groups (flag, padding) are identity
  taps with projection rows 0: their channels are 0 in every normed input and every sublayer's output (the
  norms' flag weight is 0, the writers write the blocks only), so any kernel leaves them 0. An identity
  layer's convolutions: identity base, small random projection (their sublayer's output is 0). The
  selector: the codebooks' real rows are the tiny ones and the unused ids' rows 0 (an unused id never is
  a candidate, its logit -2000, nor an anchor); hidden_projection reads block 0 of the final hidden, not
  its flag. The target's embedded lm_head gives the tiny candidates and unary logits, so the big drafter
  computes the tiny lattice.
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_shaped  # noqa: E402
import models_for_target  # noqa: E402

TARGET_DIR = models_for_target.TARGET_DIR
FLAG = 2.0**-7  # the flag dim's value in every embedding row
UNUSED_LOGIT = 2.0**16  # unused logits are -UNUSED_LOGIT / sqrt(ms + eps) of the tiny final stream
RANDOM_STD = 0.02  # identity layers' non-output weights
SHARD_BYTES = 4 << 30
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
Tensors = Iterator[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class Dims:
    """The attention/MLP shape of a Qwen3 model (target or DFlash drafter)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    vocab: int

    @classmethod
    def of(cls, cfg: dict) -> "Dims":
        inter = cfg.get("moe_intermediate_size") if "num_experts" in cfg else cfg["intermediate_size"]
        return cls(
            cfg["hidden_size"],
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
            cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]),
            inter,
            cfg["num_hidden_layers"],
            cfg["vocab_size"],
        )


@dataclass(frozen=True)
class Layout:
    """Where the tiny model's coordinates go in the big one (module docstring)."""

    tiny: Dims
    big: Dims
    copies: int
    ratio: int
    eps: float
    q_rows: torch.Tensor  # [nh * hd] big q_proj row (= o_proj column) of each tiny one
    q_copy_rows: torch.Tensor  # [nh * hd] the odd-dim copy of each tiny q row
    kv_rows: torch.Tensor  # [nkv * hd] big k/v_proj row of each tiny one
    head_dims: torch.Tensor  # [hd] big head dim of each tiny one

    @property
    def flag(self) -> int:
        return self.copies * self.tiny.hidden

    @property
    def norm_scale(self) -> float:
        return 1.0 / math.sqrt(self.ratio)

    def blocks(self, device) -> torch.Tensor:
        """[m * d] the big dims of every copy of the tiny stream, block after block."""
        d = self.tiny.hidden
        return torch.arange(self.copies * d, device=device)


def choose_copies(big_hidden: int, tiny_hidden: int) -> tuple[int, int]:
    """(m, R): the fewest copies with R = D / (m d) a power of 4 and room for the flag dim."""
    for m in range(1, big_hidden // tiny_hidden + 1):
        if big_hidden % (m * tiny_hidden) or m * tiny_hidden >= big_hidden:
            continue
        ratio = big_hidden // (m * tiny_hidden)
        if ratio & (ratio - 1) == 0 and ratio.bit_length() % 2 == 1:  # 1, 4, 16, 64, ...
            return m, ratio
    raise ValueError("hidden %d holds no power-of-4 ratio of copies of %d plus a flag dim" % (big_hidden, tiny_hidden))


def make_layout(tiny: Dims, big: Dims, tiny_eps: float) -> Layout:
    if big.head_dim != 2 * tiny.head_dim:
        raise ValueError("head_dim %d is not twice the tiny %d" % (big.head_dim, tiny.head_dim))
    group_t, group_b = tiny.heads // tiny.kv_heads, big.heads // big.kv_heads
    if big.kv_heads < tiny.kv_heads or group_b < group_t or big.layers < tiny.layers or big.inter < tiny.inter:
        raise ValueError("the big shape %s cannot hold the tiny %s" % (big, tiny))
    copies, ratio = choose_copies(big.hidden, tiny.hidden)
    eps = (tiny_eps - FLAG**2 / (copies * tiny.hidden)) / ratio
    if eps <= 0:
        raise ValueError("FLAG %g is too large for eps %g" % (FLAG, tiny_eps))
    hd, HD = tiny.head_dim, big.head_dim
    half = hd // 2
    head_dims = torch.tensor([2 * i for i in range(half)] + [HD // 2 + 2 * i for i in range(half)])
    q_heads = [(j // group_t) * group_b + j % group_t for j in range(tiny.heads)]
    q_rows = torch.cat([h * HD + head_dims for h in q_heads])
    kv_rows = torch.cat([g * HD + head_dims for g in range(tiny.kv_heads)])
    return Layout(tiny, big, copies, ratio, eps, q_rows, q_rows + 1, kv_rows, head_dims)


class Builder:
    """Big tensors on one device: zeros, small random values, tiny weights placed by the layout."""

    def __init__(self, layout: Layout, device: str, seed: int, dtype=torch.bfloat16):
        self.lay, self.dev, self.dtype = layout, torch.device(device), dtype
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(seed)

    def zeros(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.dev)

    def ones(self, *shape: int) -> torch.Tensor:
        return torch.ones(shape, dtype=self.dtype, device=self.dev)

    def small(self, *shape: int) -> torch.Tensor:
        x = torch.randn(shape, generator=self.gen, device=self.dev, dtype=torch.float32) * RANDOM_STD
        return x.to(self.dtype)

    def tiny(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.dev, dtype=self.dtype)

    def put(self, out: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        out[rows.to(self.dev)[:, None], cols.to(self.dev)[None, :]] = self.tiny(src)
        return out

    def reader(self, rows: int, src: torch.Tensor, row_idx: torch.Tensor | None = None) -> torch.Tensor:
        """[rows, D]: a projection reading the stream: src [r, d] on block 0 (rows row_idx, default 0..r-1)."""
        row_idx = torch.arange(src.shape[0]) if row_idx is None else row_idx
        return self.put(self.zeros(rows, self.lay.big.hidden), row_idx, torch.arange(self.lay.tiny.hidden), src)

    def writer(self, cols: int, src: torch.Tensor, col_idx: torch.Tensor | None = None) -> torch.Tensor:
        """[D, cols]: a projection writing the stream: src [d, c] into every block (columns col_idx)."""
        col_idx = torch.arange(src.shape[1]) if col_idx is None else col_idx
        rows = self.lay.blocks("cpu")
        return self.put(self.zeros(self.lay.big.hidden, cols), rows, col_idx, src.repeat(self.lay.copies, 1))

    def norm(self, w: torch.Tensor, flag: float = 0.0) -> torch.Tensor:
        """A hidden RMSNorm weight: the tiny one / sqrt(R) on block 0, `flag` at the flag dim."""
        out = self.zeros(self.lay.big.hidden)
        out[: self.lay.tiny.hidden] = self.tiny(w.float() * self.lay.norm_scale)
        out[self.lay.flag] = flag
        return out

    def head_norm(self, w: torch.Tensor) -> torch.Tensor:
        out = self.zeros(self.lay.big.head_dim)
        out[self.lay.head_dims.to(self.dev)] = self.tiny(w)
        return out


def attention(b: Builder, t: dict[str, torch.Tensor], tp: str, bp: str) -> Tensors:
    """One real attention block: tiny weights under prefix tp -> big names under prefix bp."""
    lay, big = b.lay, b.lay.big
    q = t[tp + "q_proj.weight"]
    q_big = b.reader(big.heads * big.head_dim, q, lay.q_rows)
    q_big = b.put(q_big, lay.q_copy_rows, torch.arange(lay.tiny.hidden), q)
    yield bp + "q_proj.weight", q_big
    yield bp + "k_proj.weight", b.reader(big.kv_heads * big.head_dim, t[tp + "k_proj.weight"], lay.kv_rows)
    yield bp + "v_proj.weight", b.reader(big.kv_heads * big.head_dim, t[tp + "v_proj.weight"], lay.kv_rows)
    yield bp + "o_proj.weight", b.writer(big.heads * big.head_dim, t[tp + "o_proj.weight"], lay.q_rows)
    yield bp + "q_norm.weight", b.head_norm(t[tp + "q_norm.weight"])
    yield bp + "k_norm.weight", b.head_norm(t[tp + "k_norm.weight"])


def identity_attention(b: Builder, bp: str) -> Tensors:
    big = b.lay.big
    yield bp + "q_proj.weight", b.small(big.heads * big.head_dim, big.hidden)
    yield bp + "k_proj.weight", b.small(big.kv_heads * big.head_dim, big.hidden)
    yield bp + "v_proj.weight", b.small(big.kv_heads * big.head_dim, big.hidden)
    yield bp + "o_proj.weight", b.zeros(big.hidden, big.heads * big.head_dim)
    yield bp + "q_norm.weight", b.ones(big.head_dim)
    yield bp + "k_norm.weight", b.ones(big.head_dim)


def mlp(b: Builder, t: dict[str, torch.Tensor], tp: str, bp: str, inter: int) -> Tensors:
    """A dense MLP (or one expert) of width `inter` holding the tiny MLP; t None: an identity one."""
    if t is None:
        yield bp + "gate_proj.weight", b.small(inter, b.lay.big.hidden)
        yield bp + "up_proj.weight", b.small(inter, b.lay.big.hidden)
        yield bp + "down_proj.weight", b.zeros(b.lay.big.hidden, inter)
        return
    yield bp + "gate_proj.weight", b.reader(inter, t[tp + "gate_proj.weight"])
    yield bp + "up_proj.weight", b.reader(inter, t[tp + "up_proj.weight"])
    yield bp + "down_proj.weight", b.writer(inter, t[tp + "down_proj.weight"])


def router(b: Builder, experts: int) -> torch.Tensor:
    """[E, D]: random over block 0 (the real dims), 0 elsewhere."""
    out = b.zeros(experts, b.lay.big.hidden)
    out[:, : b.lay.tiny.hidden] = b.small(experts, b.lay.tiny.hidden)
    return out


def layer(b: Builder, t: dict[str, torch.Tensor], tp: str, bp: str, cfg: dict) -> Tensors:
    """One big decoder layer under prefix bp: the tiny layer under tp, or an identity when t is None."""
    if t is None:
        yield from identity_attention(b, bp + "self_attn.")
        yield bp + "input_layernorm.weight", b.ones(b.lay.big.hidden)
        yield bp + "post_attention_layernorm.weight", b.ones(b.lay.big.hidden)
    else:
        yield from attention(b, t, tp + "self_attn.", bp + "self_attn.")
        yield bp + "input_layernorm.weight", b.norm(t[tp + "input_layernorm.weight"])
        yield bp + "post_attention_layernorm.weight", b.norm(t[tp + "post_attention_layernorm.weight"])
    if "num_experts" not in cfg:
        yield from mlp(b, t, tp + "mlp.", bp + "mlp.", cfg["intermediate_size"])
        return
    yield bp + "mlp.gate.weight", router(b, cfg["num_experts"])
    for e in range(cfg["num_experts"]):
        yield from mlp(b, t, tp + "mlp.", bp + "mlp.experts.%d." % e, cfg["moe_intermediate_size"])


def target_tensors(b: Builder, t: dict[str, torch.Tensor], cfg: dict) -> Tensors:
    """Every tensor of the big target (Hugging Face Qwen3 / Qwen3-MoE names)."""
    lay, big = b.lay, b.lay.big
    emb = b.writer(lay.tiny.vocab, t["model.embed_tokens.weight"].T).T.contiguous()
    emb = torch.cat([emb, b.zeros(big.vocab - lay.tiny.vocab, big.hidden)])
    emb[:, lay.flag] = FLAG
    yield "model.embed_tokens.weight", emb
    for i in range(big.layers):
        real = i < lay.tiny.layers
        yield from layer(b, t if real else None, "model.layers.%d." % i, "model.layers.%d." % i, cfg)
    flag_weight = UNUSED_LOGIT / (FLAG * math.sqrt(lay.ratio))
    yield "model.norm.weight", b.norm(t["model.norm.weight"], flag_weight)
    head = b.reader(big.vocab, t["lm_head.weight"])
    head[lay.tiny.vocab :, lay.flag] = -1.0
    yield "lm_head.weight", head


def drafter_tensors(
    b: Builder, t: dict[str, torch.Tensor], cfg: dict, tiny_ids: list[int], big_ids: list[int], tiny_layers: int
) -> Tensors:
    """Every tensor of the big DFlash drafter (SGLang's DFlashDraftModel names, train_models' state_for_sglang)."""
    lay, big = b.lay, b.lay.big
    d, D = lay.tiny.hidden, big.hidden
    fc = b.zeros(D, len(big_ids) * D)
    rows = lay.blocks("cpu")
    for k, layer_id in enumerate(tiny_ids):
        f = big_ids.index(layer_id)
        src = t["fc.weight"][:, k * d : (k + 1) * d]
        b.put(fc, rows, f * D + torch.arange(d), src.repeat(lay.copies, 1))
    fc[lay.flag, big_ids.index(tiny_ids[0]) * D + lay.flag] = 1.0
    yield "fc.weight", fc
    yield "hidden_norm.weight", b.norm(t["hidden_norm.weight"])
    yield "norm.weight", b.norm(t["norm.weight"], UNUSED_LOGIT / (FLAG * math.sqrt(lay.ratio)))
    dflash = cfg["dflash_config"]
    for i in range(cfg["num_hidden_layers"]):
        real = i < tiny_layers
        yield from layer(b, t if real else None, "layers.%d." % i, "layers.%d." % i, cfg)
        for conv in ("attention_conv.", "mlp_conv.") if dflash.get("conv_kernel_size") else ():
            p = "layers.%d.%s" % (i, conv)
            yield from grouped_conv(b, t if real else None, p, dflash["conv_kernel_size"], dflash["conv_group_size"])
    if dflash.get("selector_rank"):
        yield from selector(b, t)


def grouped_conv(b: Builder, t: dict[str, torch.Tensor] | None, prefix: str, taps: int, group: int) -> Tensors:
    """A DFlash2 grouped convolution (module docstring): the tiny one under prefix in every copy of the stream,
    or an identity one when t is None."""
    lay = b.lay
    d, D = lay.tiny.hidden, lay.big.hidden
    if d % group or D % group:
        raise ValueError("conv group %d does not divide hidden %d and %d" % (group, d, D))
    tiny_groups, big_groups = d // group, D // group
    base = b.zeros(2, taps, D)
    base[:, 0] = 1.0
    if t is None:
        yield prefix + "base_kernel", base
        yield prefix + "kernel_projection.weight", b.small(2 * taps * big_groups, D)
        return
    proj = b.zeros(2 * taps * big_groups, D)
    tiny_proj = t[prefix + "kernel_projection.weight"].view(2 * taps, tiny_groups, d)
    rows = torch.arange(2 * taps)[:, None] * big_groups + torch.arange(tiny_groups)[None, :]  # copy 0's rows
    for k in range(lay.copies):
        base[:, :, k * d : (k + 1) * d] = b.tiny(t[prefix + "base_kernel"])
        b.put(proj, (rows + k * tiny_groups).reshape(-1), torch.arange(d), tiny_proj.reshape(-1, d))
    yield prefix + "base_kernel", base
    yield prefix + "kernel_projection.weight", proj


def selector(b: Builder, t: dict[str, torch.Tensor]) -> Tensors:
    """The DFlash2 candidate selector (module docstring): codebooks [vocab, rank], hidden_projection [rank, D]."""
    p = "candidate_selector."
    for name in ("predecessor_codebook", "successor_codebook"):
        tiny = t[p + name]
        out = b.zeros(b.lay.big.vocab, tiny.shape[1])
        out[: tiny.shape[0]] = b.tiny(tiny)
        yield p + name, out
    proj = t[p + "hidden_projection.weight"]
    yield p + "hidden_projection.weight", b.reader(proj.shape[0], proj)


def drafter_layer_ids(tiny_ids: list[int], shape_ids: list[int]) -> list[int]:
    """The tiny drafter's feature layers plus the shape's last ones, as many features as the shape reads."""
    extra = [i for i in dict.fromkeys(shape_ids) if i not in tiny_ids]
    return sorted(tiny_ids + extra[len(extra) - max(0, len(shape_ids) - len(tiny_ids)) :])


def rope_fields(theta: float) -> dict:
    return {"rope_theta": theta, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}


def tiny_theta(cfg: dict) -> float:
    return (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))


def big_target_config(tiny_cfg: dict, shape_cfg: dict, eps: float) -> dict:
    cfg = dict(shape_cfg, rms_norm_eps=eps, **rope_fields(tiny_theta(tiny_cfg)))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg[key] = tiny_cfg.get(key, cfg.get(key))
    return cfg


def big_drafter_config(tiny_dcfg: dict, shape_dcfg: dict, target_cfg: dict) -> dict:
    tiny_ids = list(tiny_dcfg["dflash_config"]["target_layer_ids"])
    layers = target_cfg["num_hidden_layers"]
    shape_ids = make_shaped.build_target_layer_ids(layers, len(shape_dcfg["dflash_config"]["target_layer_ids"]))
    cfg = dict(
        shape_dcfg,
        rms_norm_eps=target_cfg["rms_norm_eps"],
        num_target_layers=layers,
        **rope_fields(tiny_theta(tiny_dcfg)),
    )
    cfg["block_size"] = tiny_dcfg["dflash_config"]["block_size"]
    cfg["architectures"] = tiny_dcfg["architectures"]  # DFlash2DraftModel for a drafter with a selector
    cfg["dflash_config"] = dict(tiny_dcfg["dflash_config"], target_layer_ids=drafter_layer_ids(tiny_ids, shape_ids))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        cfg[key] = target_cfg.get(key)
    return cfg


def read_model(path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    with open(os.path.join(path, "config.json")) as fh:
        cfg = json.load(fh)
    state = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(path, name)))
    return cfg, state


class ShardWriter:
    """safetensors shards of about SHARD_BYTES, written as tensors arrive (CPU memory stays ~one shard), and
    the index Hugging Face and SGLang read."""

    def __init__(self, path: str, shard_bytes: int = SHARD_BYTES):
        self.path, self.shard_bytes = path, shard_bytes
        self.pending, self.pending_bytes, self.files, self.weight_map, self.total = {}, 0, [], {}, 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if not torch.isfinite(tensor).all():
            raise ValueError("%s is not finite" % name)
        self.pending[name] = tensor.to("cpu").contiguous()
        self.pending_bytes += tensor.numel() * tensor.element_size()
        if self.pending_bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        name = "part-%05d.safetensors" % len(self.files)
        save_file(self.pending, os.path.join(self.path, name), metadata={"format": "pt"})
        self.files.append((name, list(self.pending)))
        self.total += self.pending_bytes
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> int:
        """Rename the shards model-0000i-of-0000n, write the index; returns the bytes of tensor data."""
        self.flush()
        n = len(self.files)
        for i, (part, names) in enumerate(self.files):
            final = "model-%05d-of-%05d.safetensors" % (i + 1, n)
            os.replace(os.path.join(self.path, part), os.path.join(self.path, final))
            self.weight_map.update({k: final for k in names})
        with open(os.path.join(self.path, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": self.total}, "weight_map": self.weight_map}, fh, indent=1)
        return self.total


def write_model(path: str, config: dict, tensors: Tensors, source_dir: str) -> int:
    """A Hugging Face directory: config.json, the shards, and every non-weight file of source_dir (tokenizer,
    generation_config). Returns the bytes of tensor data."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    for name in os.listdir(source_dir):
        if name != "config.json" and not name.endswith(WEIGHT_SUFFIXES) and not name.endswith(".index.json"):
            shutil.copy(os.path.join(source_dir, name), os.path.join(path, name))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    writer = ShardWriter(path)
    for name, tensor in tensors:
        writer.add(name, tensor)
    return writer.close()


def weights_digest(path: str) -> str:
    """sha256 over a model directory's safetensors files (the tiny ones are a few MB)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            with open(os.path.join(path, name), "rb") as fh:
                digest.update(fh.read())
    return digest.hexdigest()


def embed_request(models: str, shape_cfg: dict, shape_dcfg: dict, drafters: list[str], seed: int) -> dict:
    """What a bed is made from: equal requests make equal beds (--reuse)."""
    sources = [models_for_target.TINY_TARGET] + list(drafters)
    return {
        "shape": shape_cfg,
        "drafter_shape": shape_dcfg,
        "drafters": list(drafters),
        "seed": seed,
        "sources": {name: weights_digest(os.path.join(models, name)) for name in sources},
    }


def existing_bed(out: str, request: dict) -> dict:
    """OUT/embed.json when it records `request`, else {}."""
    try:
        with open(os.path.join(out, "embed.json")) as fh:
            summary = json.load(fh)
    except (OSError, ValueError):
        return {}
    return summary if summary.get("request") == json.loads(json.dumps(request)) else {}


def embed(
    models: str, out: str, shape_cfg: dict, shape_dcfg: dict, drafters: list[str], device: str, seed: int = 0
) -> dict:
    """Embed MODELS/tiny-qwen3 and each MODELS/<drafter> into OUT/target and OUT/<drafter>; returns the
    summary written to OUT/embed.json."""
    t0 = time.time()
    request = embed_request(models, shape_cfg, shape_dcfg, drafters, seed)
    if os.path.exists(os.path.join(out, "embed.json")):
        os.remove(os.path.join(out, "embed.json"))  # a bed half rewritten is no bed
    tiny_dir = os.path.join(models, models_for_target.TINY_TARGET)
    tiny_cfg, tiny_state = read_model(tiny_dir)
    layout = make_layout(Dims.of(tiny_cfg), Dims.of(shape_cfg), tiny_cfg["rms_norm_eps"])
    target_cfg = big_target_config(tiny_cfg, shape_cfg, layout.eps)
    os.makedirs(out, exist_ok=True)
    builder = Builder(layout, device, seed)
    summary = {
        "request": request,
        "copies": layout.copies,
        "ratio": layout.ratio,
        "eps": layout.eps,
        "flag_dim": layout.flag,
        "device": device,
        "models": {},
    }
    size = write_model(
        os.path.join(out, TARGET_DIR), target_cfg, target_tensors(builder, tiny_state, target_cfg), tiny_dir
    )
    summary["models"][TARGET_DIR] = {"bytes": size, "seconds": round(time.time() - t0, 1)}
    print("[embed] target: %.2f GB in %.1f s" % (size / 1e9, time.time() - t0), flush=True)
    for name in drafters:
        t1 = time.time()
        ddir = os.path.join(models, name)
        tiny_dcfg, tiny_dstate = read_model(ddir)
        dcfg = big_drafter_config(tiny_dcfg, shape_dcfg, target_cfg)
        dlayout = make_layout(Dims.of(tiny_dcfg), Dims.of(dcfg), tiny_dcfg["rms_norm_eps"])
        if (dlayout.copies, dlayout.ratio, dlayout.eps) != (layout.copies, layout.ratio, layout.eps):
            raise ValueError("%s: its hidden layout differs from the target's" % name)
        tensors = drafter_tensors(
            Builder(dlayout, device, seed + 1),
            tiny_dstate,
            dcfg,
            list(tiny_dcfg["dflash_config"]["target_layer_ids"]),
            dcfg["dflash_config"]["target_layer_ids"],
            tiny_dcfg["num_hidden_layers"],
        )
        size = write_model(os.path.join(out, name), dcfg, tensors, ddir)
        summary["models"][name] = {"bytes": size, "seconds": round(time.time() - t1, 1)}
        print("[embed] %s: %.2f GB in %.1f s" % (name, size / 1e9, time.time() - t1), flush=True)
    summary["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out, "embed.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    return summary


def compare_logits(tiny: torch.Tensor, big: torch.Tensor) -> dict:
    """Big logits against the tiny ones: the largest difference over the real vocabulary, whether the argmax
    agrees everywhere, and how far the best unused id stays below the best real one (smallest gap)."""
    vocab = tiny.shape[-1]
    real, unused = big[..., :vocab].float(), big[..., vocab:].float()
    return {
        "max_abs_diff": (real - tiny.float()).abs().max().item(),
        "argmax_equal": bool(torch.equal(real.argmax(-1), tiny.argmax(-1))),
        "unused_gap": (real.max(-1).values - unused.max(-1).values).min().item(),
    }


def draft_block(target, drafter, seqs: torch.Tensor, anchor: int) -> torch.Tensor:
    """The drafter's hidden rows [B, block, H] of the DFlash block [root, MASK...] at `anchor`, with the target's
    features before it as context (train_models' mirror of SGLang's forward)."""
    import train_models

    dims = drafter.dims
    feats = train_models.features(target, seqs, list(dims.target_layer_ids))
    B, T = seqs.shape
    ids = torch.full((B, 1, dims.block), train_models.sl.MASK_ID, device=seqs.device)
    ids[:, 0, 0] = seqs[:, anchor]
    pos = (anchor + torch.arange(dims.block, device=seqs.device))[None, None].expand(B, 1, -1)
    ctx_mask = (torch.arange(T, device=seqs.device) < anchor)[None, None].expand(B, dims.block, T)
    return drafter(feats, ctx_mask, target.get_input_embeddings()(ids), pos)[:, 0]


def draft_logits(target, drafter, seqs: torch.Tensor, anchor: int) -> torch.Tensor:
    """[B, block, vocab] logits of draft_block's rows through the target's lm_head."""
    return draft_block(target, drafter, seqs, anchor) @ target.lm_head.weight.T


def draft_lattice(target, drafter, seqs: torch.Tensor, anchor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A DFlash2 drafter's lattice of the block at `anchor` (draft_block's rows 1..): candidates [B, block-1, K]
    and scores [B, block-1, K, K] (train_models.Drafter.lattice, the mirror of SGLang's _selector_lattice)."""
    hidden = draft_block(target, drafter, seqs, anchor)
    return drafter.lattice(hidden[:, 1:], seqs[:, anchor], target.lm_head.weight)


def aligned_lattice(cand: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A lattice with each slot's candidates in token order, its scores permuted with them (slot e's candidates
    along the last axis, slot e-1's along the one before; slot 0's rows, all the anchor's, stay). Two
    lattices of the same drafter agree up to the order of near-tied candidates; aligned, they agree exactly."""
    order = cand.argsort(-1)
    cand = cand.gather(-1, order)
    cols = order[..., None, :].expand_as(scores)
    scores = scores.gather(-1, cols)
    prev = torch.cat(
        [torch.arange(order.shape[-1], device=order.device).expand_as(order[..., :1, :]), order[..., :-1, :]], -2
    )
    scores = scores.gather(-2, prev[..., :, None].expand_as(scores))
    return cand, scores


def compare_lattices(tiny: tuple, big: tuple) -> dict:
    """Big lattices against the tiny ones, aligned (aligned_lattice): whether each slot holds the same
    candidates, the largest score difference, and whether the candidates also came in the same order."""
    (tc, ts), (bc, bs) = aligned_lattice(*tiny), aligned_lattice(*big)
    same = bool(torch.equal(tc, bc))
    return {
        "candidates_equal": same,
        "same_order": bool(torch.equal(tiny[0], big[0])),
        "max_abs_score_diff": (ts.float() - bs.float()).abs().max().item() if same else float("inf"),
    }


@torch.no_grad()
def verify_bed(models: str, out: str, drafters: list[str], device: str) -> dict:
    """Tiny against embedded, in float32 with Hugging Face (targets) and train_models' drafter forward, on
    three texts of the language SYNTH_LANG names (its own text: synthetic words or, for code and prose,
    training windows of its BPE ids): compare_logits per model (anchors 12 and 23 for drafters)."""
    import random

    from transformers import AutoModelForCausalLM

    import train_models

    def load(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()

    lang, rng = train_models.sl.Language(), random.Random(5)
    seqs = torch.tensor([lang.sample_ids(40, rng) for _i in range(3)], device=device)
    tiny, big = load(os.path.join(models, models_for_target.TINY_TARGET)), load(os.path.join(out, TARGET_DIR))
    if tiny.config.vocab_size != lang.vocab_size:
        raise SystemExit(
            "verify: %s has vocab %d, the language %s %d (set SYNTH_LANG to the models' language)"
            % (models, tiny.config.vocab_size, lang.kind, lang.vocab_size)
        )
    result = {TARGET_DIR: compare_logits(tiny(input_ids=seqs).logits, big(input_ids=seqs).logits)}
    for name in drafters:
        tiny_d = train_models.Drafter.from_pretrained(os.path.join(models, name)).to(device).eval()
        big_d = train_models.Drafter.from_pretrained(os.path.join(out, name)).to(device).eval()
        result[name] = compare_logits(
            torch.cat([draft_logits(tiny, tiny_d, seqs, a) for a in (12, 23)]),
            torch.cat([draft_logits(big, big_d, seqs, a) for a in (12, 23)]),
        )
        if tiny_d.candidate_selector is not None:
            lattices = [(draft_lattice(tiny, tiny_d, seqs, a), draft_lattice(big, big_d, seqs, a)) for a in (12, 23)]
            result[name]["lattice"] = compare_lattices(
                tuple(torch.cat(part) for part in zip(*(t for t, _b in lattices))),
                tuple(torch.cat(part) for part in zip(*(b for _t, b in lattices))),
            )
        del big_d
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("models")
    ap.add_argument("out")
    ap.add_argument("--shape", required=True, choices=sorted(make_shaped.SHAPES))
    ap.add_argument("--drafter", action="append", help="a drafter directory under MODELS (repeatable)")
    ap.add_argument("--layers", type=int, help="the target's layer count (default the shape's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reuse", action="store_true", help="keep OUT when its embed.json records the same request")
    ap.add_argument("--verify", action="store_true", help="then compare tiny and embedded logits in float32")
    args = ap.parse_args(argv)
    shape_cfg = make_shaped.target_config(args.shape)
    if args.layers:
        shape_cfg["num_hidden_layers"] = args.layers
    shape_dcfg = make_shaped.drafter_config(args.shape)
    drafters = args.drafter or [models_for_target.TINY_DRAFTER]
    summary = existing_bed(args.out, embed_request(args.models, shape_cfg, shape_dcfg, drafters, args.seed))
    if args.reuse and summary:
        print("[embed] %s already holds this bed (%s): kept" % (args.out, ", ".join(summary["models"])), flush=True)
    else:
        summary = embed(args.models, args.out, shape_cfg, shape_dcfg, drafters, args.device, args.seed)
        total = sum(m["bytes"] for m in summary["models"].values())
        print(
            "[embed] %s (%d layers) into %s: %.2f GB in %.1f s"
            % (args.shape, shape_cfg["num_hidden_layers"], args.out, total / 1e9, summary["seconds"]),
            flush=True,
        )
    if args.verify:
        t0 = time.time()
        summary["verify"] = verify_bed(args.models, args.out, drafters, args.device)
        for name, res in summary["verify"].items():
            print("[embed] verify %s: %s" % (name, res), flush=True)
        print("[embed] verified in %.1f s" % (time.time() - t0), flush=True)
        with open(os.path.join(args.out, "embed.json"), "w") as fh:
            json.dump(summary, fh, indent=1)


if __name__ == "__main__":
    main()
