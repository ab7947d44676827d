"""Build the real-text corpus bundles the `code` and `prose` languages read (corpus_lang.py).

Usage: python make_corpus.py [--lang code|prose|all] [--out DIR] [--check]
  writes DIR/<lang>.tar.xz (default DIR: tests/gpu_sglang/corpora, tracked in git: it travels to the device
  with the tree). --check rebuilds in memory and compares with the bundle on disk byte for byte.
  Needs the HF `tokenizers` library (the overlay venv has it) and the sources below on this machine.

Decisions (also in README.md, "Real-text languages"):
* code: CPython 3.11's standard library as Debian 12 ships it (packages libpython3.11-minimal and
  libpython3.11-stdlib, /usr/lib/python3.11/**/*.py): real, diverse, human-written Python under the PSF
  licence. Left out: test/ and tests/ (test suites), idlelib/, lib2to3/, site-/dist-packages, and generated
  tables (encodings/ codec tables, pydoc_data/topics.py, re/_casefix.py, html/entities.py, stringprep.py,
  token.py, keyword.py, _sysconfigdata*).
* prose: English prose from Debian's python3.11-doc package (`apt-get install -y python3.11-doc`): the
  reST sources (`*.rst.txt`) of the tutorial, howto, faq, whatsnew and library reference under
  /usr/share/doc/python3.11/html/_sources/, markup kept as written.
* Selection: the eligible files in the order of a stable hash of their relative path (sha256 of
  SALT + path), taken while the text stays under CAP_BYTES; then sorted by path. Deterministic: the same
  package version gives the same selection.
* Held-out split by file: a file is held out when the sha256 of "held-out:" + its relative path, read as a
  number, is below HELD_OUT_PCT percent of the range (about 5 % of the files). The prompts the servers are
  measured with come from held-out files only, so none of them appears in training.
* Tokenizer: byte-level BPE trained with `tokenizers` on the training files, vocab VOCAB (4096), the four
  specials of synth_lang first at ids 0..3 (<|endoftext|>, <|im_start|>, <|im_end|>, <|MASK|>: MASK_ID 3);
  the GPT-2 pre-tokenizer regex, no prefix space, no post-processor (no BOS added).
* Token ids: each split's files in path order, encoded one by one and joined with <|endoftext|> (id 0),
  stored as raw little-endian uint16 (train.u16, held-out.u16); the manifest gives each held-out file's
  token span.
* Bundle: an xz-compressed tar (mtime 0, uid/gid 0, sorted names, preset 9) of manifest.json,
  tokenizer.json, train.u16, held-out.u16: running this twice gives byte-identical bundles (with the same
  `tokenizers` version, which the manifest records).
"""

import argparse
import array
import hashlib
import io
import json
import lzma
import os
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPORA = os.path.join(HERE, "corpora")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]  # synth_lang.SPECIALS
VOCAB = 4096
HELD_OUT_PCT = 5
SALT = "ddtree-corpus-2026"
XZ_PRESET = 9

SOURCES = {
    "code": {
        "root": "/usr/lib/python3.11",
        "suffix": ".py",
        "packages": ("libpython3.11-minimal", "libpython3.11-stdlib"),
        "cap_bytes": 3_000_000,
        "licence": "PSF-2.0 (CPython standard library)",
    },
    "prose": {
        "root": "/usr/share/doc/python3.11/html/_sources",
        "suffix": ".rst.txt",
        "packages": ("python3.11-doc",),
        "cap_bytes": 3_000_000,
        "licence": "PSF-2.0 (Python documentation)",
        "dirs": ("tutorial", "howto", "faq", "whatsnew", "library"),
    },
}
LANGS = tuple(SOURCES)

# code: whole trees and files left out (tests, IDLE, 2to3, installed packages, generated tables)
CODE_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "encodings", "__pycache__"}
CODE_SKIP_FILES = {
    "pydoc_data/topics.py",
    "re/_casefix.py",
    "html/entities.py",
    "stringprep.py",
    "token.py",
    "keyword.py",
}
CODE_SKIP_PREFIXES = ("_sysconfigdata", "config-3.11")


def eligible(lang: str, rel: str) -> bool:
    """Whether the file at `rel` (relative to the source root, '/'-separated) belongs to the corpus."""
    src = SOURCES[lang]
    if not rel.endswith(src["suffix"]):
        return False
    parts = rel.split("/")
    if lang == "code":
        if any(p in CODE_SKIP_DIRS or p.startswith(CODE_SKIP_PREFIXES) for p in parts):
            return False
        return rel not in CODE_SKIP_FILES
    return parts[0] in src["dirs"]


def stable_rank(tag: str, rel: str) -> int:
    return int(hashlib.sha256((tag + rel).encode()).hexdigest()[:16], 16)


