"""The health gate's records on the host: baseline and metrics documents, read and written whole."""

import os

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import (
    baseline_add,
    baseline_key,
    baseline_lookup,
    decoding_family,
    metrics_add,
    previous_metrics,
    read_json,
    write_json,
)

KEY = "coder | DFLASH | tp 1 | sglang 0.5.23"


def test_baseline_document_is_keyed_by_baseline_key_max_tokens_and_prompt():
    document = baseline_add(None, KEY, "p1", 64, {"text": "a"})
    document = baseline_add(document, KEY, "p2", 64, {"text": "b"})
    document = baseline_add(document, KEY, "p1", 32, {"text": "c"})
    assert document["format"] == 2
    assert baseline_lookup(document, KEY, "p1", 64) == {"text": "a"}
    assert baseline_lookup(document, KEY, "p1", 32) == {"text": "c"}
    assert baseline_lookup(document, "coder | NONE | tp 1 | sglang 0.5.23", "p1", 64) is None
    assert baseline_lookup(None, KEY, "p1", 64) is None


def test_a_format_1_document_keyed_by_model_alone_matches_no_key_and_is_kept():
    old = {"format": 1, "baselines": {"coder": {"64": {"p1": {"text": "a"}}}}}
    assert baseline_lookup(old, KEY, "p1", 64) is None
    document = baseline_add(old, KEY, "p1", 64, {"text": "b"})
    assert document["baselines"]["coder"] == old["baselines"]["coder"] and document["format"] == 2


@pytest.mark.parametrize(
    "algorithm, family",
    [
        (None, "NONE"),
        ("DFLASH", "DFLASH"),
        ("DDTREE", "DFLASH"),
        ("ddtree", "DFLASH"),
        ("EAGLE", "EAGLE"),
        ("NEXTN", "EAGLE"),
        ("EAGLE3", "EAGLE3"),
        ("NGRAM", "NGRAM"),
    ],
)
def test_decoding_family(algorithm, family):
    assert decoding_family(algorithm) == family


def test_baseline_key_from_server_info():
    # /server_info of real SGLang 0.5.23 serving DDTREE (H200): it reports the resolved algorithm, DFLASH.
    info = {"speculative_algorithm": "DFLASH", "tp_size": 1, "version": "0.5.23", "model_path": "/m"}
    assert baseline_key("coder", info) == {
        "key": KEY,
        "model": "coder",
        "family": "DFLASH",
        "tp_size": 1,
        "version": "0.5.23",
    }
    assert baseline_key("coder", {"speculative_algorithm": None, "tp_size": 2, "version": "0.5.23"})["key"] == (
        "coder | NONE | tp 2 | sglang 0.5.23"
    )
    assert baseline_key("coder", None)["key"] == "coder | ? | tp ? | sglang ?"


def test_metrics_document_keeps_the_last_records_per_key():
    document = None
    for index in range(5):
        document = metrics_add(document, {"key": KEY if index % 2 == 0 else "chat", "tokens_per_second": index}, keep=4)
    assert len(document["records"]) == 4
    assert previous_metrics(document, KEY)["tokens_per_second"] == 4
    assert previous_metrics(document, "chat")["tokens_per_second"] == 3
    assert previous_metrics(None, KEY) is None
    # Records of format 1 have no key: NONE's tokens/s are no yardstick for DFLASH's.
    assert previous_metrics({"format": 1, "records": [{"model": "coder", "tokens_per_second": 9}]}, KEY) is None


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
