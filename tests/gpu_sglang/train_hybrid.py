"""Train, on the device, a tiny hybrid target (Gated DeltaNet linear attention + full attention, the Qwen3.5
dense text layout) on the language SYNTH_LANG names, and a DFlash drafter for it, in the layouts SGLang 0.5.23
loads: the target as `Qwen3_5ForCausalLM` (model_type qwen3_5_text: SGLang's models/qwen3_5_text.py, config
configs/qwen3_5.Qwen3_5TextConfig, a Qwen3NextConfig, so hybrid_gdn_config takes it), the drafter as
train_models.py's DFlashDraftModel reading the target's hidden states after TARGET_LAYER_IDS.

Usage: python train_hybrid.py OUTDIR [--quick]
  writes OUTDIR/tiny-hybrid (the target), OUTDIR/tiny-hybrid-dflash (the drafter) and OUTDIR/train-hybrid.json
  (losses, the offline DFlash acceptance at each check, the step that saved the drafter). A target already in
  OUTDIR/tiny-hybrid is kept (only the drafter trains). --quick: a CPU smoke run of every code path (seconds).

The layout: LAYERS layers, every FULL_ATTENTION_INTERVAL-th full attention (gated, partial RoPE, as Qwen3.5),
the others Gated DeltaNet; hidden, heads, MLP and vocab as train_models.py's tiny Qwen3. Transformers trains
it through its PyTorch reference of the GDN kernels (no flash-linear-attention on the device; fast enough at
this size). config.json carries both `layer_types` (Transformers reads it) and `full_attention_interval`
(SGLang's Qwen3NextConfig.layers_block_type reads only that), and mamba_ssm_dtype float32.

The drafter trains as train_models.py trains its own (its data, batches, loss and offline acceptance) and is
saved at the first check whose offline acceptance reaches HYBRID_ACCEPT (default 6.5: train_models' levels
served about 0.75 of their offline acceptance, so about 5 in the server, inside the 4-7 a real DFlash drafter
accepts); the last drafter when the time limit (HYBRID_TRAIN_LIMIT_S) comes first, marked reached: false.
"""

import contextlib
import functools
import json
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth_lang as sl  # noqa: E402
import train_models as tm  # noqa: E402

TARGET_DIR, DRAFTER_DIR = "tiny-hybrid", "tiny-hybrid-dflash"
LAYERS, FULL_ATTENTION_INTERVAL = 6, 3
LINEAR_KEY_HEADS, LINEAR_VALUE_HEADS, LINEAR_HEAD_DIM, CONV_KERNEL = 2, 4, 64, 4
PARTIAL_ROTARY = 0.25  # Qwen3.5's
# The drafter reads a Gated DeltaNet layer early and the one before the last full attention (SGLang captures
# before layer k + 1, so k < LAYERS - 1).
TARGET_LAYER_IDS = (1, 4)
ACCEPT_STOP = float(os.environ.get("HYBRID_ACCEPT", "6.5"))
# Target steps: HYBRID_TARGET_STEPS, else train_models' (TARGET_STEPS, 1500 for the synthetic languages).
# HYBRID_TRAIN_LIMIT_S: the whole run's seconds (the drafter stops there); HYBRID_TARGET_LIMIT_S: the target's
# share (fewer steps when its pace says so). Defaults that leave a device call room for the servers.
TIME_LIMIT_S = float(os.environ.get("HYBRID_TRAIN_LIMIT_S", "170"))
TARGET_LIMIT_S = float(os.environ.get("HYBRID_TARGET_LIMIT_S", "80"))


def layer_types(layers=LAYERS, interval=FULL_ATTENTION_INTERVAL) -> list:
    """Transformers' layer_types for SGLang's rule: layer l is full attention when (l + 1) % interval == 0."""
    return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]


def hybrid_config(vocab_size=sl.VOCAB):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=tm.H,
        intermediate_size=tm.INTER,
        num_hidden_layers=LAYERS,
        num_attention_heads=tm.NH,
        num_key_value_heads=tm.NKV,
        head_dim=tm.HD,
        linear_conv_kernel_dim=CONV_KERNEL,
        linear_key_head_dim=LINEAR_HEAD_DIM,
        linear_value_head_dim=LINEAR_HEAD_DIM,
        linear_num_key_heads=LINEAR_KEY_HEADS,
        linear_num_value_heads=LINEAR_VALUE_HEADS,
        layer_types=layer_types(),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        rms_norm_eps=tm.EPS,
        rope_parameters={"rope_type": "default", "rope_theta": tm.ROPE_THETA, "partial_rotary_factor": PARTIAL_ROTARY},
        dtype="bfloat16",
    )


