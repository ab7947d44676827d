"""Train, on the device, a tiny Qwen3 target on the language SYNTH_LANG names (synth_lang.Language(): the
branching synthetic `phrases`/`pairs`, or the real-text `code`/`prose` of corpus_lang.py) and a
DFlash drafter for it in the layout SGLang 0.5.23 loads (DFlashDraftModel, dflash_config.target_layer_ids,
mask_token_id, block 16), on the target's own hidden states and greedy continuations.

Usage: python train_models.py OUTDIR [--quick]   (writes OUTDIR/tiny-qwen3, OUTDIR/tiny-qwen3-dflash and
OUTDIR/train.json with the losses and the offline DFlash acceptance length on held-out prompts).
Seeded; on one GPU of the device it takes about two minutes. --quick is a CPU smoke test of the code paths.

       python train_models.py OUTDIR --drafter-only NAME STOP_AT
   keeps OUTDIR/tiny-qwen3 (the target trained before) and trains a drafter into OUTDIR/NAME, stopping at
   the first check (every 25 steps from step 50) whose offline acceptance length on 16 held-out prompts
   reaches STOP_AT: a drafter less sure of itself than the full run's (acceptance 13.5 of 16), as real
   DFlash drafters on real models are (acceptance about 4-8), where a tree has siblings worth verifying.
   Writes OUTDIR/train-NAME.json.

       python train_models.py OUTDIR --drafter-levels NAME1:4.5,NAME2:8.5
   keeps OUTDIR/tiny-qwen3 and trains ONE drafter, saving a snapshot into OUTDIR/NAMEi the first time its
   offline acceptance (16 held-out prompts; checked every step from 25 to 100, then every 25) reaches
   each threshold, and stops at the last: drafters at several acceptance levels from one run (and the
   target first when OUTDIR has none). Each level also records the offline acceptance of DDTrees of
   TREE_BUDGETS nodes from that drafter (the overlay's tree builder, along the target's greedy text). In-server
   acceptance is lower than offline (offline 6.08 served 4.5, offline 13.5 served 12.75). Writes
   OUTDIR/train-levels.json (per level: the step and the offline acceptance that saved it).

       python train_models.py OUTDIR --dflash2 NAME[:STOP_AT]
   keeps OUTDIR/tiny-qwen3 (trains it first when OUTDIR has none) and trains a DFlash2 drafter into OUTDIR/NAME
   (SGLang's DFlash2DraftModel: the backbone above with a grouped dynamic convolution around each attention
   and MLP, DFLASH2_CONV_TAPS taps over groups of DFLASH2_CONV_GROUP channels, and a candidate selector of
   rank DFLASH2_RANK over the DFLASH2_TOP_K candidates of each slot), until TRAIN_LIMIT_S or, with STOP_AT,
   the first check (as --drafter-only's) whose offline acceptance of the selector's greedy path reaches
   STOP_AT. The backbone trains as the DFlash drafter does; the selector on its detached rows
   (selector_loss). Writes OUTDIR/train-NAME.json with the offline acceptance of the selector's path, of the
   marginals' chain and of DDTrees over the marginals (offline_report).

The drafter's forward below mirrors sglang/srt/models/dflash.py and the DFlash worker: context K/V come
from fc(concat(target hidden states after layers target_layer_ids)) -> hidden_norm -> each layer's
k/v projections (no input norm) -> k_norm -> RoPE at the context positions; the block [root, MASK x 15]
sits at positions p..p+15, embedded with the target's embedding, and attends (non-causally) to the
context and to the whole block; row i (1..15) predicts the token at position p+i through the drafter's
final norm and the target's lm_head. A DFlash2 drafter's selector scores, for the rows 1..15 (slots 0..14),
the K x K transitions from each candidate of the slot before (slot 0: the block's root, the anchor) to each
of its own candidates, the top-K of the target's lm_head over the row (Drafter.lattice); DFLASH walks the
greedy path through them (lattice_walk).

Real text (SYNTH_LANG=code|prose): the target's vocab is the language's (4096, byte-level BPE), its other
dimensions the same; it trains on random windows of the training split (TARGET_STEPS, default 3000 for
real text); the drafter trains on the target's greedy continuations of training-split windows, and the
offline acceptance is measured on held-out prompts (encoded with the language's tokenizer, as the server
does). The saved models carry the language's tokenizer.
"""

import dataclasses
import functools
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the overlay's framework-free core (the tree the offline acceptance of a DDTree simulates)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sglang_overlay", "src"))
import carry_models  # noqa: E402
import synth_lang as sl  # noqa: E402

H, L, NH, NKV, HD, INTER = 256, 4, 4, 2, 64, 768
DL, BLOCK, TARGET_LAYERS = 2, 16, [1, 2]
ROPE_THETA, EPS = 10000.0, 1e-6
# The drafter's training stops after this many seconds (TRAIN_LIMIT_S): inside a device call's limit; a CPU
# run that trains a drafter level to keep with the evidence needs longer.
TIME_LIMIT_S = float(os.environ.get("TRAIN_LIMIT_S", "200"))
# TRAIN_CARRY=1: every model saved is snapped first (carry_models.py), so that a later device call can carry it
# packed and unpack the very weights trained on; a drafter level keeps the offline acceptance measured before
# its snap. DRAFTER_RESUME=DIR: the drafter levels' training starts from the drafter saved in DIR (a carried
# drafter-last) instead of from scratch, at a quarter of the learning rate.
CARRY = os.environ.get("TRAIN_CARRY", "") == "1"
RESUME = os.environ.get("DRAFTER_RESUME", "")
# The drafter's sequences per training step (DRAFTER_BATCH, 8 blocks each): a time-limited run on a GPU, where
# a step of the tiny drafter is mostly fixed cost, sees more data a second at a larger batch.
DRAFTER_BATCH = int(os.environ.get("DRAFTER_BATCH", "64"))
# The drafter's training data: the target's greedy continuations of DRAFTER_DATA training prompts per prompt
# length (six lengths). A drafter that trains for many epochs over too few of them learns those continuations
# and no more: its training loss falls while its held-out acceptance stays flat.
DRAFTER_DATA = int(os.environ.get("DRAFTER_DATA", "1024"))
# The target's training steps (TARGET_STEPS): `pairs` has a successor order per pair of phrases to learn;
# real text (code, prose) defaults to CORPUS_TARGET_STEPS.
TARGET_STEPS = int(os.environ.get("TARGET_STEPS", "1500"))
CORPUS_TARGET_STEPS = 3000
# Real-text targets stop early (train_target): held-out loss every TARGET_CHECK_EVERY steps, TARGET_PATIENCE
# checks without a new best end training.
TARGET_CHECK_EVERY = 50
TARGET_PATIENCE = 3
# The DDTree budgets whose offline acceptance a saved drafter level reports beside DFLASH's chain.
TREE_BUDGETS = (15, 63, 127)
# --dflash2: the grouped convolution's taps and channels per group (8 groups of the 256-wide stream), the
# candidate selector's rank and the candidates per slot it scores.
DFLASH2_CONV_TAPS, DFLASH2_CONV_GROUP = 4, 32
DFLASH2_RANK, DFLASH2_TOP_K = 32, 8


