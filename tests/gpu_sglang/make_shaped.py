"""Write a Qwen3-8B-shaped target and a DFlash drafter for it as config + tokenizer only (no weights).

Usage: python make_shaped.py OUTDIR  -> OUTDIR/qwen3-8b-shaped, OUTDIR/qwen3-8b-shaped-dflash.
The servers load them with ``--load-format dummy`` (target) and ``--speculative-draft-load-format dummy``
(drafter): SGLang fills random weights from config.json, so nothing large travels to the device and the
start costs no weight reading. Random target + random drafter: nothing is accepted beyond the bonus token,
so DFLASH and DDTREE run at equal acceptance and tokens/s compares the cost of one step.

Shapes: the target is Qwen3-8B's config (36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12288,
vocabulary 151936, untied head). The drafter is shaped like the published Qwen3-8B DFlash drafter
(block 16, 5 layers of the target's width, context features from target layers 1, 9, 17, 25, 33); its exact
layer count does not matter for the ratio (DFLASH and DDTREE run the same draft forward).
The tokenizer is synth_lang's word-level one (the perf prompts are its words) padded with unused tokens to
the full vocabulary, so every id the random target emits detokenizes.
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
ROPE_THETA = 1000000.0
DRAFT_LAYERS, BLOCK, TARGET_LAYER_IDS = 5, 16, [1, 9, 17, 25, 33]


def vocabulary():
    """synth_lang's tokens at their usual ids (prompts tokenize the same), then unused ones up to VOCAB."""
    vocab = {t: i for i, t in enumerate(sl.SPECIALS)}
    for i in range(sl.N_WORDS):
        vocab[sl.word(i)] = len(vocab)
    while len(vocab) < VOCAB:
        vocab["<unused_%d>" % len(vocab)] = len(vocab)
    return vocab


def target_config():
    return dict(
        QWEN3_8B,
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
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


def drafter_config():
    cfg = target_config()
    cfg.update(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=DRAFT_LAYERS,
        block_size=BLOCK,
        num_target_layers=QWEN3_8B["num_hidden_layers"],
        layer_types=["full_attention"] * DRAFT_LAYERS,
        dflash_config={"target_layer_ids": TARGET_LAYER_IDS, "mask_token_id": sl.MASK_ID, "block_size": BLOCK},
    )
    return cfg


def save_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=sl.SPECIALS[1:],
    ).save_pretrained(path)


def main(out):
    for name, cfg in ((TARGET, target_config()), (DRAFTER, drafter_config())):
        path = os.path.join(out, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump(cfg, fh, indent=1)
        save_tokenizer(path)
    print("[make_shaped] %s, %s in %s" % (TARGET, DRAFTER, out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
