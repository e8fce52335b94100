"""benchmarks/plots.py, the page's SVG bar charts, on fixed data (no server): the SVG is valid
XML, draws one bar per value present, bar heights follow the values (linear and log), the
reference line sits at its value, and data a bar cannot show is refused by name."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from benchmarks.plots import bar_chart

NS = {"svg": "http://www.w3.org/2000/svg"}


def bars(svg: str) -> dict[str, float]:
    """Each bar's hover title -> its height."""
    root = ET.fromstring(svg)
    out = {}
    for rect in root.iterfind(".//svg:rect[@class='bar']", NS):
        title = rect.find("svg:title", NS)
        assert title is not None and title.text
        out[title.text] = float(rect.attrib["height"])
    return out


def test_linear_bars_are_proportional_and_missing_values_leave_a_gap() -> None:
    svg = bar_chart(
        "ops/s & more <mixed>",
        ["8 threads", "4 processes"],
        [("ours", [3000.0, 1000.0]), ("redis-py", [1500.0, None])],
        unit="ops/s",
    )
    heights = bars(svg)
    assert sorted(heights) == [
        "ours, 4 processes: 1,000 ops/s",
        "ours, 8 threads: 3,000 ops/s",
        "redis-py, 8 threads: 1,500 ops/s",
    ]
    assert heights["ours, 8 threads: 3,000 ops/s"] == pytest.approx(
        2 * heights["redis-py, 8 threads: 1,500 ops/s"], rel=1e-3
    )
    assert heights["ours, 8 threads: 3,000 ops/s"] == pytest.approx(
        3 * heights["ours, 4 processes: 1,000 ops/s"], rel=1e-3
    )
    assert ET.fromstring(svg).find("svg:title", NS).text == "ops/s & more <mixed>"  # type: ignore[union-attr]


def test_log_scale_heights_follow_the_logarithm_and_the_reference_line_is_at_its_value() -> None:
    svg = bar_chart(
        "x floor",
        ["get", "get_many[10]"],
        [("a", [1.0, 10.0]), ("b", [100.0, 2.0])],
        unit="x floor",
        log=True,
        reference=1.0,
    )
    heights = bars(svg)
    # 1 is the scale's bottom (a bar of height 0); each decade adds the same height.
    assert heights["a, get: 1 x floor"] == pytest.approx(0.0, abs=0.05)
    decade = heights["a, get_many[10]: 10 x floor"]
    assert decade > 0
    assert heights["b, get: 100 x floor"] == pytest.approx(2 * decade, rel=1e-3)
    assert heights["b, get_many[10]: 2 x floor"] == pytest.approx(decade * math.log10(2), rel=1e-2)
    root = ET.fromstring(svg)
    line = root.find(".//svg:line[@class='reference']", NS)
    assert line is not None
    bar = root.find(".//svg:rect[@class='bar']", NS)
    assert bar is not None and float(line.attrib["y1"]) == pytest.approx(
        float(bar.attrib["y"]) + float(bar.attrib["height"]), abs=0.1
    )  # the bar of value 1.0 stands on the reference


@pytest.mark.parametrize(
    ("series", "log", "message"),
    [
        ([("short", [1.0])], False, "series 'short' has 1 values for 2 categories"),
        ([("neg", [1.0, -2.0])], False, "series 'neg': value -2.0 cannot be drawn"),
        ([("zero", [0.0, 1.0])], True, "series 'zero': value 0.0 cannot be drawn"),
        ([("nan", [math.nan, 1.0])], False, "series 'nan': value nan cannot be drawn"),
        ([("none", [None, None])], False, "chart 't' has no values"),
    ],
)
def test_data_a_bar_cannot_show_is_refused_by_name(
    series: list[tuple[str, list[float | None]]], log: bool, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        bar_chart("t", ["x", "y"], series, unit="u", log=log)
    assert str(caught.value) == message