@dataclass(frozen=True)
class DraftDims:
    """The shape of a DFlash drafter (and of the target features it reads)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    block: int
    target_layer_ids: tuple
    eps: float
    theta: float
    # DFlash2 (SGLang's DFlash2DraftModel): 0 where the drafter has no grouped convolution / no selector
    conv_taps: int = 0
    conv_group: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    vocab: int = 0  # the selector's codebook rows (the target's vocabulary)
    output_multiplier: float = 1.0  # dflash_config's transform of the selector's unary logits
    softcap: float = 0.0


TINY_DRAFT = DraftDims(H, NH, NKV, HD, INTER, DL, BLOCK, tuple(TARGET_LAYERS), EPS, ROPE_THETA)


def dflash2_dims(vocab: int) -> DraftDims:
    """The tiny DFlash2 drafter: TINY_DRAFT's backbone with the grouped convolution and the selector."""
    return dataclasses.replace(
        TINY_DRAFT,
        conv_taps=DFLASH2_CONV_TAPS,
        conv_group=DFLASH2_CONV_GROUP,
        selector_rank=DFLASH2_RANK,
        selector_top_k=DFLASH2_TOP_K,
        vocab=vocab,
    )


def draft_dims_from_config(cfg: dict) -> DraftDims:
    """DraftDims of a DFlashDraftModel / DFlash2DraftModel config.json (the layout SGLang loads; SGLang's
    parse_dflash_draft_config reads the same dflash_config fields)."""
    rope = cfg.get("rope_parameters") or {}
    dflash = cfg["dflash_config"]
    return DraftDims(
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
        cfg["intermediate_size"],
        cfg["num_hidden_layers"],
        cfg["dflash_config"]["block_size"],
        tuple(cfg["dflash_config"]["target_layer_ids"]),
        cfg["rms_norm_eps"],
        rope.get("rope_theta", cfg.get("rope_theta", ROPE_THETA)),
        dflash.get("conv_kernel_size", 0),
        dflash.get("conv_group_size", 0),
        dflash.get("selector_rank", 0),
        dflash.get("selector_top_k", 0),
        cfg["vocab_size"],
        float(dflash.get("output_multiplier", 1.0)),
        float(dflash.get("final_logit_softcapping") or 0.0),
    )


def make_tokenizer(path, lang=None):
    """The language's tokenizer saved into path (the synthetic kinds: synth_lang's word-level one)."""
    return (lang or sl.Language()).save_tokenizer(path)


def target_steps(lang) -> int:
    """TARGET_STEPS when set, else 1500 for the synthetic kinds and CORPUS_TARGET_STEPS for real text."""
    if "TARGET_STEPS" in os.environ or lang.kind in sl.SYNTH_KINDS:
        return TARGET_STEPS
    return CORPUS_TARGET_STEPS


def target_config(vocab_size=sl.VOCAB):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=H,
        intermediate_size=INTER,
        num_hidden_layers=L,
        num_attention_heads=NH,
        num_key_value_heads=NKV,
        head_dim=HD,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        rms_norm_eps=EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        dtype="bfloat16",
    )


@torch.no_grad()
def target_boundary_accuracy(target, lang, dev, n=64, words=128, seed=13):
    """How often the target's argmax at a phrase boundary (with the phrase before known) is the language's
    most likely successor there: for `pairs`, whether the target reads the phrase before the current one."""
    rng = random.Random(seed)
    hits = total = 0
    for _i in range(n):
        ws, where = lang.sample_words(words, rng)
        ids = torch.tensor([[len(sl.SPECIALS) + w for w in ws]], device=dev)
        pred = target(input_ids=ids).logits[0].argmax(-1).tolist()
        for here, prev, cur in lang.pair_boundaries(where):
            want = lang.phrases[lang.successors(cur, prev)[0]][0]
            hits += int(pred[here - 1] == len(sl.SPECIALS) + want)
            total += 1
    return hits / max(1, total)


@torch.no_grad()
def held_out_loss(target, lang, dev, n=16, tokens=256, seed=13) -> float:
    """The target's mean next-token loss on n held-out windows (real-text kinds)."""
    rng = random.Random(seed)
    windows = [lang.held_out_window(rng, tokens, within_file=False) for _i in range(n)]
    x = torch.tensor(windows, device=dev)
    return float(target(input_ids=x, labels=x).loss)


def lr_at(step, total, peak, warm=100):
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def fit_steps(steps, step, elapsed, limit_s) -> int:
    """The target's total steps after `step` steps took `elapsed` seconds: `steps`, or fewer when they would
    not end within limit_s (the schedule then decays over the new total)."""
    per_step = elapsed / max(1, step)
    return steps if per_step * steps <= limit_s else max(step + 1, int(limit_s / per_step))


