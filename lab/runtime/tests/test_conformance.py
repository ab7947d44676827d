"""The lab runtime answers like real SGLang 0.5.23 (tests/fixtures/sglang-conformance/ holds its answers).

The same requests (tests/gpu_sglang/record_conformance.py, the recorder that made the fixtures) go to a
lab DDTREE runtime; each answer is compared with the real one: status, Content-Type, JSON field names
(recursively; the texts differ, the models do), error types and messages, the order and shape of the
streamed chunks, finish_reason, matched_stop, the model field, and usage counted as SGLang counts it.
What the lab cannot do it refuses with SGLang's error shape (REFUSED).
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from ._harness import DRAFT, Runtime, make_lab_stack_shadow

REPO = pathlib.Path(__file__).resolve().parents[3]
REAL = REPO / "tests" / "fixtures" / "sglang-conformance"
sys.path.insert(0, str(REPO / "tests" / "gpu_sglang"))
import record_conformance  # noqa: E402

# Cases the lab answers with a 400 of SGLang's error shape instead of what SGLang does.
REFUSED = {
    "chat_logprobs": "logprobs are not supported by the lab runtime",
    "completions_logprobs": "logprobs are not supported by the lab runtime",
}
# Cases whose error message the lab copies word for word.
SAME_MESSAGE = {"chat_empty_messages", "chat_max_tokens_negative", "completions_empty_prompt", "chat_text_plain"}
NOT_COMPARED = {"server_info", "chat_without_chat_template", "health"}  # server_args differ; no template case


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conformance")
    runtime = Runtime(
        "ddtree",
        tmp,
        ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", DRAFT],
        pythonpath=[make_lab_stack_shadow(tmp)],
    )
    try:
        assert runtime.wait_for("The server is fired up and ready to roll!"), runtime.log()[-4000:]
        record_conformance.record_all(runtime.url(""), str(tmp / "lab"))
        yield tmp / "lab"
    finally:
        runtime.kill()


def load(directory, name):
    return json.loads((directory / (name + ".json")).read_text())


def keys(value):
    """The field names of a JSON value, recursively (lists: the union over their items)."""
    if isinstance(value, dict):
        return {key: keys(item) for key, item in value.items()}
    if isinstance(value, list):
        merged = {}
        for item in value:
            shape = keys(item)
            if isinstance(shape, dict):
                merged.update(shape)
        return [merged] if merged else []
    return None


def kind(chunk):
    """What a streamed chunk is: role | text | finish | usage | done."""
    if chunk == "[DONE]":
        return "done"
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    if choice.get("finish_reason"):
        return "finish"
    if "role" in choice.get("delta", {}):
        return "role"
    return "text"


def collapse(kinds):
    out = []
    for item in kinds:
        if not out or out[-1] != item or item != "text":
            out.append(item)
    return out


CASES = sorted(
    path.stem for path in REAL.glob("*.json") if not path.stem.startswith("_") and path.stem not in NOT_COMPARED
)


@pytest.mark.parametrize("name", CASES)
def test_the_lab_answers_like_sglang(answers, name):
    real, lab = load(REAL, name), load(answers, name)
    if name in REFUSED:
        assert lab["status"] == 400 and lab["body"]["message"] == REFUSED[name]
        assert keys(lab["body"]) == keys(load(REAL, "chat_empty_messages")["body"])  # SGLang's error shape
        return
    assert lab["status"] == real["status"], lab
    assert (lab["content_type"] or "").split(";")[0] == (real["content_type"] or "").split(";")[0]
    if "events" in real:
        real_kinds = collapse([kind(chunk) for chunk in real["events"]])
        lab_kinds = collapse([kind(chunk) for chunk in lab["events"]])
        assert lab_kinds == real_kinds
        for real_chunk, lab_chunk in zip(by_kind(real["events"]), by_kind(lab["events"])):
            assert keys(lab_chunk) == keys(real_chunk), (lab_chunk, real_chunk)
        return
    body, real_body = lab["body"], real["body"]
    if isinstance(real_body, dict) and "metadata" in real_body:
        # SGLang 0.5.23 adds metadata.weight_versions (per-token spans); the lab reports weight_version only.
        real_body = dict(real_body, metadata={"weight_version": real_body["metadata"]["weight_version"]})
    if name.startswith("generate") or name == "models":
        assert set(body) <= set(real_body) | {"meta_info"}
        return
    assert keys(body) == keys(real_body), (body, real_body)
    if real_body.get("object") == "error":
        assert body["type"] == real_body["type"]
        if name in SAME_MESSAGE:
            assert body["message"] == real_body["message"]
        else:
            assert body["message"].split("{")[0] == real_body["message"].split("{")[0]  # "1 validation error:"
    for real_choice, lab_choice in zip(real_body.get("choices", []), body.get("choices", [])):
        assert lab_choice["finish_reason"] == real_choice["finish_reason"]
        assert (lab_choice["matched_stop"] is None) == (real_choice["matched_stop"] is None)


def by_kind(events):
    """One chunk of each kind, in stream order (the first of each)."""
    seen = {}
    for chunk in events:
        seen.setdefault(kind(chunk), chunk)
    return [seen[name] for name in ("role", "text", "finish", "usage") if name in seen]


def test_the_model_field_echoes_the_request(answers):
    assert load(answers, "chat_other_model_name")["body"]["model"] == "some-client-name"
    assert load(answers, "chat_no_model")["body"]["model"] == load(REAL, "chat_no_model")["body"]["model"] == "default"


def test_usage_stops_at_the_stop_string_under_speculative_decoding(answers):
    # SGLang counts the tokens up to the one that completed the stop string (real: 5 words + the stop
    # word = 6), not the whole accepted block. The lab's tokens are bytes, so that is the bytes of the
    # text and of the stop string.
    real = load(REAL, "completions_stop")["body"]
    assert real["usage"]["completion_tokens"] == len(
        (real["choices"][0]["text"] + real["choices"][0]["matched_stop"]).split()
    )
    for name in ("completions_stop", "chat_stop"):
        body = load(answers, name)["body"]
        choice = body["choices"][0]
        text = choice.get("text", choice.get("message", {}).get("content"))
        assert choice["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == len((text + choice["matched_stop"]).encode())


def test_streams_never_send_part_of_the_stop_string(answers):
    for name in ("chat_stop_stream_usage", "completions_stop_stream"):
        events = [chunk for chunk in load(answers, name)["events"] if chunk != "[DONE]" and chunk["choices"]]
        text = "".join(
            c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "" for c in events
        )
        stop = [c["choices"][0]["matched_stop"] for c in events if c["choices"][0].get("finish_reason")][0]
        assert stop and stop not in text and not any(text.endswith(stop[:k]) for k in range(1, len(stop)))


def test_usage_only_with_include_usage_and_then_as_its_own_chunk(answers):
    for name in ("chat_stream", "completions_stream"):
        events = [chunk for chunk in load(answers, name)["events"] if chunk != "[DONE]"]
        assert all(chunk.get("usage") is None for chunk in events) and all(chunk["choices"] for chunk in events)
    for name in ("chat_stream_usage", "completions_stream_usage"):
        events = [chunk for chunk in load(answers, name)["events"] if chunk != "[DONE]"]
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 24
        assert all(chunk.get("usage") is None for chunk in events[:-1])


def test_n_choices_count_every_completion_once_and_the_prompt_once(answers):
    for name in ("chat_n2", "completions_n2"):
        real, lab = load(REAL, name)["body"], load(answers, name)["body"]
        assert len(lab["choices"]) == len(real["choices"]) == 2
        assert lab["usage"]["completion_tokens"] == 2 * 24 == real["usage"]["completion_tokens"]
