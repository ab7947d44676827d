# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Grouped bar charts as standalone SVG, for the rollout and tuning reports (docs/decisions/report-charts.md).

One chart kind is all the reports need (a few categories, a few series, one number each): a small writer
over xml.etree, whose output is deterministic (the same report, the same bytes) and has no script, no font
file and no external reference, so it renders the same in a browser, an image viewer and a CI artifact.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

# Colour-blind-safe (Okabe-Ito), one per series in order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
BAR_WIDTH = 22
GROUP_GAP = 26
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 40, 86
PLOT_HEIGHT = 200
SVG_NS = "http://www.w3.org/2000/svg"
# Estimated text widths (px per character) of the 11 px labels and the 14 px bold title, for the chart's width.
CHAR_WIDTH, TITLE_CHAR_WIDTH = 6.5, 8.5
LEGEND_GAP = 30


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n that is >= value (an axis' top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value * (1 - 1e-12))


def _label(value: float) -> str:
    """2 decimals under 10, 1 under 100, none above; no trailing zeros."""
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return ("%.*f" % (digits, value)).rstrip("0").rstrip(".") if digits else "%.0f" % value


def _y_axis(svg, top: float, width: int, unit: str):
    """Five grid lines with their values, and the axis's unit."""
    base = TOP + PLOT_HEIGHT
    for tick in range(5):
        value = top * tick / 4
        y = base - PLOT_HEIGHT * tick / 4
        ET.SubElement(svg, "line", x1=str(LEFT), x2=str(width - RIGHT), y1="%.1f" % y, y2="%.1f" % y, stroke="#dddddd")
        ET.SubElement(svg, "text", x=str(LEFT - 6), y="%.1f" % (y + 4), **{"text-anchor": "end"}).text = _label(value)
    axis = ET.SubElement(svg, "text", x="14", y=str(TOP + PLOT_HEIGHT // 2), **{"text-anchor": "middle"})
    axis.set("transform", "rotate(-90 14 %d)" % (TOP + PLOT_HEIGHT // 2))
    axis.text = unit


def _bar_group(svg, x0: float, category, index: int, series: list, top: float, unit: str):
    """One category's bars (one per series, each labelled with its value), and the category's name below."""
    base = TOP + PLOT_HEIGHT
    for position, (name, row) in enumerate(series):
        value = row[index]
        if value is None:
            continue
        bar_height = PLOT_HEIGHT * value / top
        x = x0 + position * BAR_WIDTH
        rect = ET.SubElement(
            svg,
            "rect",
            x="%.1f" % x,
            y="%.1f" % (base - bar_height),
            width=str(BAR_WIDTH - 3),
            height="%.1f" % bar_height,
            fill=PALETTE[position % len(PALETTE)],
        )
        ET.SubElement(rect, "title").text = "%s, %s: %s %s" % (category, name, _label(value), unit)
        ET.SubElement(
            svg,
            "text",
            x="%.1f" % (x + (BAR_WIDTH - 3) / 2),
            y="%.1f" % (base - bar_height - 3),
            **{"text-anchor": "middle", "font-size": "9"},
        ).text = _label(value)
    centre = x0 + (BAR_WIDTH * len(series)) / 2
    label = ET.SubElement(svg, "text", x="%.1f" % centre, y=str(base + 14), **{"text-anchor": "end"})
    label.set("transform", "rotate(-30 %.1f %d)" % (centre, base + 14))
    label.text = str(category)


def _legend(svg, legend: list, y: int):
    """The series' names in one row, each with its colour."""
    x = LEFT
    for position, (name, item_width) in enumerate(legend):
        colour = PALETTE[position % len(PALETTE)]
        ET.SubElement(svg, "rect", x="%.1f" % x, y=str(y - 9), width="10", height="10", fill=colour)
        ET.SubElement(svg, "text", x="%.1f" % (x + 14), y=str(y)).text = str(name)
        x += item_width


def grouped_bars(title: str, categories: list, series: list, unit: str = "") -> str:
    """An SVG grouped bar chart: a group of bars per category, one bar per series ((name, [value per category]);
    None: no bar, its place kept), each bar labelled with its value, a legend of the series and a y axis in unit."""
    if not categories or not series:
        raise ValueError("a chart needs at least one category and one series")
    for name, values in series:
        if len(values) != len(categories):
            raise ValueError("series %r has %d values for %d categories" % (name, len(values), len(categories)))
    values = [value for _name, row in series for value in row if value is not None]
    top = nice_ceiling(max(values) if values else 1.0)
    group_width = BAR_WIDTH * len(series) + GROUP_GAP
    # Wide enough for the bars, the title and one row of the legend (text widths estimated per character).
    legend = [(name, LEGEND_GAP + CHAR_WIDTH * len(str(name))) for name, _row in series]
    width = int(
        max(
            LEFT + RIGHT + group_width * len(categories),
            LEFT + RIGHT + TITLE_CHAR_WIDTH * len(title),
            LEFT + RIGHT + sum(item for _name, item in legend),
        )
    )
    height = TOP + PLOT_HEIGHT + BOTTOM
    svg = ET.Element(
        "svg",
        xmlns=SVG_NS,
        width=str(width),
        height=str(height),
        viewBox="0 0 %d %d" % (width, height),
        role="img",
        **{"font-family": "DejaVu Sans, Arial, sans-serif", "font-size": "11"},
    )
    ET.SubElement(svg, "title").text = title
    ET.SubElement(svg, "rect", x="0", y="0", width=str(width), height=str(height), fill="#ffffff")
    ET.SubElement(svg, "text", x=str(LEFT), y="20", **{"font-size": "14", "font-weight": "bold"}).text = title
    base = TOP + PLOT_HEIGHT
    _y_axis(svg, top, width, unit)
    for index, category in enumerate(categories):
        _bar_group(svg, LEFT + GROUP_GAP / 2 + index * group_width, category, index, series, top, unit)
    _legend(svg, legend, base + BOTTOM - 10)
    return ET.tostring(svg, encoding="unicode") + "\n"