def train_target(lang, dev, steps, log, bs=128, seq=128, make_model=None, limit_s=None):
    """The tiny target (make_model(): another architecture, the hybrid's), trained for `steps` (AdamW, cosine
    schedule; with limit_s, fewer when the pace of the first 20 says they would not end within it). On real
    text (a corpus of well under a million tokens, which a 5M-parameter model memorises in a few dozen epochs)
    it also stops early: the held-out loss is measured every TARGET_CHECK_EVERY steps and training ends after
    TARGET_PATIENCE checks without a new best, the best checkpoint restored. A memorising target answers
    held-out prompts with noise no drafter can learn, and every prompt a server is measured with is held out."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(1)
    rng = random.Random(2)
    pool = torch.tensor([lang.sample_ids(seq, rng) for _i in range(max(512, steps * 8))], dtype=torch.long)
    model = (make_model or (lambda: Qwen3ForCausalLM(target_config(lang.vocab_size))))().to(dev).float()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, betas=(0.9, 0.95))
    stopper = None if lang.kind in sl.SYNTH_KINDS else EarlyStop(model, lambda: held_out_loss(model, lang, dev), log)
    loss, t0, step = torch.zeros(()), time.time(), 0
    while step < steps:
        if step == 20 and limit_s:
            steps = fit_steps(steps, step, time.time() - t0, limit_s)
            log("target: %d steps (%.0f ms a step)" % (steps, 1000 * (time.time() - t0) / step))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, 3e-3)
        x = pool[torch.randint(0, pool.shape[0], (bs,))].to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 200 == 0 or step == steps - 1:
            log("target step %d loss %.4f" % (step, loss.item()))
        if stopper is not None and step and step % TARGET_CHECK_EVERY == 0 and stopper.stop(step):
            break
        step += 1
    if stopper is not None:
        stopper.restore()
    return model.train(), float(loss.item())


class EarlyStop:
    """The best checkpoint by held-out loss, and whether TARGET_PATIENCE checks have passed without a new one."""

    def __init__(self, model, measure, log):
        self.model, self.measure, self.log = model, measure, log
        self.best, self.best_step, self.state, self.misses = float("inf"), None, None, 0

    def stop(self, step: int) -> bool:
        self.model.eval()
        loss = self.measure()
        self.model.train()
        if loss < self.best:
            self.best, self.best_step, self.misses = loss, step, 0
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        else:
            self.misses += 1
        self.log("target step %d held-out loss %.4f (best %.4f at step %s)" % (step, loss, self.best, self.best_step))
        return self.misses >= TARGET_PATIENCE

    def restore(self) -> None:
        if self.state is not None:
            self.model.load_state_dict(self.state)
            self.log("target: the checkpoint of step %s (held-out loss %.4f)" % (self.best_step, self.best))


# ---- the DFlash drafter (training-side mirror of SGLang's DFlashDraftModel) -------------------------


def rms(x, w, eps=EPS):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, theta=ROPE_THETA):
    # x [..., T, heads, head_dim], pos [..., T]; neox style (rotate half), as SGLang's get_rope default
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    f = pos.float()[..., None] * inv
    cos = torch.cat([f.cos(), f.cos()], -1)[..., None, :]
    sin = torch.cat([f.sin(), f.sin()], -1)[..., None, :]
    x1, x2 = x.float()[..., : hd // 2], x.float()[..., hd // 2 :]
    rot = torch.cat([-x2, x1], -1)
    return (x.float() * cos + rot * sin).to(x.dtype)


class GroupedConv(torch.nn.Module):
    """SGLang's DFlashGroupedConv: a dynamic depthwise convolution over the positions of one DFlash block,
    wrapped around a sublayer. `prepare` projects the sublayer's (normed) input to per-group tap
    coefficients [2, taps, groups] (side 0 for the input, side 1 for the output), added to base_kernel
    [2, taps, hidden] channel by channel; it convolves the input with side 0 and hands side 1 to `finish`,
    which convolves the sublayer's output. Tap t reads the row t positions earlier in the same block: rows
    before the block's first read 0 (SGLang: the row index modulo block_size must be >= t)."""

    def __init__(self, hidden: int, taps: int, group: int):
        super().__init__()
        if hidden % group:
            raise ValueError("conv group %d does not divide hidden %d" % (group, hidden))
        self.taps, self.group, self.groups = taps, group, hidden // group
        base = torch.zeros(2, taps, hidden)
        base[:, 0] = 1.0
        self.base_kernel = torch.nn.Parameter(base)
        self.kernel_projection = torch.nn.Linear(hidden, 2 * taps * self.groups, bias=False)

    def convolve(self, x, delta, side: int):
        """x [..., block, hidden] (the leading dims one block each), delta [..., block, taps, groups]."""
        blocks = x.unflatten(-1, (self.groups, self.group))
        coef = self.base_kernel[side].view(self.taps, self.groups, self.group) + delta.unsqueeze(-1)
        out = coef[..., 0, :, :] * blocks
        for tap in range(1, self.taps):
            shifted = F.pad(blocks[..., :-tap, :, :], (0, 0, 0, 0, tap, 0))
            out = out + coef[..., tap, :, :] * shifted
        return out.flatten(-2)

    def prepare(self, x):
        coef = self.kernel_projection(x).unflatten(-1, (2, self.taps, self.groups))
        return self.convolve(x, coef[..., 0, :, :], 0), coef[..., 1, :, :]

    def finish(self, x, coef):
        return self.convolve(x, coef, 1)


class CandidateSelector(torch.nn.Module):
    """SGLang's CandidateSelector: scores the transition from a predecessor token p to a candidate c of one
    slot, unary[c] + <A[p] * hidden_projection(h), B[c]>, A the predecessor codebook, B the successor one
    ([vocab, rank] each), h the slot's drafter hidden row."""

    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = torch.nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = torch.nn.Parameter(torch.zeros(vocab, rank))
        self.hidden_projection = torch.nn.Linear(hidden, rank, bias=False)

    def edge_scores(self, unary, cand, pred, hidden):
        """unary, cand [..., K]; pred [..., P] predecessor ids; hidden [..., H] -> scores [..., P, K]."""
        state = self.predecessor_codebook[pred] * self.hidden_projection(hidden).unsqueeze(-2)
        return unary.unsqueeze(-2) + torch.einsum("...pr,...kr->...pk", state, self.successor_codebook[cand])


