"""Write production-shaped targets and DFlash drafters for them as config + tokenizer only (no weights).

Usage: python make_shaped.py OUTDIR  -> OUTDIR/SHAPE-shaped and OUTDIR/SHAPE-shaped-dflash for each shape of
`SHAPES` (qwen3-8b; qwen3-30b-a3b, the MoE at its full 48 layers).
The production shapes live here (`SHAPES`: qwen3-8b, qwen3-30b-a3b); embed_models.py embeds the trained tiny
pair into them with real weights.
The target loads with ``--load-format dummy``: SGLang fills random weights from config.json, so nothing large
travels to the device and the start costs no weight reading. The drafter gets random weights of its own,
written here on the device (``drafter_weights``: seeded, normal with std 0.02, norms 1), not SGLang's dummy
ones: those are uniform in +-1e-3 with one seed for every tensor, so the drafter's hidden state is the same at
every position of its block and DFLASH drafts one token 15 times, where a trained drafter drafts text. On a
dense target that costs the same; on an MoE target the verify's expert reads grow with the distinct tokens it
routes, so a degenerate chain would make DFLASH's step unrealistically cheap against a tree of distinct
candidates. Random target + random drafter: nothing is accepted beyond the bonus token, so DFLASH and DDTREE
run at equal acceptance and tokens/s compares the cost of one step.

Shapes: the target is Qwen3-8B's config (36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12288,
vocabulary 151936, untied head). The drafter is shaped like the published Qwen3-8B DFlash drafter
(block 16, 5 layers of the target's width, context features from target layers 1, 9, 17, 25, 33); its exact
layer count does not matter for the ratio (DFLASH and DDTREE run the same draft forward).
The tokenizer is synth_lang's word-level one (the perf prompts are its words) padded with unused tokens to
the full vocabulary, so every id the random target emits detokenizes. With SYNTH_LANG=code|prose it is the
language's byte-level BPE (corpus_lang.py: prompts tokenize as on the embedded bed) with the unused tokens
appended to its model's vocabulary (never produced by a merge; they decode to their own text).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synth_lang as sl  # noqa: E402

TARGET, DRAFTER = "qwen3-8b-shaped", "qwen3-8b-shaped-dflash"
VOCAB = 151936
QWEN3_8B = dict(
    vocab_size=VOCAB,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
# Qwen3-Coder-30B-A3B: 48 MoE layers (128 experts of 768, 8 routed, renormalised top-k), 32 query / 4 KV heads.
# Its DFlash drafter is dense (Qwen3 layers of the target's width, the config's intermediate_size 6144).
QWEN3_30B_A3B = dict(
    vocab_size=VOCAB,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    output_router_logits=False,
    router_aux_loss_coef=0.0,
)
SHAPES = {"qwen3-8b": QWEN3_8B, "qwen3-30b-a3b": QWEN3_30B_A3B}
MOE_KEYS = (
    "moe_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "output_router_logits",
    "router_aux_loss_coef",
)
ROPE_THETA = 1000000.0
DRAFT_LAYERS, BLOCK = 5, 16


def vocabulary():
    """synth_lang's tokens at their usual ids (prompts tokenize the same), then unused ones up to VOCAB."""
    vocab = {t: i for i, t in enumerate(sl.SPECIALS)}
    for i in range(sl.N_WORDS):
        vocab[sl.word(i)] = len(vocab)
    while len(vocab) < VOCAB:
        vocab["<unused_%d>" % len(vocab)] = len(vocab)
    return vocab


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list:
    """SGLang's default DFlash feature layers (speculative/dflash_utils.py): spread over 1..L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def target_config(shape: str = "qwen3-8b") -> dict:
    moe = "num_experts" in SHAPES[shape]
    return dict(
        SHAPES[shape],
        architectures=["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
        model_type="qwen3_moe" if moe else "qwen3",
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        use_cache=True,
        rope_theta=ROPE_THETA,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        torch_dtype="bfloat16",
        dtype="bfloat16",
    )


def drafter_config(shape: str = "qwen3-8b") -> dict:
    """A dense DFlash drafter of the target's width: DRAFT_LAYERS layers reading DRAFT_LAYERS target layers."""
    cfg = {k: v for k, v in target_config(shape).items() if k not in MOE_KEYS}
    layers = cfg["num_hidden_layers"]
    cfg.update(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        num_hidden_layers=DRAFT_LAYERS,
        block_size=BLOCK,
        num_target_layers=layers,
        layer_types=["full_attention"] * DRAFT_LAYERS,
        dflash_config={
            "target_layer_ids": build_target_layer_ids(layers, DRAFT_LAYERS),
            "mask_token_id": sl.MASK_ID,
            "block_size": BLOCK,
        },
    )
    return cfg


def save_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    lang = sl.Language()
    if lang.kind not in sl.SYNTH_KINDS:  # real text: its BPE, padded to VOCAB
        spec = json.loads(lang.tokenizer_json)
        vocab = spec["model"]["vocab"]
        for i in range(lang.vocab_size, VOCAB):
            vocab["<unused_%d>" % i] = i
        PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=sl.SPECIALS[1:],
        ).save_pretrained(path)
        return
    tok = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=sl.SPECIALS[1:],
    ).save_pretrained(path)


def drafter_weights(cfg: dict, seed: int = 0) -> dict:
    """Random DFlash drafter weights for ``cfg`` (SGLang's names, as train_models.py saves a drafter), bf16.

    Projections normal with std 0.02 (transformers' ``initializer_range``), norms 1: the block's positions get
    distinct hidden states (RoPE turns each position's query), so the drafted tokens differ by position.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    h, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    feats = len(cfg["dflash_config"]["target_layer_ids"])

    def normal(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    out = {"fc.weight": normal(h, feats * h), "hidden_norm.weight": ones(h), "norm.weight": ones(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = "layers.%d." % i
        out.update(
            {
                p + "input_layernorm.weight": ones(h),
                p + "post_attention_layernorm.weight": ones(h),
                p + "self_attn.q_proj.weight": normal(q, h),
                p + "self_attn.k_proj.weight": normal(kv, h),
                p + "self_attn.v_proj.weight": normal(kv, h),
                p + "self_attn.o_proj.weight": normal(h, q),
                p + "self_attn.q_norm.weight": ones(hd),
                p + "self_attn.k_norm.weight": ones(hd),
                p + "mlp.gate_proj.weight": normal(inter, h),
                p + "mlp.up_proj.weight": normal(inter, h),
                p + "mlp.down_proj.weight": normal(h, inter),
            }
        )
    return out


def shaped_names(shape: str) -> tuple:
    """The target's and the drafter's directory names of a random-weight shape."""
    return "%s-shaped" % shape, "%s-shaped-dflash" % shape


def main(out):
    for shape in SHAPES:
        target, drafter = shaped_names(shape)
        for name, cfg in ((target, target_config(shape)), (drafter, drafter_config(shape))):
            path = os.path.join(out, name)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "config.json"), "w") as fh:
                json.dump(cfg, fh, indent=1)
            save_tokenizer(path)
        weights = os.path.join(out, drafter, "model.safetensors")
        if not os.path.exists(weights):  # a warm machine keeps them (same config, same seed)
            from safetensors.torch import save_file

            save_file(drafter_weights(drafter_config(shape)), weights + ".part")
            os.replace(weights + ".part", weights)
        print("[make_shaped] %s, %s (random drafter weights) in %s" % (target, drafter, out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
