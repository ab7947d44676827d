"""The reports' SVG charts: the writer (svg_chart) and what the rollout and tuning reports chart (report_charts)."""

import xml.etree.ElementTree as ET

import pytest
from test_rollout_report import DDTREE_CHOICE, NEW, START, gate, link, passed_gate, rollout_with, tuning

from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_report import (
    build_report,
    render_markdown,
    report_charts,
)
from ansible_collections.ddtree.sglang.plugins.plugin_utils.svg_chart import grouped_bars, nice_ceiling

SVG = "{http://www.w3.org/2000/svg}"


def bars(svg):
    """(category, series, value) of every bar, from the bars' tooltips."""
    root = ET.fromstring(svg)
    found = []
    for rect in root.iter(SVG + "rect"):
        title = rect.find(SVG + "title")
        if title is not None:
            found.append(title.text)
    return found


def heights(svg):
    root = ET.fromstring(svg)
    return [float(rect.get("height")) for rect in root.iter(SVG + "rect") if rect.find(SVG + "title") is not None]


@pytest.mark.parametrize("value, top", [(0, 1), (0.8, 1), (3.4, 5), (41.5, 50), (100, 100), (120, 200), (2400, 2500)])
def test_the_axis_top_is_a_round_number_at_or_above_the_largest_value(value, top):
    assert nice_ceiling(value) == pytest.approx(top)


def test_a_grouped_bar_chart_has_a_bar_per_value_scaled_to_the_axis_and_escapes_text():
    svg = grouped_bars("tokens/s <&>", ["a", "b"], [("before", [10.0, None]), ("after", [20.0, 5.0])], "tokens/s")
    root = ET.fromstring(svg)  # well-formed, standalone
    assert root.tag == SVG + "svg" and root.find(SVG + "title").text == "tokens/s <&>"
    assert bars(svg) == ["a, before: 10 tokens/s", "a, after: 20 tokens/s", "b, after: 5 tokens/s"]
    assert heights(svg) == [100.0, 200.0, 50.0]  # the axis tops at 20: 200 px of plot
    assert "<script" not in svg and "href" not in svg
    assert svg == grouped_bars(
        "tokens/s <&>", ["a", "b"], [("before", [10.0, None]), ("after", [20.0, 5.0])], "tokens/s"
    )


def test_a_chart_refuses_a_series_of_the_wrong_length():
    with pytest.raises(ValueError, match="series 'after' has 1 values for 2 categories"):
        grouped_bars("x", ["a", "b"], [("after", [1.0])])
    with pytest.raises(ValueError):
        grouped_bars("x", [], [])


def test_the_rollout_report_charts_each_gated_service_before_and_after():
    events = START + [
        {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}},
        link("ct200", "coder", START[0]["result"]["coder"]["release_id"], NEW),
        gate("ct200", passed_gate("coder", NEW, tps=41.5, accept=3.4)),
    ]
    report = build_report(events, ["ct200"])
    charts = report_charts(report)
    assert [chart["name"] for chart in charts["before_after"]] == [
        "before-after-tokens-per-second",
        "before-after-accept-length",
    ]
    assert bars(charts["before_after"][0]["svg"]) == [
        "ct200/coder, before (previous release): 40 tokens/s",
        "ct200/coder, after: 41.5 tokens/s",
    ]
    text = render_markdown(report, charts, "rollout-")
    assert "![Tokens/s per host, before and after](rollout-before-after-tokens-per-second.svg)" in text
    assert "![Acceptance length per host, before and after](rollout-before-after-accept-length.svg)" in text
    # Without charts, the Markdown is as it was.
    assert ".svg" not in render_markdown(report)
    assert report_charts(build_report(events, ["ct200"], kind="plan")) == {"before_after": [], "tuning": []}


def test_a_tuning_is_charted_per_setting_and_concurrency():
    measurements = [
        {"algorithm": "DFLASH", "concurrency": 1, "tokens_per_second": 100.0, "accept_length": 4.0},
        {"algorithm": "DFLASH", "concurrency": 16, "tokens_per_second": 900.0, "accept_length": 3.9},
        {
            "algorithm": "DDTREE",
            "budget": 8,
            "top_k": 4,
            "concurrency": 1,
            "tokens_per_second": 112.0,
            "accept_length": 4.6,
        },
        {"algorithm": "DDTREE", "budget": 8, "top_k": 4, "concurrency": 16, "error": "exited"},
    ]
    decided = tuning(True, tuned=True, choice=DDTREE_CHOICE)
    decided["result"]["measurements"] = measurements
    report = rollout_with(tuning(True), decided)
    charts = report_charts(report)["tuning"]
    assert [chart["name"] for chart in charts] == [
        "tuning-ct200-coder-tokens-per-second",
        "tuning-ct200-coder-accept-length",
    ]
    assert bars(charts[0]["svg"]) == [
        "DFLASH, concurrency 1: 100 tokens/s",
        "DFLASH, concurrency 16: 900 tokens/s",
        "DDTREE b8 k4, concurrency 1: 112 tokens/s",
    ]
    assert bars(charts[1]["svg"])[-1] == "DDTREE b8 k4, concurrency 1: 4.6 tokens per step"
    text = render_markdown(report, report_charts(report), "rollout-")
    # The charts follow the tuning table and its blank line.
    assert (
        "is the fastest ... |\n\n"
        "![ct200/coder tuning: tokens/s per setting and concurrency](rollout-tuning-ct200-coder-tokens-per-second.svg)\n\n"
        "![ct200/coder tuning: acceptance length per setting and concurrency](rollout-tuning-ct200-coder-accept-length.svg)"
        "\n\nNot reached"
    ) in text
    # An unchanged tuning measured nothing: no chart.
    assert report_charts(rollout_with(tuning(False, choice=DDTREE_CHOICE, key_changes=())))["tuning"] == []


def test_a_chart_of_one_category_is_wide_enough_for_its_title_and_legend():
    title = "Tokens/s per host and service, before and after"
    svg = grouped_bars(
        title, ["ct200/coder"], [("before (previous release)", [885.0]), ("after", [2909.0])], "tokens/s"
    )
    root = ET.fromstring(svg)
    width = float(root.get("width"))
    assert width >= 8.5 * len(title)
    legend = [text for text in root.iter(SVG + "text") if text.text in ("before (previous release)", "after")]
    first, second = sorted(legend, key=lambda text: float(text.get("x")))
    assert float(second.get("x")) >= float(first.get("x")) + 6.5 * len(first.text)
    assert float(second.get("x")) < width