class Drafter(torch.nn.Module):
    def __init__(self, dims: DraftDims = TINY_DRAFT):
        super().__init__()
        self.dims = d = dims
        h = d.hidden
        self.fc = torch.nn.Linear(len(d.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = torch.nn.Parameter(torch.ones(h))
        self.norm = torch.nn.Parameter(torch.ones(h))
        self.layers = torch.nn.ModuleList()
        for _i in range(d.layers):
            m = torch.nn.Module()
            m.q_proj = torch.nn.Linear(h, d.heads * d.head_dim, bias=False)
            m.k_proj = torch.nn.Linear(h, d.kv_heads * d.head_dim, bias=False)
            m.v_proj = torch.nn.Linear(h, d.kv_heads * d.head_dim, bias=False)
            m.o_proj = torch.nn.Linear(d.heads * d.head_dim, h, bias=False)
            m.q_norm = torch.nn.Parameter(torch.ones(d.head_dim))
            m.k_norm = torch.nn.Parameter(torch.ones(d.head_dim))
            m.input_layernorm = torch.nn.Parameter(torch.ones(h))
            m.post_attention_layernorm = torch.nn.Parameter(torch.ones(h))
            m.gate_proj = torch.nn.Linear(h, d.inter, bias=False)
            m.up_proj = torch.nn.Linear(h, d.inter, bias=False)
            m.down_proj = torch.nn.Linear(d.inter, h, bias=False)
            m.attention_conv = GroupedConv(h, d.conv_taps, d.conv_group) if d.conv_taps else None
            m.mlp_conv = GroupedConv(h, d.conv_taps, d.conv_group) if d.conv_taps else None
            self.layers.append(m)
        self.candidate_selector = (
            CandidateSelector(h, d.vocab, d.selector_rank, d.selector_top_k) if d.selector_rank else None
        )
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    @classmethod
    def from_pretrained(cls, path: str, dtype=torch.float32) -> "Drafter":
        """A drafter directory as SGLang loads it (config.json + model.safetensors, state_for_sglang's names)."""
        from safetensors.torch import load_file

        with open(os.path.join(path, "config.json")) as fh:
            drafter = cls(draft_dims_from_config(json.load(fh)))
        state = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                state.update(load_file(os.path.join(path, name)))
        own = dict(drafter.named_parameters())
        for key, value in state.items():
            own[sglang_to_module_name(key)].data.copy_(value.to(dtype))
        missing = set(own) - {sglang_to_module_name(k) for k in state}
        if missing:
            raise ValueError("%s lacks %s" % (path, sorted(missing)[:4]))
        return drafter.to(dtype)

    def forward(self, feats, ctx_mask, block_emb, block_pos):
        """feats [B, T, K*H] target features; ctx_mask [B, Q, T] bool (query row may see context j);
        block_emb [B, A, block, H]; block_pos [B, A, block]. Returns hidden [B, A, block, H]."""
        B, A, blen, hid = block_emb.shape
        attend = self.attender(feats, ctx_mask, block_pos)
        h = block_emb.float().reshape(B, A * blen, hid)
        for m in self.layers:
            h = self.layer(m, h.view(B, A, blen, hid), functools.partial(attend, m))
        return rms(h, self.norm, self.dims.eps).view(B, A, blen, hid)

    def attender(self, feats, ctx_mask, block_pos):
        """The blocks' attention over the context feats and themselves (forward's arguments): a function of
        (layer, normed block rows [B, A * block, H]) -> the attention's output [B, A * block, H]."""
        B, A, blen = block_pos.shape
        T = feats.shape[1]
        c = rms(self.fc(feats.float()), self.hidden_norm, self.dims.eps)  # [B, T, H]
        ctx_pos = torch.arange(T, device=feats.device).expand(B, T)
        pos = block_pos.reshape(B, A * blen)
        blk = torch.arange(A, device=feats.device).repeat_interleave(blen)
        self_mask = (blk[:, None] == blk[None, :]).expand(B, -1, -1)
        mask = torch.cat([ctx_mask, self_mask], -1)[:, None]  # [B, 1, Q, T+Q]
        return lambda m, x: self.attention(m, x, c, pos, ctx_pos, mask)

    def layer(self, m, h, attend):
        """One decoder layer over the blocks h [B, A, block, H] (the order of SGLang's DFlashDecoderLayer: norm,
        the attention conv's prepare, attention, its finish, residual; the same around the MLP); attend maps
        the normed rows [B, A * block, H] to the attention's output."""
        B, A, blen, hid = h.shape
        x = rms(h, m.input_layernorm, self.dims.eps)
        kernel = None
        if m.attention_conv is not None:
            x, kernel = m.attention_conv.prepare(x)
        o = attend(x.reshape(B, A * blen, hid)).view(B, A, blen, hid)
        if kernel is not None:
            o = m.attention_conv.finish(o, kernel)
        h = h + o
        x = rms(h, m.post_attention_layernorm, self.dims.eps)
        if m.mlp_conv is not None:
            x, kernel = m.mlp_conv.prepare(x)
        y = self.mlp(m, x)
        if m.mlp_conv is not None:
            y = m.mlp_conv.finish(y, kernel)
        return (h + y).reshape(B, A * blen, hid)

    @staticmethod
    def mlp(m, x):
        return m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))

    def attention(self, m, x, c, pos, ctx_pos, mask):
        """The block rows x [B, Q, H] attend to the context's K/V (from c, no input norm) and the block's own."""
        d = self.dims
        B, T = c.shape[:2]
        nh, nkv, hd = d.heads, d.kv_heads, d.head_dim
        q = rope(rms(m.q_proj(x).view(B, -1, nh, hd), m.q_norm, d.eps), pos, d.theta)
        kb = rope(rms(m.k_proj(x).view(B, -1, nkv, hd), m.k_norm, d.eps), pos, d.theta)
        vb = m.v_proj(x).view(B, -1, nkv, hd)
        kc = rope(rms(m.k_proj(c).view(B, T, nkv, hd), m.k_norm, d.eps), ctx_pos, d.theta)
        vc = m.v_proj(c).view(B, T, nkv, hd)
        k = torch.cat([kc, kb], 1).repeat_interleave(nh // nkv, 2)
        v = torch.cat([vc, vb], 1).repeat_interleave(nh // nkv, 2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return m.o_proj(o.transpose(1, 2).reshape(B, -1, nh * hd))

    def transform_unary(self, logits):
        """SGLang's DFlash2DraftModel._transform_unary_logits: float, times output_multiplier, softcapped."""
        logits = logits.float()
        if self.dims.output_multiplier != 1.0:
            logits = logits * self.dims.output_multiplier
        if self.dims.softcap > 0:
            logits = torch.tanh(logits / self.dims.softcap) * self.dims.softcap
        return logits

    def candidates(self, hidden, head):
        """The selector's candidates of each row: the top-K of the target's lm_head (head [vocab, H]) over
        hidden [..., H] -> ids [..., K], transformed unary logits [..., K] (SGLang's compute_candidates)."""
        vals, ids = torch.topk(hidden.float() @ head.float().T, self.candidate_selector.top_k, dim=-1)
        return ids, self.transform_unary(vals)

    def lattice(self, rows, anchor, head):
        """SGLang's _selector_lattice: rows [..., E, H] the block's hidden rows 1.. (after the final norm), anchor
        [...] the block's root token -> candidates [..., E, K] and scores [..., E, K, K], scores[e, p, c] the
        transition from slot e-1's candidate p (slot 0: the anchor, every p alike) to slot e's candidate c."""
        cand, unary = self.candidates(rows, head)
        first = anchor[..., None, None].expand(*cand.shape[:-2], 1, cand.shape[-1])
        pred = torch.cat([first, cand[..., :-1, :]], -2)
        return cand, self.candidate_selector.edge_scores(unary, cand, pred, rows.float())

    def state_for_sglang(self):
        w = {"fc.weight": self.fc.weight, "hidden_norm.weight": self.hidden_norm, "norm.weight": self.norm}
        for i, m in enumerate(self.layers):
            p = "layers.%d." % i
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                w[p + "self_attn.%s.weight" % name] = getattr(m, name).weight
            w[p + "self_attn.q_norm.weight"] = m.q_norm
            w[p + "self_attn.k_norm.weight"] = m.k_norm
            w[p + "input_layernorm.weight"] = m.input_layernorm
            w[p + "post_attention_layernorm.weight"] = m.post_attention_layernorm
            for name in ("gate_proj", "up_proj", "down_proj"):
                w[p + "mlp.%s.weight" % name] = getattr(m, name).weight
            for conv in ("attention_conv", "mlp_conv"):
                if getattr(m, conv) is not None:
                    w[p + conv + ".base_kernel"] = getattr(m, conv).base_kernel
                    w[p + conv + ".kernel_projection.weight"] = getattr(m, conv).kernel_projection.weight
        if self.candidate_selector is not None:
            for name, value in self.candidate_selector.named_parameters():
                w["candidate_selector." + name] = value
        return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in w.items()}


def lattice_walk(cand, scores):
    """The selector's greedy path (SGLang's CandidateSelector.sample_path for a greedy row): slot 0's argmax,
    then each slot's argmax in the row of the candidate chosen before -> tokens [..., E]."""
    index = scores[..., 0, 0, :].argmax(-1)
    path = [index]
    for e in range(1, scores.shape[-3]):
        row = scores[..., e, :, :].gather(-2, index[..., None, None].expand(*index.shape, 1, scores.shape[-1]))
        index = row[..., 0, :].argmax(-1)
        path.append(index)
    return cand.gather(-1, torch.stack(path, -1)[..., None])[..., 0]


def sglang_to_module_name(key: str) -> str:
    """state_for_sglang's name -> the Drafter parameter's name (the inverse of its renaming)."""
    key = key.replace(".self_attn.", ".").replace(".mlp.", ".")
    if key.endswith("norm.weight"):
        key = key[: -len(".weight")]
    return key


@torch.no_grad()
def greedy_continue(target, prompts, n_new, dev):
    """prompts: list of equal-length id lists -> [N, len + n_new] (the target's greedy continuation)."""
    x = torch.tensor(prompts, dtype=torch.long, device=dev)
    out = target.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=n_new,
        do_sample=False,
        min_new_tokens=n_new,
        pad_token_id=0,
        eos_token_id=None,
    )
    return out


