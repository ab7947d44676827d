"""The health gate's records on the host: baseline and metrics documents, read and written whole."""

import os

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import (
    baseline_add,
    baseline_lookup,
    metrics_add,
    previous_metrics,
    read_json,
    write_json,
)


def test_baseline_document_is_keyed_by_model_max_tokens_and_prompt():
    document = baseline_add(None, "coder", "p1", 64, {"text": "a"})
    document = baseline_add(document, "coder", "p2", 64, {"text": "b"})
    document = baseline_add(document, "coder", "p1", 32, {"text": "c"})
    assert document["format"] == 1
    assert baseline_lookup(document, "coder", "p1", 64) == {"text": "a"}
    assert baseline_lookup(document, "coder", "p1", 32) == {"text": "c"}
    assert baseline_lookup(document, "other", "p1", 64) is None
    assert baseline_lookup(None, "coder", "p1", 64) is None


def test_metrics_document_keeps_the_last_records_per_model():
    document = None
    for index in range(5):
        document = metrics_add(document, {"model": "coder" if index % 2 == 0 else "chat", "tokens_per_second": index}, keep=4)
    assert len(document["records"]) == 4
    assert previous_metrics(document, "coder")["tokens_per_second"] == 4
    assert previous_metrics(document, "chat")["tokens_per_second"] == 3
    assert previous_metrics(None, "coder") is None


def test_documents_are_written_whole_and_read_back(tmp_path):
    path = str(tmp_path / "coder" / "metrics.json")
    assert read_json(path) is None
    moves = []

    def atomic_move(source, destination):
        moves.append(destination)
        os.replace(source, destination)

    write_json(path, {"format": 1, "records": [{"model": "coder", "text": "今日は"}]}, atomic_move)
    assert moves == [path] and os.listdir(str(tmp_path / "coder")) == ["metrics.json"]
    assert read_json(path) == {"format": 1, "records": [{"model": "coder", "text": "今日は"}]}
    with open(path, "w") as handle:
        handle.write("{not json")
    with pytest.raises(ValueError):
        read_json(path)
