"""The real-text languages `code` and `prose` (SYNTH_LANG=code|prose): synth_lang.Language() returns a
CorpusLanguage for them, with the interface the harness uses for every language.

A language reads its bundle, corpora/<kind>.tar.xz beside this file (built by make_corpus.py, whose
docstring has the decisions: the sources, the held-out split by file, the tokenizer): the training split's
token ids (training windows: sample_ids), the held-out files' token ids (every prompt a server is measured
with is a decoded held-out window, so no prompt appears in training) and the byte-level BPE tokenizer
(vocab 4096, specials <|endoftext|>, <|im_start|>, <|im_end|>, <|MASK|> at ids 0..3). Reading the bundle
and decoding ids need plain Python only; encode() and save_tokenizer() need `tokenizers` (and
`transformers`), which the device and the overlay venv have.
"""

import array
import functools
import io
import json
import lzma
import os
import random
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPORA = os.path.join(HERE, "corpora")
KINDS = ("code", "prose")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
MASK_ID = 3
EOT = 0


def bundle_path(kind: str) -> str:
    return os.path.join(CORPORA, "%s.tar.xz" % kind)


def read_bundle(path: str) -> dict:
    """{member name: bytes} of a bundle."""
    with open(path, "rb") as fh:
        raw = lzma.decompress(fh.read())
    out = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
        for info in tar.getmembers():
            out[info.name] = tar.extractfile(info).read()
    return out


def ids_from_bytes(data: bytes) -> array.array:
    ids = array.array("H")
    ids.frombytes(data)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids


def byte_decoder() -> dict:
    """GPT-2's byte-level alphabet: printable character -> byte (as `tokenizers`' ByteLevel uses it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@functools.lru_cache(maxsize=None)
def _load(kind: str) -> tuple:
    path = bundle_path(kind)
    if not os.path.exists(path):
        raise SystemExit("SYNTH_LANG=%s: no corpus bundle %s (python tests/gpu_sglang/make_corpus.py)" % (kind, path))
    members = read_bundle(path)
    manifest = json.loads(members["manifest.json"])
    tok_json = members["tokenizer.json"].decode()
    vocab = json.loads(tok_json)["model"]["vocab"]
    for added in json.loads(tok_json)["added_tokens"]:
        vocab[added["content"]] = added["id"]
    return manifest, tok_json, vocab, ids_from_bytes(members["train.u16"]), ids_from_bytes(members["held-out.u16"])


class CorpusLanguage(object):
    """A real-text language (module docstring). Prompt sets are held-out windows, decoded to text."""

    def __init__(self, kind: str):
        if kind not in KINDS:
            raise ValueError("not a corpus language: %s" % kind)
        self.kind = kind
        self.manifest, self.tokenizer_json, vocab, self.train_ids, self.held_ids = _load(kind)
        self.vocab_size = self.manifest["tokenizer"]["vocab"]
        self.specials = list(SPECIALS)
        self.mask_id = MASK_ID
        self.id_to_token = {i: t for t, i in vocab.items()}
        self._bytes = byte_decoder()
        self._tok = None

    # ---- tokens <-> text ---------------------------------------------------------------------------

    def decode(self, ids) -> str:
        """Text of token ids (specials as their text, which the tokenizer reads back as the special)."""
        out, pending = [], bytearray()
        for i in ids:
            t = self.id_to_token[int(i)]
            if int(i) < len(SPECIALS):
                out.append(pending.decode("utf-8", errors="replace"))
                pending = bytearray()
                out.append(t)
            else:
                pending.extend(self._bytes[c] for c in t)
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def tokenizer(self):
        if self._tok is None:
            from tokenizers import Tokenizer

            self._tok = Tokenizer.from_str(self.tokenizer_json)
        return self._tok

    def encode(self, text: str) -> list:
        """Token ids of text, as the server's tokenizer gives them (no BOS)."""
        return self.tokenizer().encode(text, add_special_tokens=False).ids

    def save_tokenizer(self, path: str):
        """The tokenizer as transformers' PreTrainedTokenizerFast (tokenizer.json + tokenizer_config.json)."""
        from transformers import PreTrainedTokenizerFast

        os.makedirs(path, exist_ok=True)
        ptok = PreTrainedTokenizerFast(
            tokenizer_object=self.tokenizer(),
            eos_token=SPECIALS[0],
            pad_token=SPECIALS[0],
            additional_special_tokens=SPECIALS[1:],
        )
        ptok.save_pretrained(path)
        return ptok

    # ---- text ----------------------------------------------------------------------------------------

    def sample_ids(self, n: int, rng: random.Random) -> list:
        """A random window of n training tokens."""
        start = rng.randrange(len(self.train_ids) - n + 1)
        return self.train_ids[start : start + n].tolist()

    def held_out_window(self, rng: random.Random, length: int, within_file: bool = True) -> list:
        """A random window of `length` held-out token ids (inside one file unless within_file is False)."""
        held = self.held_ids
        for _try in range(1000):
            start = rng.randrange(len(held) - length + 1)
            window = held[start : start + length].tolist()
            if not within_file or EOT not in window:
                return window
        raise ValueError("no held-out window of %d tokens in one file" % length)

    def greedy_prompts(self, n: int = 64, seed: int = 7, lo: int = 12, hi: int = 40) -> list:
        """n held-out windows of lo..hi tokens (inside one file), decoded: the servers' greedy prompts."""
        rng = random.Random(seed)
        return [self.decode(self.held_out_window(rng, rng.randint(lo, hi))) for _i in range(n)]

    def branch_prompts(self, n: int = 8, seed: int = 11, lo: int = 10, hi: int = 30) -> list:
        """n held-out windows of lo..hi tokens ending with a line break (the next token opens a line: a
        branch point of real text), decoded."""
        rng = random.Random(seed)
        out = []
        while len(out) < n:
            window = self.held_out_window(rng, hi)
            ends = [e for e in range(lo, hi + 1) if self.decode(window[e - 1 : e]).endswith("\n")]
            if ends:
                out.append(self.decode(window[: rng.choice(ends)]))
        return out

    def long_prompts(self, n: int = 16, seed: int = 17, lo: int = 1024, hi: int = 4096) -> list:
        """n held-out windows of lo..hi tokens (they may run over a file's end: <|endoftext|> between
        files), decoded: long prompts for real-traffic checks."""
        rng = random.Random(seed)
        return [self.decode(self.held_out_window(rng, rng.randint(lo, hi), within_file=False)) for _i in range(n)]
