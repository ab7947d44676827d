"""A synthetic language whose continuations branch, and the prompt sets of the device scenario.

Tokens: 4 specials (<|endoftext|>, <|im_start|>, <|im_end|>, <|MASK|>) then words w0..w507 (ids 4..511).
Text is a chain of phrases (fixed word sequences, 5 to 9 words, each with its own first word). After
phrase a comes one of three successor phrases with probabilities 0.6 / 0.3 / 0.1: at every phrase
boundary the next-token distribution has three modes. A target trained on it continues greedily with
the 0.6 successor; sampled at T = 1 it branches. Everything here is plain Python, seeded, so the device
and this machine build the same language and the same prompts.

Two kinds (SYNTH_LANG, default `phrases`), with the same phrases, successors and prompts' lengths:
- `phrases`: which successor gets 0.6 depends on the current phrase only. A greedy continuation from any
  start falls into one fixed loop of phrases, which a drafter learns by heart: its misses are spread over
  its deep positions rather than split between a few candidates.
- `pairs`: which successor gets 0.6, 0.3 and 0.1 depends on the phrase before the current one too (a
  seeded order per pair of phrases; a text's first phrase, with none before it, uses the `phrases`
  order). A target reads the phrase before from its context; a drafter that has learned only the
  current phrase's successors sees three candidates at a boundary, one of them the target's choice: the
  kind of miss a tree with siblings recovers (real drafters miss so at branch points of real text).

Real text (SYNTH_LANG=code|prose): Language() is the one entry point for every kind; for `code` (CPython
3.11's standard library sources as Debian 12 ships them) and `prose` (the Python 3.11 documentation's reST
sources, Debian's python3.11-doc) it returns a corpus_lang.CorpusLanguage: token ids of a byte-level BPE
(vocab 4096, the same four specials at ids 0..3, MASK_ID 3) read from the bundle make_corpus.py builds,
with prompts taken from held-out files. Every language offers what the harness uses: `kind`,
`vocab_size`, `specials`, `mask_id`, sample_ids(n, rng), encode(text), decode(ids), greedy_prompts(n,
seed), branch_prompts(n, seed), long_prompts(n, seed, lo, hi), save_tokenizer(path); the synthetic kinds'
prompts and tokenizer are the module-level functions below, unchanged.
"""

import os
import random

VOCAB = 512
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
MASK_ID = 3
N_WORDS = VOCAB - len(SPECIALS)
N_PHRASES = 48
BRANCH_P = (0.6, 0.3, 0.1)
LANG_SEED = 20261130
SYNTH_KINDS = ("phrases", "pairs")
CORPUS_KINDS = ("code", "prose")  # corpus_lang.py
KINDS = SYNTH_KINDS + CORPUS_KINDS


def kind_from_env():
    """The language kind SYNTH_LANG names (default `phrases`); an unknown name is refused."""
    kind = os.environ.get("SYNTH_LANG", "phrases")
    if kind not in KINDS:
        raise SystemExit("SYNTH_LANG=%s: not a language kind; use one of %s" % (kind, ", ".join(KINDS)))
    return kind


def word(i):
    return "w%d" % i


def token_id(w):
    return len(SPECIALS) + int(w[1:])


