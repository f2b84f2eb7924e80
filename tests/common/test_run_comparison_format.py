"""Tests axlearn/common/run_comparison_format.py: text, Markdown, HTML and JSON renderings."""

import base64
import json
import re

import pytest

from axlearn.common import run_comparison as rc
from axlearn.common import run_comparison_format as fmt
from tests.common.run_comparison_testdata import run_path


@pytest.fixture(name="comparison", scope="module")
def fixture_comparison():
    return rc.compare_runs([rc.load_run(run_path(n)) for n in ("lr3e-3", "lr1e-3", "pair_slow")])


def _parse_markdown_table(text):
    lines = [line for line in text.splitlines() if line.startswith("|")]
    rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
    return rows[0], rows[1], rows[2:]


def test_markdown_is_a_table(comparison):
    header, separator, rows = _parse_markdown_table(fmt.format_markdown(comparison))
    assert header == [
        "Metric",
        "lr3e-3 (baseline)",
        "lr1e-3",
        "pair_slow",
        "Diff lr1e-3",
        "Diff pair_slow",
    ]
    assert all(re.fullmatch(r":?-{3,}:?", c) for c in separator)
    assert len(rows) == len(rc.ROWS)
    assert all(len(r) == len(header) for r in rows)
    by_title = {r[0]: r for r in rows}
    assert by_title["Final loss"][4].endswith("\U0001f534 **worse**")
    assert set(by_title) >= {
        "Parameters",
        "Final loss",
        "TFLOP/s/device",
        "Tokens/s/device",
        "Avg s/step",
        "Memory %",
        "JAX version",
    }


def test_text_colors(comparison):
    colored = fmt.format_text(comparison, color=True)
    final = next(line for line in colored.splitlines() if line.startswith("Final loss"))
    assert "\033[31m+" in final  # Red: the lower learning rate's loss is higher.
    plain = fmt.format_text(comparison, color=False)
    assert "\033[" not in plain
    final = next(line for line in plain.splitlines() if line.startswith("Final loss"))
    assert "WORSE" in final


def test_html_is_one_self_contained_file(comparison, tmp_path):
    png = tmp_path / "chart.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    page = fmt.format_html(comparison, charts=[str(png)])
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert 'class="regressed"' in page
    srcs = re.findall(r'src="([^"]+)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert base64.b64decode(srcs[0].split(",", 1)[1]) == png.read_bytes()
    assert "<link" not in page and "<script" not in page


def test_json(comparison):
    data = json.loads(fmt.format_comparison(comparison, "json"))
    assert data["baseline"] == "lr3e-3"
    assert data["rows"]["final_loss"]["diffs"]["lr1e-3"]["verdict"] == "regressed"
    assert data["rows"]["final_loss"]["better"] == "lower"
    assert "lr1e-3" in data["noise"]


def test_unknown_format(comparison):
    with pytest.raises(ValueError, match="Unknown format 'xml'; choose one of: text, markdown"):
        fmt.format_comparison(comparison, "xml")
