"""The lab model's tokenizer as Hugging Face files, for clients that load one (SGLang's bench_serving).

The byte-level tokenizer (tokenizer.py) is a byte-level BPE without merges: 256 byte tokens in GPT-2's
byte order, the same order and the same byte -> character map as GPT-2's `bytes_to_unicode`, and three
special tokens. tokenizer.json written here encodes and decodes exactly as ByteTokenizer does
(lab/runtime/tests/test_lab_units.py compares them), so token counts a client computes are the server's.

Usage: python -m ddtree_lab_runtime.hf_tokenizer DIR   (writes DIR/tokenizer.json, DIR/tokenizer_config.json)
then e.g. python -m sglang.bench_serving --tokenizer DIR ... against a lab runtime.
"""

from __future__ import annotations

import json
import os
import sys

from .tokenizer import BYTE_OF_ID, EOS_ID, NUM_BYTE_TOKENS, SPECIALS

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_to_unicode(byte: int) -> str:
    """GPT-2's printable stand-in for a byte (its bytes_to_unicode table)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    if byte in printable:
        return chr(byte)
    others = [b for b in range(256) if b not in printable]
    return chr(256 + others.index(byte))


def tokenizer_json() -> dict:
    vocab = {byte_to_unicode(BYTE_OF_ID[token_id]): token_id for token_id in range(NUM_BYTE_TOKENS)}
    added = [
        {
            "id": token_id,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for text, token_id in sorted(SPECIALS.items(), key=lambda kv: kv[1])
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def tokenizer_config() -> dict:
    eos = next(text for text, token_id in SPECIALS.items() if token_id == EOS_ID)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": eos,
        "bos_token": None,
        "model_max_length": 8192,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def write(directory: str) -> list:
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, document in (("tokenizer.json", tokenizer_json()), ("tokenizer_config.json", tokenizer_config())):
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, ensure_ascii=False, indent=1)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m ddtree_lab_runtime.hf_tokenizer DIR")
    print("\n".join(write(sys.argv[1])))