@torch.no_grad()
def features(target, seqs, layer_ids=tuple(TARGET_LAYERS)):
    """The drafter's context features: the hidden states after target layers `layer_ids` (HF's
    hidden_states[k + 1], SGLang's capture before layer k + 1), concatenated."""
    hs = target(input_ids=seqs, output_hidden_states=True).hidden_states
    return torch.cat([hs[k + 1] for k in layer_ids], -1)


def make_batch(seqs, feats, starts, embed, A, gen, mask_id=sl.MASK_ID):
    """A anchors per sequence, each in the greedy part: p in [start, T-16]."""
    B, T = seqs.shape
    lo = starts.float()
    u = torch.rand(B, A, generator=gen, device=seqs.device)
    p = (lo[:, None] + u * (T - BLOCK - lo[:, None] + 1)).long().clamp(max=T - BLOCK)
    offs = torch.arange(BLOCK, device=seqs.device)
    pos = p[..., None] + offs  # [B, A, 16]
    labels = torch.gather(seqs[:, None, :].expand(B, A, T), 2, pos)
    ids = torch.full_like(labels, mask_id)
    ids[..., 0] = labels[..., 0]
    ctx_mask = torch.arange(T, device=seqs.device)[None, None, :] < p.repeat_interleave(BLOCK, 1)[..., None]
    return feats, ctx_mask, embed(ids), pos, labels


def simulate_acceptance(drafter, target, embed, head, seqs, starts, dev, budget=None, lattice=False):
    """Greedy speculative steps along the target's greedy sequences: accept length = 1 + the longest prefix
    of the continuation the draft holds. budget None: DFLASH's chain (the leading matches of the block's
    argmax); budget N: a DDTree of N nodes from the block's per-position top-k, built by the overlay's
    core with the top-k the overlay gives that budget. lattice (a DFlash2 drafter, budget None): the chain
    DFLASH drafts with it, the selector's greedy path through its lattice."""
    lens = []
    feats = features(target, seqs)
    with torch.no_grad():
        for b in range(seqs.shape[0]):
            p, T = int(starts[b]), seqs.shape[1]
            while p + BLOCK <= T:
                s = seqs[b : b + 1]
                ids = torch.full((1, 1, BLOCK), sl.MASK_ID, device=dev)
                ids[0, 0, 0] = s[0, p]
                pos = (p + torch.arange(BLOCK, device=dev))[None, None]
                ctx_mask = (torch.arange(T, device=dev) < p)[None, None].expand(1, BLOCK, T)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                    hid = drafter(feats[b : b + 1], ctx_mask, embed(ids), pos)
                truth = s[0, p + 1 : p + BLOCK]
                if lattice and budget is None:
                    tokens = lattice_walk(*drafter.lattice(hid[0, 0, 1:].float(), s[0, p], head))
                    n = int((tokens == truth).int().cumprod(0).sum())
                else:
                    logits = hid[0, 0, 1:].float() @ head.float().T
                    n = chain_accepted(logits, truth) if budget is None else tree_accepted(logits, truth, budget)
                lens.append(n + 1)
                p += n + 1
    return sum(lens) / max(1, len(lens)), lens


def mean_acceptance(drafter, target, embed, head, check, dev, budget=None, lattice=False) -> float:
    """simulate_acceptance's mean over `check`, a list of (greedy sequence [1, T], prompt length)."""
    runs = [
        simulate_acceptance(drafter, target, embed, head, g, torch.tensor([pl]), dev, budget, lattice)[0]
        for g, pl in check
    ]
    return sum(runs) / len(runs)


def held_out_prompts(lang) -> list:
    """The held-out prompts (the ones the servers are measured with) as token id lists, as the server's
    tokenizer reads them."""
    return [lang.encode(p) for p in lang.greedy_prompts()]


def chain_accepted(logits, truth) -> int:
    """Leading positions whose argmax is the truth."""
    return int((logits.argmax(-1) == truth).int().cumprod(0).sum())


def tree_accepted(logits, truth, budget: int) -> int:
    """Depth of the deepest node on the truth's path in the DDTree of `budget` nodes over `logits` [L, V]."""
    from sglang_overlay.adapter.settings import default_top_k
    from sglang_overlay.core.tree import build_tree_batched, draft_topk
    from sglang_overlay.core.walk import walk_tree

    # On the CPU: one block's tree is a few hundred tiny tensor ops, each a kernel launch and often a sync on
    # a GPU, so the host runs them several times faster.
    logits, truth = logits.float().cpu(), truth.cpu()
    log_probs, token_ids = draft_topk(logits[None], default_top_k(budget))
    tree = build_tree_batched(log_probs, token_ids, budget)
    # the target's token after a slot of depth d is the truth's token d (the walk only follows the truth)
    after = torch.cat([truth.to(torch.int64), truth.new_zeros(1, dtype=torch.int64)])
    return int(walk_tree(tree, after[tree.depths.to(torch.int64)]).accept_len[0])