def sglang_fields() -> dict:
    """What config.json adds for SGLang: the interval its layers_block_type reads, the SSM state dtype."""
    return {"full_attention_interval": FULL_ATTENTION_INTERVAL, "mamba_ssm_dtype": "float32"}


def save_target(model, path, lang) -> None:
    """The target in bf16 as SGLang loads it: safetensors, config.json with sglang_fields, the tokenizer."""
    os.makedirs(path, exist_ok=True)
    tm.make_tokenizer(path, lang)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    cfg.update(sglang_fields())
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh, indent=1)


def load_target(path, dev, dtype=torch.bfloat16):
    from transformers import Qwen3_5ForCausalLM

    return Qwen3_5ForCausalLM.from_pretrained(path, dtype=dtype).to(dev).eval()


def train_target(lang, dev, steps, log, bs=128, seq=128, limit_s=None):
    """train_models.train_target's recipe on the hybrid layout."""
    from transformers import Qwen3_5ForCausalLM

    def make_model():
        return Qwen3_5ForCausalLM(hybrid_config(lang.vocab_size))

    return tm.train_target(lang, dev, steps, log, bs=bs, seq=seq, make_model=make_model, limit_s=limit_s)


# ---- the drafter -----------------------------------------------------------------------------------


def draft_dims() -> tm.DraftDims:
    return tm.DraftDims(tm.H, tm.NH, tm.NKV, tm.HD, tm.INTER, tm.DL, tm.BLOCK, TARGET_LAYER_IDS, tm.EPS, tm.ROPE_THETA)


def drafter_config(vocab_size=sl.VOCAB) -> dict:
    """train_models' drafter config.json over the hybrid target: its layer count and the layers read."""
    cfg = tm.tiny_drafter_config(vocab_size)
    cfg["num_target_layers"] = LAYERS
    cfg["dflash_config"] = dict(cfg["dflash_config"], target_layer_ids=list(TARGET_LAYER_IDS))
    return cfg


