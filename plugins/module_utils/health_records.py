# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's records on the host: baselines and metrics, as JSON documents.

Baselines: {"format": 2, "baselines": {key: {str(max_tokens): {prompt: {"text", ...}}}}}, key from
baseline_key (model, decoding family, tensor parallelism, SGLang version: docs/health-gate.md, "The
baseline policy", says why). Format-1 documents (keyed by model alone) are read; their entries match no
key, so the next passing release records its own.
Metrics: {"format": 2, "records": [{model, key, release_id, recorded_at, tokens_per_second, accept_length, ...}]}.
Documents are read whole and written whole (atomically), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import tempfile

FILE_FORMAT = 2

# SGLang's speculative algorithm -> the family whose greedy outputs are comparable (docs/decisions/
# baseline-families.md): DDTREE's greedy outputs equal DFLASH's (both run the multi-token verify forward),
# while both may differ from NONE's (bf16 verify forward against one-token decode). DDTREE reports
# itself as DFLASH in /server_info already (it resolves as DFLASH with tree verification); the entry keeps
# a server that reports the name it was asked for in the same family. NEXTN is SGLang's alias of EAGLE.
ALGORITHM_FAMILIES = {"DDTREE": "DFLASH", "NEXTN": "EAGLE"}


def decoding_family(algorithm) -> str:
    """A speculative algorithm name (None: no speculative decoding) -> its decoding family."""
    name = str(algorithm).upper() if algorithm else "NONE"
    return ALGORITHM_FAMILIES.get(name, name)


def baseline_key(model: str, server_info: dict | None) -> dict:
    """What a greedy baseline is valid for, read from SGLang's /server_info answer.

    -> {"key": "MODEL | DFLASH | tp 1 | sglang 0.5.23", "model", "family", "tp_size", "version"}.
    A part that /server_info did not answer is "?" (such outputs are then compared only with outputs of a
    server that also did not answer it).
    """
    info = server_info if isinstance(server_info, dict) else {}
    known = bool(info)
    family = decoding_family(info.get("speculative_algorithm")) if known else "?"
    tp_size = info.get("tp_size") if info.get("tp_size") is not None else "?"
    version = info.get("version") or "?"
    key = "%s | %s | tp %s | sglang %s" % (model, family, tp_size, version)
    return {"key": key, "model": model, "family": family, "tp_size": tp_size, "version": version}


def baseline_lookup(document: dict | None, key: str, prompt: str, max_tokens: int) -> dict | None:
    """The baseline entry for (key, max_tokens, prompt), or None. key: baseline_key(...)["key"]."""
    return (((document or {}).get("baselines") or {}).get(key) or {}).get(str(max_tokens), {}).get(prompt)


def baseline_add(document: dict | None, key: str, prompt: str, max_tokens: int, entry: dict) -> dict:
    """A copy of the document with this entry set (other keys' entries kept)."""
    document = {"format": FILE_FORMAT, "baselines": dict((document or {}).get("baselines") or {})}
    per_key = dict(document["baselines"].get(key) or {})
    per_length = dict(per_key.get(str(max_tokens)) or {})
    per_length[prompt] = entry
    per_key[str(max_tokens)] = per_length
    document["baselines"][key] = per_key
    return document


def previous_metrics(document: dict | None, key: str) -> dict | None:
    """The last metrics recorded under this baseline key (baseline_key(...)["key"]: NONE's tokens/s are no
    yardstick for DFLASH's) in a metrics document {"format": 2, "records": [...]}."""
    for record in reversed((document or {}).get("records") or []):
        if record.get("key") == key:
            return record
    return None


def metrics_add(document: dict | None, record: dict, keep: int = 50) -> dict:
    """A copy of the metrics document with record appended (the last `keep` records kept)."""
    records = list((document or {}).get("records") or []) + [record]
    return {"format": FILE_FORMAT, "records": records[-keep:]}


def read_json(path: str | None) -> dict | None:
    """A JSON document on the host, or None when there is no such file. Raises OSError or ValueError
    when it cannot be read or parsed."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def write_json(path: str, document: dict, atomic_move) -> None:
    """Write a document whole: into a temporary file beside it, then atomic_move(temporary, path)
    (AnsibleModule.atomic_move, which keeps the file's SELinux context)."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path))
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle, indent=2, sort_keys=True, ensure_ascii=False)
        handle.write("\n")
    os.chmod(temp, 0o644)
    atomic_move(temp, path)


def append_json_line(path: str, record: dict, mode: int = 0o640) -> None:
    """Append one record to a JSON-lines file (a service's history.jsonl), creating it with `mode` (and its
    directory) when missing. One write of one line: a reader sees the line whole or not at all."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    with os.fdopen(fd, "a") as handle:
        handle.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