def tiny_drafter_config(vocab_size=sl.VOCAB, dims: DraftDims = TINY_DRAFT) -> dict:
    """The config.json of a tiny drafter (SGLang's DFlashDraftModel over the tiny target; with a selector,
    DFlash2DraftModel, whose dflash_config names the convolution's and the selector's sizes)."""
    dcfg = target_config(vocab_size).to_dict()
    dflash = {"target_layer_ids": TARGET_LAYERS, "mask_token_id": sl.MASK_ID, "block_size": BLOCK}
    if dims.conv_taps:
        dflash.update(conv_kernel_size=dims.conv_taps, conv_group_size=dims.conv_group)
    if dims.selector_rank:
        dflash.update(selector_rank=dims.selector_rank, selector_top_k=dims.selector_top_k)
    dcfg.update(
        architectures=["DFlash2DraftModel" if dims.selector_rank else "DFlashDraftModel"],
        num_hidden_layers=DL,
        block_size=BLOCK,
        num_target_layers=L,
        layer_types=["full_attention"] * DL,
        dflash_config=dflash,
    )
    return dcfg


def save_drafter(drafter: Drafter, path: str, lang=None) -> None:
    """A drafter directory SGLang loads: weights, config.json, the language's tokenizer."""
    from safetensors.torch import save_file

    lang = lang or sl.Language()
    os.makedirs(path, exist_ok=True)
    make_tokenizer(path, lang)
    state = drafter.state_for_sglang()
    save_file(carry_models.snap_state(state) if CARRY else state, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(tiny_drafter_config(lang.vocab_size, drafter.dims), fh, indent=1)


def selector_loss(drafter: Drafter, hid, logits, labels, wpos):
    """The candidate selector's loss, the mean over blocks and slots (weighted by wpos) of the cross-entropy
    over slot e's K candidates, in the lattice row of the TRUE token before it (the anchor for slot 0), of
    the true token, where that row exists (slot 0, or the true previous token among slot e-1's candidates)
    and the true token is among slot e's candidates. With the true path's every row ranking the true token
    first, the greedy walk follows the continuation as far as the candidates hold it; the sampled walk's
    draft distribution q is this row's softmax (at the request's temperature), so the loss raises the
    probability it drafts the continuation with.
    Rows off the lattice are never scored at serve time, so they teach nothing. The hidden rows and the
    candidates are detached: the selector trains on the backbone, which trains exactly as a DFlash drafter
    does (the cross-entropy of the target's lm_head), so its marginals are a plain DFlash drafter's.
    hid [B, A, block, H]; logits [B, A, block-1, vocab] of rows 1..; labels [B, A, block] the true block."""
    sel = drafter.candidate_selector
    vals, cand = logits.detach().topk(sel.top_k, dim=-1)
    prev = labels[..., :-1, None]
    scores = sel.edge_scores(drafter.transform_unary(vals), cand, prev, hid[..., 1:, :].detach().float())[..., 0, :]
    match = cand == labels[..., 1:, None]
    found = match.any(-1)
    on_lattice = torch.cat([torch.ones_like(found[..., :1]), found[..., :-1]], -1)
    weight = wpos * (found & on_lattice)
    nll = -(scores.log_softmax(-1) * match).sum(-1)
    return (nll * weight).sum() / weight.sum().clamp_min(1e-6)


def parse_dflash2(spec: str) -> tuple:
    """'NAME' or 'NAME:STOP_AT' -> (NAME, STOP_AT or None)."""
    name, sep, stop_at = spec.partition(":")
    return name, float(stop_at) if sep else None


def offline_report(drafter: Drafter, target, embed, head, check, dev) -> dict:
    """A DFlash2 drafter's offline acceptance on `check` (mean_acceptance's list): the selector's greedy path
    (DFLASH's chain with it), the chain of the backbone's marginals, and DDTrees of TREE_BUDGETS nodes over
    the marginals."""
    drafter.eval()
    out = {
        "lattice_chain": round(mean_acceptance(drafter, target, embed, head, check, dev, lattice=True), 3),
        "marginal_chain": round(mean_acceptance(drafter, target, embed, head, check, dev), 3),
    }
    for budget in TREE_BUDGETS:
        out["marginal_tree_%d" % budget] = round(mean_acceptance(drafter, target, embed, head, check, dev, budget), 3)
    drafter.train()
    return out


def parse_levels(spec: str) -> list:
    """'NAME1:4.5,NAME2:8.5' -> [(NAME1, 4.5), (NAME2, 8.5)], lowest threshold first."""
    levels = []
    for item in spec.split(","):
        name, _sep, threshold = item.strip().rpartition(":")
        if not name:
            raise SystemExit("--drafter-levels wants NAME:ACCEPT[,NAME:ACCEPT...], got %r" % spec)
        levels.append((name, float(threshold)))
    return sorted(levels, key=lambda level: level[1])


def check_due(step: int, mode: str, quick: bool, synthetic: bool = True) -> bool:
    """When the offline acceptance is measured: --drafter-only every 25 steps from 50; --drafter-levels every
    25 steps from 25, and on the synthetic languages every step from 25 to 100 (the acceptance climbs from 1
    to 10 within a few dozen steps there, up to 3 in one step, so a coarser check saves a level well above its
    threshold; on real text it climbs slowly, and a check costs about ten training steps); --quick every step."""
    if mode == "full":
        return False
    if quick:
        return step >= 1
    if mode == "only":
        return step >= 50 and step % 25 == 0
    return (synthetic and 25 <= step < 100) or (step >= 25 and step % 25 == 0)


def reached_levels(out: str) -> set:
    """The levels OUT/train-levels.json (an earlier run's) says reached their thresholds, or carried."""
    try:
        with open(os.path.join(out, "train-levels.json")) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return set()
    return {lv["name"] for lv in data.get("levels", []) if lv.get("reached")} | set(data.get("carried", []))


class LevelSaver:
    """--drafter-levels: a snapshot of the drafter into OUT/NAME the first time its offline acceptance reaches
    NAME's threshold; done once every level has one."""

    def __init__(self, out: str, levels: list, log, lang=None):
        # a level OUT already holds, reached in an earlier call (carried), is kept, not trained again
        reached = reached_levels(out)
        self.carried = [n for n, _t in levels if n in reached and os.path.exists(os.path.join(out, n, "config.json"))]
        self.pending = [(n, t) for n, t in levels if n not in self.carried]
        self.out, self.saved, self.log, self.lang = out, [], log, lang
        self.tree_accept = None  # drafter -> {budget: offline DDTree acceptance}, set once the checks exist

    def record(self, drafter: Drafter, step: int, accept: float) -> None:
        trees = None
        while self.pending and accept >= self.pending[0][1]:
            name, threshold = self.pending.pop(0)
            save_drafter(drafter, os.path.join(self.out, name), self.lang)
            if trees is None and self.tree_accept is not None:
                trees = self.tree_accept(drafter)
            self.saved.append(
                {
                    "name": name,
                    "threshold": threshold,
                    "step": step,
                    "offline_accept": accept,
                    "offline_tree_accept": trees,
                    "reached": True,
                }
            )
            self.log(
                "drafter level %s saved at step %d (offline acceptance %.3f >= %.2f; DDTree %s)"
                % (name, step, accept, threshold, trees)
            )

    def finish(self, drafter: Drafter, step: int, accept) -> None:
        """Levels never reached get the last drafter, marked reached: false."""
        for name, threshold in self.pending:
            save_drafter(drafter, os.path.join(self.out, name), self.lang)
            self.saved.append(
                {"name": name, "threshold": threshold, "step": step, "offline_accept": accept, "reached": False}
            )
            self.log("drafter level %s NOT reached; saved the last drafter (step %d)" % (name, step))
        self.pending = []

    @property
    def done(self) -> bool:
        return not self.pending


@dataclass
class Run:
    """One invocation: OUTDIR, the mode (full, only: --drafter-only, levels: --drafter-levels, dflash2), the
    drafter's name and its stop level, the language, the device and the log."""

    out: str
    quick: bool
    dev: torch.device
    lang: object
    mode: str = "full"
    name: str = "tiny-qwen3-dflash"
    stop_at: float = None
    levels: LevelSaver = None
    t0: float = dataclasses.field(default_factory=time.time)
    logs: list = dataclasses.field(default_factory=list)

    def log(self, msg):
        line = "[%6.1fs] %s" % (time.time() - self.t0, msg)
        print(line, flush=True)
        self.logs.append(line)

    @property
    def checks(self) -> str:
        """check_due's mode: --dflash2 checks its lattice's acceptance only when it has a level to stop at."""
        return {"dflash2": "full" if self.stop_at is None else "only"}.get(self.mode, self.mode)


def parse_run(argv: list) -> Run:
    run = Run(argv[1], "--quick" in argv, torch.device("cuda" if torch.cuda.is_available() else "cpu"), sl.Language())
    if "--drafter-only" in argv:
        at = argv.index("--drafter-only")
        run.mode, run.name, run.stop_at = "only", argv[at + 1], float(argv[at + 2])
    elif "--dflash2" in argv:
        run.mode, (run.name, run.stop_at) = "dflash2", parse_dflash2(argv[argv.index("--dflash2") + 1])
    elif "--drafter-levels" in argv:
        run.mode = "levels"
        run.levels = LevelSaver(run.out, parse_levels(argv[argv.index("--drafter-levels") + 1]), run.log, run.lang)
    return run


def prepare_target(run: Run):
    """OUTDIR/tiny-qwen3, trained first for a full run (and for levels or a DFlash2 drafter when OUTDIR has
    none) -> (the target in bf16 on the device, its final training loss or None)."""
    from transformers import Qwen3ForCausalLM

    lang, dev, tdir = run.lang, run.dev, os.path.join(run.out, "tiny-qwen3")
    os.makedirs(tdir, exist_ok=True)
    tloss = None
    if run.mode == "full" or (
        run.mode in ("levels", "dflash2") and not os.path.exists(os.path.join(tdir, "config.json"))
    ):
        make_tokenizer(tdir, lang)
        model, tloss = train_target(
            lang, dev, 10 if run.quick else target_steps(lang), run.log, bs=4 if run.quick else 128
        )
        if CARRY:
            carry_models.snap_module(model)
        model.to(torch.bfloat16).save_pretrained(tdir, safe_serialization=True)
        if lang.kind in sl.SYNTH_KINDS:  # phrase boundaries exist in the synthetic kinds only
            run.log(
                "target: most likely successor at %.3f of boundaries"
                % target_boundary_accuracy(model.eval(), lang, dev)
            )
        else:
            run.log("target: held-out loss %.4f" % held_out_loss(model.eval(), lang, dev))
    target = Qwen3ForCausalLM.from_pretrained(tdir, dtype=torch.bfloat16).to(dev).eval()
    run.log("target saved (%d params)" % sum(p.numel() for p in target.parameters()))
    return target, tloss


def drafter_data(run: Run, target) -> list:
    """Greedy continuations of training prompts (seed 3; the held-out prompts use 7 and 11): one group
    (sequences [N, pl + 80], pl, their features) per prompt length pl."""
    rng = random.Random(3)
    n_new, plens = 80, [8, 16, 24, 32, 40, 48]
    per = 4 if run.quick else DRAFTER_DATA
    groups = []
    for pl in plens:
        prompts = [run.lang.sample_ids(pl, rng) for _i in range(per)]
        parts = [greedy_continue(target, prompts[i : i + 512], n_new, run.dev) for i in range(0, per, 512)]
        groups.append((torch.cat(parts), pl))
    run.log("greedy continuations: %d sequences" % sum(g[0].shape[0] for g in groups))
    return [(s, pl, features(target, s)) for s, pl in groups]


def held_out_check(run: Run, target, count: int) -> list:
    """mean_acceptance's list for the first `count` held-out prompts (2 with --quick)."""
    prompts = held_out_prompts(run.lang)[: 2 if run.quick else count]
    return [(greedy_continue(target, [p], 64, run.dev), len(p)) for p in prompts]


def drafter_loss(drafter: Drafter, batch, head, wpos, dev):
    """The DFlash loss of a batch (make_batch's), the selector's added for a DFlash2 drafter -> (loss, logits)."""
    f, cm, emb, pos, labels = batch
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        hid = drafter(f, cm, emb.detach(), pos)
        logits = hid[:, :, 1:].float() @ head.float().T
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, :, 1:].reshape(-1), reduction="none")
    loss = (ce.view(-1, BLOCK - 1) * wpos).sum() / (wpos.sum() * ce.numel() / (BLOCK - 1))
    if drafter.candidate_selector is not None:
        loss = loss + selector_loss(drafter, hid, logits, labels, wpos)
    return loss, logits


