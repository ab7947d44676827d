"""The health gate's output rules: degenerate outputs, baseline comparison, speed and acceptance, redaction."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import health_output
from ansible_collections.ddtree.sglang.plugins.module_utils.health_output import (
    compare_metrics,
    compare_output,
    degenerate_output,
    redact,
    tokens_per_second,
)

# ---- degenerate outputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, rule",
    [
        ("", "empty"),
        ("  \n\t ", "empty"),
        ("!!!!!!!!", "one_char"),  # the incident
        ("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", "one_char"),
        ("!!!! !!!!\n!!!!", "one_char"),
        ("1, 1, 1, 1, 1, 1, 1, 1, 1, 1", "few_distinct"),
        ("the the the the the the the the", "few_distinct"),
        ("I think I think I think I think I think", "loop"),
        ("Paris is the capital of France. France France France France France France France", "loop"),
        ("<unk><unk><unk><unk><unk><unk>", "loop"),
        ("巴黎的首都巴黎的首都巴黎的首都巴黎的首都", "loop"),
        ("def f():\n    return f()\n    return f()\n    return f()\n    return f()\n    return f()", "loop"),
    ],
)
def test_degenerate_outputs_are_rejected(text, rule):
    verdict = degenerate_output(text)
    assert verdict["degenerate"] is True and verdict["rule"] == rule, verdict


@pytest.mark.parametrize(
    "text",
    [
        "The capital of France is Paris, and the Seine runs through it.",
        "2, 3, 5, 7, 11, 13, 17, 19, 23, 29",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        "Das Wetter ist heute schön.\n今日はいい天気ですね。",
        "巴黎是法国的首都，塞纳河流经这座城市。",
        "Столица Франции — Париж; через него протекает Сена.",
        "| n | fib(n) |\n|---|--------|\n| 0 | 0 |\n| 1 | 1 |\n| 2 | 1 |",
        "Sure! Here is the answer:\n\n```python\nprint('hello')\n```",
        "42",
        "...",
        "Hmm...",
        "1000",
        "<think>\nThe user asks about France. Paris is the capital; the Seine flows through it.\n</think>\nParis, on the Seine.",
    ],
)
def test_good_outputs_pass(text):
    verdict = degenerate_output(text)
    assert verdict["degenerate"] is False, verdict


def test_periodic_suffix():
    assert health_output.periodic_suffix("xxabab", 2) == 4
    assert health_output.periodic_suffix("abc", 1) == 1
    assert health_output.periodic_suffix("", 1) == 0


# ---- baselines -----------------------------------------------------------------------------------


def test_compare_output_exact_and_tolerant():
    expected = "2, 3, 5, 7, 11, 13, 17, 19, 23, 29"
    assert compare_output(expected, expected)["match"] is True
    differs = compare_output(expected, "2, 3, 5, 7, 11, 13, 17, 19, 23, 31")
    assert differs["match"] is False and differs["common_prefix"] == 32 and differs["differing_chars"] == 2
    assert "29" in differs["expected_excerpt"] and "31" in differs["actual_excerpt"]
    assert compare_output(expected, "2, 3, 5, 7, 11, 13, 17, 19, 23, 31", tolerance=0.1)["match"] is True
    assert compare_output(expected, "!!!!!!!!", tolerance=0.1)["match"] is False
    assert compare_output(expected, expected + " and 31")["match"] is False  # longer counts too


# ---- performance ---------------------------------------------------------------------------------


def test_tokens_per_second():
    assert (
        tokens_per_second([{"completion_tokens": 64, "seconds": 0.5}, {"completion_tokens": 36, "seconds": 0.5}])
        == 100.0
    )
    assert tokens_per_second([]) is None


def test_compare_metrics_floors_and_regression():
    assert (
        compare_metrics(
            {"tokens_per_second": 180.0, "accept_length": 3.4},
            {"accept_length": 2.0},
            {"tokens_per_second": 175.0, "accept_length": 3.38},
        )
        == []
    )
    problems = compare_metrics(
        {"tokens_per_second": 60.0, "accept_length": 1.0},
        {"tokens_per_second": 100.0, "accept_length": 2.0},
        {"tokens_per_second": 175.0, "accept_length": 3.4},
        max_regression=0.5,
    )
    assert problems == [
        "tokens/s 60 is below the floor 100",
        "tokens/s 60 is 66% below the previous release's 175 (max_regression 0.5 allows down to 87.5)",
        "acceptance length 1 is below the floor 2",
        "acceptance length 1 is 71% below the previous release's 3.4 (max_regression 0.5 allows down to 1.7)",
    ]
    assert compare_metrics({"tokens_per_second": 90.0}, None, {"tokens_per_second": "200.0"}, 0.5)[0].startswith(
        "tokens/s 90 is 55% below the previous release's 200"
    )  # numbers from Jinja may be strings
    assert compare_metrics({"tokens_per_second": 90.0, "accept_length": None}, {"accept_length": 2.0}) == [
        "no acceptance length was measured, but the floor is 2 (is speculative decoding on?)"
    ]


def test_redact():
    assert redact("401: bad key sk-secret-123", "sk-secret-123") == "401: bad key ********"
    assert redact(None, "x") is None and redact("text", None) == "text"