class Language(object):
    """A synthetic language (`phrases`, `pairs`); for a real-text kind (`code`, `prose`) the constructor
    returns a corpus_lang.CorpusLanguage instead (same interface: module docstring)."""

    vocab_size = VOCAB
    specials = SPECIALS
    mask_id = MASK_ID

    def __new__(cls, seed=LANG_SEED, kind=None):
        kind = kind or kind_from_env()
        if kind in CORPUS_KINDS:
            import corpus_lang

            return corpus_lang.CorpusLanguage(kind)
        if kind not in SYNTH_KINDS:
            raise SystemExit("SYNTH_LANG=%s: not a language kind; use one of %s" % (kind, ", ".join(KINDS)))
        return super().__new__(cls)

    def __init__(self, seed=LANG_SEED, kind=None):
        self.kind = kind or kind_from_env()
        rng = random.Random(seed)
        firsts = rng.sample(range(N_WORDS), N_PHRASES)
        self.phrases = []
        for p in range(N_PHRASES):
            n = rng.randint(5, 9)
            self.phrases.append([firsts[p]] + [rng.randrange(N_WORDS) for _i in range(n - 1)])
        self.succ = []
        for p in range(N_PHRASES):
            self.succ.append(rng.sample([q for q in range(N_PHRASES) if q != p], 3))
        # pairs: the successors of p after a, most likely first (a separate stream: phrases and
        # successors stay those of `phrases`)
        self.pair_order = {}
        if self.kind == "pairs":
            prng = random.Random(seed + 1)
            for a in range(N_PHRASES):
                for p in range(N_PHRASES):
                    self.pair_order[(a, p)] = [self.succ[p][i] for i in prng.sample(range(3), 3)]

    def successors(self, p, prev=None):
        """p's successors, the 0.6 one first: after `prev` for `pairs` (when known)."""
        return self.pair_order.get((prev, p), self.succ[p])

    def next_phrase(self, p, rng, prev=None):
        u = rng.random()
        acc = 0.0
        order = self.successors(p, prev)
        for q, w in zip(order, BRANCH_P):
            acc += w
            if u < acc:
                return q
        return order[-1]

    def sample_words(self, n, rng, start=None):
        """n words of text from a random phrase (or `start`), beginning at a random offset in it.
        Returns (word indices, [(phrase, offset)] per word)."""
        p = rng.randrange(N_PHRASES) if start is None else start
        off = rng.randrange(len(self.phrases[p])) if start is None else 0
        out, where, prev = [], [], None
        while len(out) < n:
            out.append(self.phrases[p][off])
            where.append((p, off))
            off += 1
            if off == len(self.phrases[p]):
                p, prev, off = self.next_phrase(p, rng, prev), p, 0
        return out, where

    @staticmethod
    def pair_boundaries(where):
        """(i, prev, cur) for each word i of a text that starts a phrase after phrase `cur`, which itself
        followed phrase `prev`: the boundaries whose pair is known (`where` as sample_words returns it)."""
        starts = [i for i in range(1, len(where)) if where[i][1] == 0]
        return [(here, where[before - 1][0], where[here - 1][0]) for before, here in zip(starts, starts[1:])]

    def sample_ids(self, n, rng):
        ws = self.sample_words(n, rng)[0]
        return [len(SPECIALS) + w for w in ws]

    # the interface every language offers (corpus_lang.CorpusLanguage too)

    @staticmethod
    def encode(text):
        """Token ids of a text of words and specials (what the word-level tokenizer gives)."""
        return [SPECIALS.index(w) if w in SPECIALS else token_id(w) for w in text.split()]

    @staticmethod
    def decode(ids):
        return to_text(ids)

    def greedy_prompts(self, n=64, seed=7):
        return greedy_prompts(self, n, seed)

    def branch_prompts(self, n=8, seed=11):
        return branch_prompts(self, n, seed)

    def long_prompts(self, n=16, seed=17, lo=1024, hi=4096):
        """n texts of lo..hi words (a seed the training never uses)."""
        rng = random.Random(seed)
        return [to_text(self.sample_ids(rng.randint(lo, hi), rng)) for _i in range(n)]

    @staticmethod
    def save_tokenizer(path):
        return make_tokenizer(path)


def to_text(ids):
    return " ".join(SPECIALS[i] if i < len(SPECIALS) else word(i - len(SPECIALS)) for i in ids)


def greedy_prompts(lang, n=64, seed=7, lo=12, hi=40):
    """Held-out prompts (a seed the training never uses), ending anywhere in a phrase. (A real-text language
    gives its own: lang.greedy_prompts.)"""
    if lang.kind not in SYNTH_KINDS:
        return lang.greedy_prompts(n, seed, lo, hi)
    rng = random.Random(seed)
    return [to_text(lang.sample_ids(rng.randint(lo, hi), rng)) for _i in range(n)]


def branch_prompts(lang, n=8, seed=11, lo=10, hi=30):
    """Prompts ending one word before a phrase's end: the first generated token closes the phrase
    (from the prefill), the second is the 0.6 / 0.3 / 0.1 branch, produced through speculation. (A real-text
    language gives its own: lang.branch_prompts.)"""
    if lang.kind not in SYNTH_KINDS:
        return lang.branch_prompts(n, seed, lo, hi)
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        ws, where = lang.sample_words(rng.randint(lo, hi) + 12, rng)
        for i in range(len(ws) - 1, lo, -1):
            p, off = where[i]
            if off == len(lang.phrases[p]) - 2 and i + 1 <= hi:
                out.append(to_text([len(SPECIALS) + w for w in ws[: i + 1]]))
                break
    return out


def make_tokenizer(path):
    """The word-level tokenizer (specials, then w0..w507) as transformers' PreTrainedTokenizerFast, saved."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for i in range(N_WORDS):
        vocab[word(i)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    ptok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    ptok.save_pretrained(path)
    return ptok