def checked(run: Run, drafter: Drafter, step: int, loss, measure) -> tuple:
    """The offline acceptance check of a step where check_due -> (its acceptance or None, whether to stop)."""
    if not check_due(step, run.checks, run.quick, run.lang.kind in sl.SYNTH_KINDS):
        return None, False
    drafter.eval()
    accept = measure(drafter)
    drafter.train()
    run.log("drafter step %d loss %.4f offline acceptance %.3f" % (step, loss.item(), accept))
    if run.checks == "only" and accept >= run.stop_at:
        return accept, True
    if run.mode == "levels":
        run.levels.record(drafter, step, accept)
        return accept, run.levels.done
    return accept, False


def train_drafter(run: Run, target, groups: list, check: list) -> tuple:
    """The drafter's training loop -> (drafter, last step, last loss, last checked acceptance)."""
    dev, embed, head = run.dev, target.get_input_embeddings(), target.lm_head.weight.detach()
    resume = RESUME and run.mode == "levels"
    dims = dflash2_dims(run.lang.vocab_size) if run.mode == "dflash2" else TINY_DRAFT
    drafter = (Drafter.from_pretrained(RESUME) if resume else Drafter(dims)).to(dev)
    peak_lr = 5e-4 if resume else 2e-3
    if resume:
        run.log("drafter: resumed from %s" % RESUME)
    opt = torch.optim.AdamW(drafter.parameters(), lr=peak_lr, weight_decay=0.0, betas=(0.9, 0.95))
    steps = 20 if run.quick else 3000
    gen = torch.Generator(device=dev)
    gen.manual_seed(4)
    torch.manual_seed(4)
    wpos = torch.exp(-(torch.arange(1, BLOCK, device=dev).float() - 1) / 7.0)
    bs, A = (4 if run.quick else DRAFTER_BATCH), 8
    lattice = run.mode == "dflash2"

    def measure(d):
        return mean_acceptance(d, target, embed, head, check, dev, lattice=lattice)

    accept = None
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, peak_lr)
        s, pl, feats = groups[step % len(groups)]
        idx = torch.randint(0, s.shape[0], (min(bs, s.shape[0]),), device=dev)
        starts = torch.full((idx.shape[0],), pl, device=dev)
        batch = make_batch(s[idx], feats[idx], starts, embed, A, gen, run.lang.mask_id)
        loss, logits = drafter_loss(drafter, batch, head, wpos, dev)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if time.time() - run.t0 > TIME_LIMIT_S and not run.quick:  # keep the device call inside its limit
            run.log("drafter: time budget reached at step %d" % step)
            break
        accept, stop = checked(run, drafter, step, loss, measure) if check else (accept, False)
        if stop:
            break
        if step % 250 == 0 or step == steps - 1:
            acc1 = (logits.argmax(-1) == batch[4][:, :, 1:]).float().mean(dim=(0, 1))
            run.log(
                "drafter step %d loss %.4f pos-acc %s"
                % (step, loss.item(), " ".join("%.2f" % a for a in acc1[:8].tolist()))
            )
    return drafter, step, loss, accept