def is_held_out(rel: str) -> bool:
    """The held-out split, by file: about HELD_OUT_PCT % of the files."""
    return stable_rank("held-out:", rel) * 100 < HELD_OUT_PCT * (1 << 64)


def split_files(paths: list) -> tuple:
    """(training paths, held-out paths), each in the given order; disjoint, together all of `paths`."""
    return [p for p in paths if not is_held_out(p)], [p for p in paths if is_held_out(p)]


def select_files(lang: str) -> list:
    """[(relative path, bytes)] of the corpus, sorted by path (module docstring: Selection)."""
    root = SOURCES[lang]["root"]
    if not os.path.isdir(root):
        hint = " (apt-get install -y python3.11-doc)" if lang == "prose" else ""
        raise SystemExit("%s: no %s%s" % (lang, root, hint))
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if eligible(lang, rel) and not os.path.islink(os.path.join(dirpath, name)):
                found.append(rel)
    chosen, total = [], 0
    for rel in sorted(found, key=lambda r: stable_rank(SALT, r)):
        with open(os.path.join(root, rel), "rb") as fh:
            data = fh.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not data.strip():  # empty files (package __init__.py) hold no text
            continue
        if total + len(data) > SOURCES[lang]["cap_bytes"]:
            continue
        chosen.append((rel, data))
        total += len(data)
    return sorted(chosen)


def package_versions(packages) -> dict:
    import subprocess

    out = {}
    for pkg in packages:
        try:
            res = subprocess.run(
                ["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True, check=False
            )
            out[pkg] = res.stdout.strip() or None
        except OSError:
            out[pkg] = None
    return out


def train_tokenizer(texts: list):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            raise SystemExit("special %s got id %s, not %d" % (s, tok.token_to_id(s), i))
    if tok.get_vocab_size() > VOCAB or tok.get_vocab_size() > 65535:
        raise SystemExit("vocab %d" % tok.get_vocab_size())
    return tok


def encode_docs(tok, texts: list) -> tuple:
    """(ids of the texts joined by <|endoftext|>, [(start, end)] of each text's ids)."""
    ids, spans = array.array("H"), []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        if ids:
            ids.append(0)
        spans.append((len(ids), len(ids) + len(enc.ids)))
        ids.extend(enc.ids)
    return ids, spans


def le_bytes(ids: array.array) -> bytes:
    out = array.array("H", ids)
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def pack(members: dict) -> bytes:
    """A deterministic .tar.xz of {name: bytes}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(members[name]), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(members[name]))
    return lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)


def build(lang: str) -> bytes:
    import tokenizers

    files = select_files(lang)
    texts = {rel: data.decode("utf-8") for rel, data in files}
    train, held = split_files([rel for rel, _d in files])
    tok = train_tokenizer([texts[r] for r in train])
    train_ids, _spans = encode_docs(tok, [texts[r] for r in train])
    held_ids, held_spans = encode_docs(tok, [texts[r] for r in held])
    src = SOURCES[lang]
    span_of = dict(zip(held, held_spans))
    manifest = {
        "language": lang,
        "source": {"root": src["root"], "packages": package_versions(src["packages"]), "licence": src["licence"]},
        "selection": {"cap_bytes": src["cap_bytes"], "salt": SALT, "held_out_pct": HELD_OUT_PCT},
        "tokenizer": {"kind": "byte-level BPE", "vocab": tok.get_vocab_size(), "specials": SPECIALS, "mask_id": 3},
        "tokenizers_version": tokenizers.__version__,
        "tokens": {"train": len(train_ids), "held_out": len(held_ids)},
        "bytes": {
            "train": sum(len(texts[r].encode()) for r in train),
            "held_out": sum(len(texts[r].encode()) for r in held),
        },
        "files": [
            {
                "path": rel,
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
                "split": "held-out" if rel in span_of else "train",
                **({"span": list(span_of[rel])} if rel in span_of else {}),
            }
            for rel, data in files
        ],
    }
    members = {
        "manifest.json": json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n",
        "tokenizer.json": tok.to_str(pretty=False).encode(),
        "train.u16": le_bytes(train_ids),
        "held-out.u16": le_bytes(held_ids),
    }
    return pack(members)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--lang", default="all", choices=LANGS + ("all",))
    ap.add_argument("--out", default=CORPORA)
    ap.add_argument("--check", action="store_true", help="compare a rebuild with the bundle on disk")
    args = ap.parse_args(argv)
    bad = 0
    for lang in LANGS if args.lang == "all" else (args.lang,):
        data = build(lang)
        path = os.path.join(args.out, "%s.tar.xz" % lang)
        if args.check:
            with open(path, "rb") as fh:
                same = fh.read() == data
            print("%s: %s" % (path, "identical" if same else "DIFFERS"))
            bad += not same
            continue
        os.makedirs(args.out, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        print("%s: %d bytes" % (path, len(data)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
