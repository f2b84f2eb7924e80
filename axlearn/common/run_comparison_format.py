"""Rendering a run comparison (`axlearn.common.run_comparison.Comparison`) as text, Markdown,
HTML or JSON: the output formats of `axlearn compare`.

- text: aligned columns; in a terminal, diffs are green (improved), red (regressed) and dim
  (within noise).
- markdown: a GitHub-flavored table for a pull request; verdicts as colored circles and words
  (GitHub strips colors): green "better", red "worse", white "noise".
- html: one self-contained page (inline CSS, charts embedded as data: URIs).
- json: every value, diff, verdict and the noise tests, for scripts.
"""

from __future__ import annotations

import base64
import html
import json
import os
from typing import Any, Optional, Sequence

from axlearn.common.run_comparison import (
    CHANGED,
    IMPROVED,
    MIN_TIMING_SAMPLES,
    NOISE,
    REGRESSED,
    SAME,
    UNKNOWN,
    Comparison,
    Diff,
)

FORMATS = ("text", "markdown", "html", "json")

_ANSI = {IMPROVED: "\033[32m", REGRESSED: "\033[31m", NOISE: "\033[2m"}
_ANSI_RESET = "\033[0m"
# GitHub strips colors from Markdown: colored circles and words carry the verdict instead.
_MD_MARK = {IMPROVED: "\U0001f7e2 better", REGRESSED: "\U0001f534 **worse**", NOISE: "\u26aa noise"}
_HTML_CLASS = {IMPROVED: "improved", REGRESSED: "regressed", NOISE: "noise"}


def _diff_text(diff: Optional[Diff], *, words: bool = False) -> str:
    """The diff cell: `+0.1 (+2.0%)`, `~noise` inside the noise; `better`/`worse` if `words`."""
    if diff is None:
        return ""
    if diff.absolute is None or diff.verdict == SAME:
        return {SAME: "=", CHANGED: "changed", UNKNOWN: "n/a"}.get(diff.verdict, diff.verdict)
    text = f"{diff.absolute:+.4g}"
    if diff.percent is not None:
        text += f" ({diff.percent:+.1f}%)"
    if diff.verdict == NOISE:
        text += " ~noise"
    elif words and diff.verdict in (IMPROVED, REGRESSED):
        text += " better" if diff.verdict == IMPROVED else " WORSE"
    return text


def _headers(comparison: Comparison) -> list[str]:
    headers = ["Metric"]
    for i, run in enumerate(comparison.runs):
        headers.append(run.label + (" (baseline)" if i == comparison.baseline else ""))
    for i, run in enumerate(comparison.runs):
        if i != comparison.baseline:
            headers.append(f"Diff {run.label}")
    return headers


def _cells(comparison: Comparison, *, words: bool = False) -> list[list[tuple[str, Optional[str]]]]:
    """Rows of (text, verdict) cells, the verdict only on diff cells."""
    table = []
    for row in comparison.rows:
        cells: list[tuple[str, Optional[str]]] = [(row.spec.title, None)]
        cells += [(t, None) for t in row.texts]
        for i, d in enumerate(row.diffs):
            if i != comparison.baseline:
                cells.append((_diff_text(d, words=words), d.verdict if d else None))
        table.append(cells)
    return table


def _footer(comparison: Comparison) -> list[str]:
    lines = []
    if comparison.loss_step is not None:
        lines.append(f"Final loss compared at step {comparison.loss_step}.")
    for i, verdict in comparison.noise.items():
        counts = "" if verdict.p_value is None else f" ({verdict.n_b} vs {verdict.n_a} steps)"
        lines.append(
            f"Step-time noise test, {comparison.runs[i].label} vs "
            f"{comparison.runs[comparison.baseline].label}: {verdict.reason}{counts}."
        )
    notes = [
        f"{row.spec.title}, {comparison.runs[i].label}: {d.note}."
        for row in comparison.rows
        for i, d in enumerate(row.diffs)
        if row.spec.samples is not None and d is not None and d.note and i != comparison.baseline
    ]
    if any(row.spec.samples is not None for row in comparison.rows):
        lines.append(
            "Timing rows (compile, eval, checkpoint, input wait) are called better or worse only "
            f"when measured at least {MIN_TIMING_SAMPLES} times in each run; fewer is noise."
        )
    lines += notes
    lines += [f"Warning: {w}" for w in comparison.warnings]
    return lines