def save_drafter(drafter, path, lang) -> None:
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    tm.make_tokenizer(path, lang)
    save_file(drafter.state_for_sglang(), os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(drafter_config(lang.vocab_size), fh, indent=1)


@contextlib.contextmanager
def hybrid_features():
    """train_models' functions (simulate_acceptance) read the target through tm.features with its tiny Qwen3's
    layers; inside, they read this target's TARGET_LAYER_IDS."""
    original = tm.features
    tm.features = functools.partial(original, layer_ids=TARGET_LAYER_IDS)
    try:
        yield
    finally:
        tm.features = original


def drafter_data(target, lang, dev, quick):
    """train_models' drafter data: greedy continuations of training prompts of six lengths (seed 3)."""
    rng = random.Random(3)
    n_new, per = (tm.BLOCK + 4, 2) if quick else (80, 1024)
    groups = []
    for pl in (8, 16) if quick else (8, 16, 24, 32, 40, 48):
        prompts = [lang.sample_ids(pl, rng) for _i in range(per)]
        parts = [tm.greedy_continue(target, prompts[i : i + 512], n_new, dev) for i in range(0, per, 512)]
        groups.append((torch.cat(parts), pl))
    return groups, [tm.features(target, g[0]) for g in groups]


def drafter_step(drafter, opt, batch, head, wpos, vocab) -> float:
    """One optimizer step of train_models' drafter loss (block positions weighted by wpos)."""
    f, cm, emb, pos, labels = batch
    dev = f.device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        hid = drafter(f, cm, emb.detach(), pos)
        logits = hid[:, :, 1:].float() @ head.float().T
    ce = F.cross_entropy(logits.reshape(-1, vocab), labels[:, :, 1:].reshape(-1), reduction="none")
    loss = (ce.view(-1, tm.BLOCK - 1) * wpos).sum() / (wpos.sum() * ce.numel() / (tm.BLOCK - 1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
    opt.step()
    return float(loss.item())


def train_drafter(target, lang, dev, quick, log, deadline):
    """The drafter, stopped at the first check (tm.check_due's --drafter-levels schedule) whose offline
    acceptance on held-out prompts reaches ACCEPT_STOP, or at the deadline. Returns (drafter, record)."""
    groups, gfeats = drafter_data(target, lang, dev, quick)
    log("greedy continuations: %d sequences" % sum(g[0].shape[0] for g in groups))
    embed, head = target.get_input_embeddings(), target.lm_head.weight.detach()
    check_new, prompts = (tm.BLOCK + 4, 1) if quick else (64, 16)
    check = [(tm.greedy_continue(target, [p], check_new, dev), len(p)) for p in tm.held_out_prompts(lang)[:prompts]]
    drafter = tm.Drafter(draft_dims()).to(dev)
    opt = torch.optim.AdamW(drafter.parameters(), lr=2e-3, weight_decay=0.0, betas=(0.9, 0.95))
    steps, bs = (3 if quick else 3000), (4 if quick else 64)
    gen = torch.Generator(device=dev)
    gen.manual_seed(4)
    torch.manual_seed(4)
    wpos = torch.exp(-(torch.arange(1, tm.BLOCK, device=dev).float() - 1) / 7.0)
    record = {"checks": [], "reached": False, "stop_at": ACCEPT_STOP}
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = tm.lr_at(step, steps, 2e-3)
        (s, pl), gf = groups[step % len(groups)], gfeats[step % len(groups)]
        idx = torch.randint(0, s.shape[0], (min(bs, s.shape[0]),), device=dev)
        starts = torch.full((idx.shape[0],), pl, device=dev)
        batch = tm.make_batch(s[idx], gf[idx], starts, embed, 8, gen, lang.mask_id)
        record["loss"] = drafter_step(drafter, opt, batch, head, wpos, lang.vocab_size)
        record["steps"] = step + 1
        if time.time() > deadline and not quick:
            log("drafter: time limit at step %d" % step)
            break
        if tm.check_due(step, "levels", quick):
            drafter.eval()
            accept = tm.mean_acceptance(drafter, target, embed, head, check, dev)
            drafter.train()
            record["checks"].append([step, round(accept, 3)])
            log("drafter step %d loss %.4f offline acceptance %.3f" % (step, record["loss"], accept))
            if accept >= ACCEPT_STOP:
                record.update(reached=True, offline_accept=accept)
                break
    if not record["reached"]:
        record["offline_accept"] = record["checks"][-1][1] if record["checks"] else None
    return drafter.eval(), record


def main():
    out = sys.argv[1]
    quick = "--quick" in sys.argv
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    logs = []

    def log(msg):
        line = "[%6.1fs] %s" % (time.time() - t0, msg)
        print(line, flush=True)
        logs.append(line)

    lang = sl.Language()
    tdir, ddir = os.path.join(out, TARGET_DIR), os.path.join(out, DRAFTER_DIR)
    tloss = None
    if not os.path.exists(os.path.join(tdir, "config.json")):
        steps = 3 if quick else int(os.environ.get("HYBRID_TARGET_STEPS", tm.target_steps(lang)))
        model, tloss = train_target(
            lang, dev, steps, log, bs=4 if quick else 128, seq=32 if quick else 128, limit_s=TARGET_LIMIT_S
        )
        save_target(model, tdir, lang)
        if lang.kind in sl.SYNTH_KINDS:
            accuracy = tm.target_boundary_accuracy(model.eval(), lang, dev, n=4 if quick else 64)
            log("target: most likely successor at %.3f of boundaries" % accuracy)
    target = load_target(tdir, dev)
    log("target saved (%d params, layers %s)" % (sum(p.numel() for p in target.parameters()), layer_types()))
    with hybrid_features():
        drafter, record = train_drafter(target, lang, dev, quick, log, t0 + TIME_LIMIT_S)
    save_drafter(drafter, ddir, lang)
    log(
        "drafter saved at step %d, offline acceptance %s (reached %s)"
        % (record["steps"], record["offline_accept"], record["reached"])
    )
    res = {
        "target_final_loss": tloss,
        "drafter": dict(record, name=DRAFTER_DIR, target_layer_ids=list(TARGET_LAYER_IDS)),
        "target": {
            "layer_types": layer_types(),
            "full_attention_interval": FULL_ATTENTION_INTERVAL,
            "linear_heads": [LINEAR_KEY_HEADS, LINEAR_VALUE_HEADS],
            "linear_head_dim": LINEAR_HEAD_DIM,
            "conv_kernel": CONV_KERNEL,
        },
        "language": lang.kind,
        "seconds": round(time.time() - t0, 1),
        "device": str(dev),
        "torch": torch.__version__,
        "log": logs,
    }
    with open(os.path.join(out, "train-hybrid.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
