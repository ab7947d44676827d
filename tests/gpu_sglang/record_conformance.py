"""Record what a server answers to the OpenAI-compatible requests a client sends (conformance fixtures).

Usage: python record_conformance.py BASE_URL OUT_DIR [MODEL]
Sends each case in CASES (chat and completions, streaming with and without include_usage, stop strings,
n > 1, logprobs, malformed requests, unknown routes) and writes OUT_DIR/NAME.json per case:
{"name", "request": {"method", "path", "headers", "body"}, "status", "content_type", "body" (parsed JSON
or text), "events" (a stream's `data:` payloads, parsed, in order; "[DONE]" kept as text)}.
Run on the device against real SGLang 0.5.23 (tests/gpu_sglang/gate_real.py calls it) and here against
the lab runtime; lab/runtime/tests/test_conformance.py compares the lab's answers with the recorded ones.
Only the standard library: it runs in any Python on either machine.
"""

import http.client
import json
import os
import sys
import time
import urllib.parse

PROMPT_WORDS = None  # filled from the server's first answer: a stop string that occurs in the output


def _send(base_url, method, path, body=None, headers=None, raw=None, timeout=120):
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    headers = dict(headers or {})
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if data is not None and "Content-Type" not in headers:
        headers["Content-Type"] = "application/json"
    started = time.monotonic()
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    text = response.read().decode("utf-8", "replace")
    seconds = round(time.monotonic() - started, 3)
    content_type = response.getheader("Content-Type")
    conn.close()
    record = {"status": response.status, "content_type": content_type, "seconds": seconds}
    if content_type and content_type.startswith("text/event-stream"):
        events = []
        for line in text.splitlines():
            if line.startswith("data:"):
                payload = line[5:].strip()
                try:
                    events.append(json.loads(payload))
                except ValueError:
                    events.append(payload)
        record["events"] = events
    else:
        try:
            record["body"] = json.loads(text)
        except ValueError:
            record["body"] = text
    return record


def cases(model, stop):
    """(name, method, path, body or None, extra headers, raw bytes or None). stop: a word in the greedy output."""
    chat = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 0}
    comp = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}

    def w(base, **extra):
        out = dict(base)
        out.update(extra)
        return out

    return [
        ("chat", "POST", "/v1/chat/completions", chat, {}, None),
        ("chat_other_model_name", "POST", "/v1/chat/completions", w(chat, model="some-client-name"), {}, None),
        ("chat_no_model", "POST", "/v1/chat/completions", {k: v for k, v in chat.items() if k != "model"}, {}, None),
        ("chat_stream", "POST", "/v1/chat/completions", w(chat, stream=True), {}, None),
        (
            "chat_stream_usage",
            "POST",
            "/v1/chat/completions",
            w(chat, stream=True, stream_options={"include_usage": True}),
            {},
            None,
        ),
        ("chat_stop", "POST", "/v1/chat/completions", w(chat, stop=[stop]), {}, None),
        (
            "chat_stop_stream_usage",
            "POST",
            "/v1/chat/completions",
            w(chat, stop=[stop], stream=True, stream_options={"include_usage": True}),
            {},
            None,
        ),
        ("chat_n2", "POST", "/v1/chat/completions", w(chat, n=2), {}, None),
        (
            "chat_logprobs",
            "POST",
            "/v1/chat/completions",
            w(chat, max_tokens=4, logprobs=True, top_logprobs=2),
            {},
            None,
        ),
        ("chat_empty_messages", "POST", "/v1/chat/completions", w(chat, messages=[]), {}, None),
        ("chat_invalid_json", "POST", "/v1/chat/completions", None, {}, b'{"model": "x", "messages": ['),
        (
            "chat_text_plain",
            "POST",
            "/v1/chat/completions",
            None,
            {"Content-Type": "text/plain"},
            json.dumps(chat).encode(),
        ),
        ("chat_max_tokens_negative", "POST", "/v1/chat/completions", w(chat, max_tokens=-1), {}, None),
        ("chat_get", "GET", "/v1/chat/completions", None, {}, None),
        ("completions", "POST", "/v1/completions", comp, {}, None),
        ("completions_stream", "POST", "/v1/completions", w(comp, stream=True), {}, None),
        (
            "completions_stream_usage",
            "POST",
            "/v1/completions",
            w(comp, stream=True, stream_options={"include_usage": True}),
            {},
            None,
        ),
        ("completions_stop", "POST", "/v1/completions", w(comp, stop=[stop]), {}, None),
        ("completions_stop_stream", "POST", "/v1/completions", w(comp, stop=[stop], stream=True), {}, None),
        ("completions_n2", "POST", "/v1/completions", w(comp, n=2), {}, None),
        ("completions_logprobs", "POST", "/v1/completions", w(comp, max_tokens=4, logprobs=2), {}, None),
        ("completions_invalid_json", "POST", "/v1/completions", None, {}, b"{not json"),
        ("completions_empty_prompt", "POST", "/v1/completions", w(comp, prompt=""), {}, None),
        ("unknown_route_get", "GET", "/v1/nothing-here", None, {}, None),
        ("unknown_route_post", "POST", "/nothing-here", {"a": 1}, {}, None),
        ("models", "GET", "/v1/models", None, {}, None),
        ("health", "GET", "/health", None, {}, None),
        (
            "generate",
            "POST",
            "/generate",
            {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 24}},
            {},
            None,
        ),
        (
            "generate_stop",
            "POST",
            "/generate",
            {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 24, "stop": [stop]}},
            {},
            None,
        ),
        ("server_info", "GET", "/server_info", None, {}, None),
    ]


PROMPT = os.environ.get("CONFORMANCE_PROMPT", "w205 w244 w50 w461 w250 w31 w98 w164 w105 w97 w110 w345")


def pick_stop(text):
    """A stop string that occurs in the greedy output, well after its start: its 6th word, with the space
    before it (so that the text before the stop is several tokens long)."""
    words = text.split()
    return " " + words[min(5, len(words) - 1)] if words else " the"


def record_all(base_url, out_dir, model=None):
    os.makedirs(out_dir, exist_ok=True)
    summary = {}
    if model is None:
        try:
            model = _send(base_url, "GET", "/v1/models")["body"]["data"][0]["id"]
        except Exception:  # noqa: BLE001 (recorded; the cases still run)
            model = "default"
    first = _send(
        base_url, "POST", "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    )
    try:
        stop = pick_stop(first["body"]["choices"][0]["text"])
    except Exception:  # noqa: BLE001
        stop = " the"
    summary["_meta"] = {"base_url": base_url, "model": model, "prompt": PROMPT, "stop": stop}
    for name, method, path, body, headers, raw in cases(model, stop):
        record = {
            "name": name,
            "request": {
                "method": method,
                "path": path,
                "headers": headers,
                "body": body if raw is None else raw.decode("utf-8", "replace"),
            },
        }
        try:
            record.update(_send(base_url, method, path, body, headers, raw))
        except Exception as exc:  # noqa: BLE001 (a case that breaks the connection is itself an answer)
            record["error"] = "%s: %s" % (type(exc).__name__, exc)
        with open(os.path.join(out_dir, name + ".json"), "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
        summary[name] = record.get("status", record.get("error"))
    with open(os.path.join(out_dir, "_meta.json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)
    return summary


if __name__ == "__main__":
    print(json.dumps(record_all(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None), indent=1))