def format_text(comparison: Comparison, *, color: bool = False) -> str:
    """Renders the comparison as an aligned text table.

    Args:
        comparison: The comparison.
        color: Whether to color diff cells with ANSI escapes.

    Returns:
        The text.
    """
    headers = _headers(comparison)
    table = _cells(comparison, words=not color)
    widths = [max(len(h), *(len(r[j][0]) for r in table)) for j, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for cells in table:
        parts = []
        for (text, verdict), w in zip(cells, widths):
            padded = text.ljust(w)
            if color and verdict in _ANSI:
                padded = _ANSI[verdict] + padded + _ANSI_RESET
            parts.append(padded)
        lines.append("  ".join(parts).rstrip())
    lines.append("")
    lines += _footer(comparison)
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def format_markdown(comparison: Comparison) -> str:
    """Renders the comparison as a GitHub-flavored Markdown table plus notes.

    Args:
        comparison: The comparison.

    Returns:
        The Markdown text.
    """
    headers = _headers(comparison)
    lines = [
        "| " + " | ".join(_md_escape(h) for h in headers) + " |",
        "|" + "|".join([":---"] + ["---:"] * (len(headers) - 1)) + "|",
    ]
    for cells in _cells(comparison):
        texts = []
        for text, verdict in cells:
            mark = _MD_MARK.get(verdict or "", "")
            if mark:
                text = f"{text.replace(' ~noise', '')} {mark}"
            texts.append(_md_escape(text))
        lines.append("| " + " | ".join(texts) + " |")
    lines.append("")
    lines += [f"- {_md_escape(line)}" for line in _footer(comparison)]
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.improved { color: #0a7a0a; font-weight: bold; }
.regressed { color: #c01010; font-weight: bold; }
.noise { color: #888; }
img { max-width: 48%; margin: 4px; border: 1px solid #eee; }
"""


def format_html(
    comparison: Comparison, *, charts: Sequence[str] = (), title: str = "axlearn compare"
) -> str:
    """Renders the comparison as one self-contained HTML page.

    Args:
        comparison: The comparison.
        charts: PNG files to embed (as base64 data: URIs, so the page is a single file).
        title: The page title.

    Returns:
        The HTML text.
    """
    headers = _headers(comparison)
    out = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers),
        "</tr></thead><tbody>",
    ]
    for cells in _cells(comparison):
        tds = []
        for text, verdict in cells:
            cls = _HTML_CLASS.get(verdict or "")
            attr = f' class="{cls}" title="{html.escape(verdict or "")}"' if cls else ""
            tds.append(f"<td{attr}>{html.escape(text)}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</tbody></table><ul>")
    out += [f"<li>{html.escape(line)}</li>" for line in _footer(comparison)]
    out.append("</ul>")
    for path in charts:
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
        name = html.escape(os.path.basename(path))
        out.append(f'<img alt="{name}" title="{name}" src="data:image/png;base64,{data}">')
    out.append("</body></html>")
    return "\n".join(out)


def to_json_dict(comparison: Comparison) -> dict[str, Any]:
    """Returns the comparison as a JSON-ready dict.

    Args:
        comparison: The comparison.

    Returns:
        {"runs": [...], "baseline": label, "loss_step", "rows": {key: {...}}, "noise", "warnings"}.
    """
    runs = comparison.runs
    rows = {}
    for row in comparison.rows:
        rows[row.spec.key] = {
            "title": row.spec.title,
            "better": row.spec.better,
            "values": {r.label: v for r, v in zip(runs, row.values)},
            "diffs": {
                r.label: {
                    "absolute": d.absolute,
                    "percent": d.percent,
                    "verdict": d.verdict,
                    "note": d.note,
                }
                for r, d in zip(runs, row.diffs)
                if d is not None
            },
        }
    noise = {
        runs[i].label: {
            "significant": v.significant,
            "p_value": v.p_value,
            "iqr_baseline": v.iqr_a,
            "iqr": v.iqr_b,
            "steps_baseline": v.n_a,
            "steps": v.n_b,
            "reason": v.reason,
        }
        for i, v in comparison.noise.items()
    }
    return {
        "runs": [{"label": r.label, "path": r.path, "notes": r.notes} for r in runs],
        "baseline": runs[comparison.baseline].label,
        "loss_step": comparison.loss_step,
        "rows": rows,
        "noise": noise,
        "regressions": [{"run": r, "row": t} for r, t in comparison.regressions],
        "warnings": comparison.warnings,
    }


def format_comparison(
    comparison: Comparison, fmt: str, *, color: bool = False, charts: Sequence[str] = ()
) -> str:
    """Renders the comparison in one of `FORMATS`.

    Args:
        comparison: The comparison.
        fmt: "text", "markdown", "html" or "json".
        color: ANSI colors (text only).
        charts: PNGs to embed (html only).

    Returns:
        The rendered text.

    Raises:
        ValueError: Unknown format (the message lists the known ones).
    """
    if fmt == "text":
        return format_text(comparison, color=color)
    if fmt == "markdown":
        return format_markdown(comparison)
    if fmt == "html":
        return format_html(comparison, charts=charts)
    if fmt == "json":
        return json.dumps(to_json_dict(comparison), indent=2, sort_keys=True)
    raise ValueError(f"Unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}.")
