# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's records on the host: baselines and metrics, as JSON documents.

Baselines: {"format": 1, "baselines": {model: {str(max_tokens): {prompt: {"text", ...}}}}}.
Metrics: {"format": 1, "records": [{model, release, recorded_at, tokens_per_second, accept_length, ...}]}.
Documents are read whole and written whole (atomically), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import tempfile

FILE_FORMAT = 1


def baseline_lookup(document: dict | None, model: str, prompt: str, max_tokens: int) -> dict | None:
    """The baseline entry for (model, max_tokens, prompt), or None.

    Document: {"format": 1, "baselines": {model: {str(max_tokens): {prompt: {"text": ..., ...}}}}}.
    """
    return (((document or {}).get("baselines") or {}).get(model) or {}).get(str(max_tokens), {}).get(prompt)


def baseline_add(document: dict | None, model: str, prompt: str, max_tokens: int, entry: dict) -> dict:
    """A copy of the document with this entry set."""
    document = {"format": FILE_FORMAT, "baselines": dict((document or {}).get("baselines") or {})}
    per_model = dict(document["baselines"].get(model) or {})
    per_length = dict(per_model.get(str(max_tokens)) or {})
    per_length[prompt] = entry
    per_model[str(max_tokens)] = per_length
    document["baselines"][model] = per_model
    return document


def previous_metrics(document: dict | None, model: str) -> dict | None:
    """The last recorded metrics for this model in a metrics document {"format": 1, "records": [...]}."""
    for record in reversed((document or {}).get("records") or []):
        if record.get("model") == model:
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