def finish_levels(run: Run, drafter: Drafter, step: int, accept, check: list) -> None:
    run.levels.finish(drafter, step, accept)
    if CARRY:  # where a later call's DRAFTER_RESUME picks up
        save_drafter(drafter, os.path.join(run.out, "drafter-last"), run.lang)
    res = {
        "levels": run.levels.saved,
        "carried": run.levels.carried,
        "resumed_from": RESUME or None,
        "language": run.lang.kind,
        "check_prompts": len(check),
        "seconds": round(time.time() - run.t0, 1),
        "device": str(run.dev),
        "torch": torch.__version__,
        "log": run.logs,
    }
    with open(os.path.join(run.out, "train-levels.json"), "w") as fh:
        json.dump(res, fh, indent=1)


def finish_drafter(run: Run, target, drafter: Drafter, trained: dict, check: list) -> None:
    """Save the drafter, measure it on held-out prompts (a DFlash2 drafter: offline_report too) and write
    OUTDIR/train.json (--drafter-only, --dflash2: train-NAME.json). trained: target_final_loss,
    drafter_final_loss, steps."""
    save_drafter(drafter, os.path.join(run.out, run.name), run.lang)
    embed, head = target.get_input_embeddings(), target.lm_head.weight.detach()
    report = None
    if run.mode == "dflash2":
        check = check or held_out_check(run, target, 16)
        report = offline_report(drafter, target, embed, head, check, run.dev)
        run.log("DFlash2 offline acceptance on %d held-out prompts: %s" % (len(check), report))
    # offline DFlash acceptance on the held-out greedy prompts
    accs = [
        simulate_acceptance(drafter.eval(), target, embed, head, g, torch.tensor([pl]), run.dev)[0]
        for g, pl in held_out_check(run, target, 64)
    ]
    mean_acc = sum(accs) / len(accs)
    run.log("offline DFlash acceptance length on held-out prompts: %.3f" % mean_acc)
    res = {
        "target_final_loss": trained["target_final_loss"],
        "drafter_final_loss": trained["drafter_final_loss"],
        "offline_accept_len": mean_acc,
        "offline_accept_len_per_prompt": accs,
        "seconds": round(time.time() - run.t0, 1),
        "device": str(run.dev),
        "torch": torch.__version__,
        "log": run.logs,
        "language": run.lang.kind,
        "target": {
            "vocab": run.lang.vocab_size,
            "hidden": H,
            "layers": L,
            "heads": NH,
            "kv_heads": NKV,
            "inter": INTER,
        },
        "drafter": {
            "layers": DL,
            "block": BLOCK,
            "target_layer_ids": TARGET_LAYERS,
            "mask_token_id": run.lang.mask_id,
            "name": run.name,
            "steps": trained["steps"],
            "stop_at_accept": run.stop_at,
            "dflash2": dataclasses.asdict(drafter.dims) if run.mode == "dflash2" else None,
        },
        "dflash2_offline_accept": report,
    }
    name = "train-%s.json" % run.name if run.mode in ("only", "dflash2") else "train.json"
    with open(os.path.join(run.out, name), "w") as fh:
        json.dump(res, fh, indent=1)


def main():
    run = parse_run(sys.argv)
    target, tloss = prepare_target(run)
    groups = drafter_data(run, target)
    check = [] if run.checks == "full" else held_out_check(run, target, 16)
    if run.levels is not None:
        embed, head = target.get_input_embeddings(), target.lm_head.weight.detach()

        def tree_accept(d):
            d.eval()
            out = {}
            for budget in TREE_BUDGETS:
                out[str(budget)] = round(mean_acceptance(d, target, embed, head, check, run.dev, budget), 3)
            d.train()
            return out

        run.levels.tree_accept = tree_accept
    drafter, step, loss, accept = train_drafter(run, target, groups, check)
    if run.mode == "levels":
        finish_levels(run, drafter, step, accept, check)
        return
    trained = {"target_final_loss": tloss, "drafter_final_loss": float(loss.item()), "steps": step + 1}
    finish_drafter(run, target, drafter, trained, check)


if __name__ == "__main__":
    main()
