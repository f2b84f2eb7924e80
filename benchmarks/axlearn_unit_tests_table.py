"""Writes the table of AXLearn's unit tests run here from `axlearn_unit_tests.py`'s JSON.

Reads one or more JSON files printed by `benchmarks/axlearn_unit_tests.py --output` (a file
measured in a later JSON replaces its row from an earlier one), sorts each failure cause into a
category (a missing name, golden data not shipped, an accelerator needed, ...) and prints a
Markdown table: per test file whether it imports unmodified (strict mode), its passed / failed /
skipped counts (lenient mode), its pass rate and the causes left; a totals row; and the causes
over all files. With `--docs`, the table replaces the text between the two marker lines

    <!-- axlearn_unit_tests table: begin -->
    <!-- axlearn_unit_tests table: end -->

of that page.

Usage (from the repository root):
    python benchmarks/axlearn_unit_tests.py /path/to/axlearn --output /tmp/ut.json
    python benchmarks/axlearn_unit_tests_table.py /tmp/ut.json --docs docs/axlearn_differences.md
"""

import argparse
import collections
import os
import re
import sys

from axlearn.common.file_access.reads import read_json, read_text
from axlearn.common.file_access.resolve import FileAccessError
from axlearn.common.file_access.tree import write_atomic

BEGIN = "<!-- axlearn_unit_tests table: begin -->"
# The largest JSON (and page) read: the harness writes about 100 KB for all files.
MAX_BYTES = 16 << 20
END = "<!-- axlearn_unit_tests table: end -->"

# (pattern, category), first match wins; `{0}` is the pattern's first group.
_CATEGORIES = (
    (r"^missing: ([\w.]+)", "missing name `{0}`"),
    (
        r"golden|testdata|\.npz\b|data/tokenizers|[Mm]issing test ?data|\bNotFoundError",
        "AXLearn's data not shipped (goldens, vocabularies)",
    ),
    (r"\b(TPU|tpu|GPU|gpu|CUDA|cuda|[Nn]euron|Pallas|pallas|Mosaic)\b", "needs an accelerator"),
    (r"^timeout\b|Timeout|timed out", "timed out"),
    (r"ModuleNotFoundError: No module named '?([\w.]+)", "missing module `{0}`"),
    (r"ImportError: cannot import name '?(\w+)", "missing name `{0}`"),
    (r"AttributeError: .*has no attribute '?(\w+)", "missing attribute `{0}`"),
    (r"TypeError: .*unexpected keyword argument '?(\w+)", "missing argument `{0}`"),
)


def cause_category(cause: str) -> str:
    """The category of one failure cause, as `axlearn_unit_tests.py` records it.

    Args:
        cause: The cause (`missing: module.name` or an exception's last line).

    Returns:
        A short category: `missing name ...`, `golden data not shipped`, `needs an
        accelerator`, ...; other causes are returned shortened as `other: <cause>`.
    """
    for pattern, category in _CATEGORIES:
        match = re.search(pattern, cause)
        if match:
            return category.format(*match.groups())
    text = re.sub(r"\s+", " ", cause).strip().replace("|", "/").replace("`", "'")
    return "other: " + text[:90]


def _check_file_row(name: str, row: object, source: str) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{source}: files.{name} is {type(row).__name__}, expected an object")
    for mode, counts in row.items():
        if not isinstance(counts, dict):
            raise ValueError(f"{source}: files.{name}.{mode} is not an object")
        for key in ("passed", "failed", "skipped", "errors"):
            value = counts.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{source}: files.{name}.{mode}.{key}={value!r}: not a count >= 0")
        if not isinstance(counts.get("causes", {}), dict):
            raise ValueError(f"{source}: files.{name}.{mode}.causes is not an object")
    return row


def merge(paths: list[str]) -> tuple[dict, dict]:
    """Reads the JSON files; a file measured in a later one replaces the earlier row.

    Args:
        paths: JSON files written by `axlearn_unit_tests.py --output`.

    Returns:
        ({name: {mode: counts} plus "measured": meta of its JSON}, meta of the last file).

    Raises:
        FileAccessError: A file missing, not a regular file (a link, a FIFO), over `MAX_BYTES`,
            nested too deep or not JSON (naming the file).
        ValueError: A file that is not such a JSON object (naming the file and the field).
    """
    files, meta = {}, {}
    for path in paths:
        full = os.path.abspath(path)
        data = read_json(os.path.dirname(full), os.path.basename(full), max_bytes=MAX_BYTES)
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            raise ValueError(f"{path}: expected an object with a `files` object")
        meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
        for name, row in data["files"].items():
            row = dict(_check_file_row(name, row, path))
            row["measured"] = meta
            files[name] = row
    return dict(sorted(files.items())), meta


def _counts(row: dict) -> dict:
    """The lenient counts of a row (strict where only strict ran), scaled when sampled."""
    counts = row.get("lenient") or row.get("strict") or {}
    run = {k: counts.get(k, 0) for k in ("passed", "failed", "errors", "skipped")}
    total = sum(run.values())
    scale = 1.0
    sampled_from = counts.get("sampled_from")
    if not sampled_from or sampled_from <= total:
        sampled_from = None  # Every test ran.
    elif total:
        scale = sampled_from / total
    return dict(run, scale=scale, sampled_from=sampled_from, causes=counts.get("causes", {}))


def _imports(row: dict) -> str:
    strict = row.get("strict")
    if strict is None:
        return "not run"
    return "yes" if strict.get("imports") else "no"


def table(files: dict) -> str:
    """The Markdown table of the merged rows, a totals row and the causes over all files.

    Args:
        files: As `merge` returns.

    Returns:
        The Markdown text.
    """
    lines = [
        "| File | Imports (strict) | Passed | Failed | Skipped | Pass rate | Causes left |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    totals = collections.Counter()
    all_causes = collections.Counter()
    imports = 0
    for name, row in files.items():
        c = _counts(row)
        failed = c["failed"] + c["errors"]
        est = {k: round(c[k] * c["scale"]) for k in ("passed", "skipped")}
        est["failed"] = round(failed * c["scale"])
        for key, value in est.items():
            totals[key] += value
        ran = est["passed"] + est["failed"]
        rate = f"{100 * est['passed'] / ran:.0f}%" if ran else "-"
        causes = collections.Counter()
        for cause, count in c["causes"].items():
            causes[cause_category(cause)] += count
        all_causes.update({k: round(v * c["scale"]) for k, v in causes.items()})
        left = "; ".join(f"{k} ({v})" for k, v in causes.most_common(3)) or "-"
        label = f"`{name}`"
        if c["sampled_from"]:
            label += f" (est. from {c['passed'] + failed + c['skipped']} of {c['sampled_from']})"
            est = {k: f"~{v}" for k, v in est.items()}
        imports += _imports(row) == "yes"
        lines.append(
            f"| {label} | {_imports(row)} | {est['passed']} | {est['failed']} | {est['skipped']}"
            f" | {rate} | {left} |"
        )
    ran = totals["passed"] + totals["failed"]
    rate = f"{100 * totals['passed'] / ran:.1f}%" if ran else "-"
    lines.append(
        f"| **all {len(files)}** | **{imports}** | **{totals['passed']}** | **{totals['failed']}**"
        f" | **{totals['skipped']}** | **{rate}** | |"
    )
    lines.append("")
    lines.append("Failures by cause, over all files (sampled files scaled to their size):")
    lines.append("")
    for cause, count in all_causes.most_common(25):
        lines.append(f"- {cause}: {count}")
    if len(all_causes) > 25:
        rest = sum(count for _, count in all_causes.most_common()[25:])
        lines.append(f"- {len(all_causes) - 25} other causes: {rest}")
    return "\n".join(lines) + "\n"


def _measured_line(files: dict) -> str:
    commits = collections.Counter()
    for row in files.values():
        meta = row.get("measured") or {}
        commits[(meta.get("commit") or "?", meta.get("date") or "?")] += 1
    parts = [f"{n} at {commit} ({date})" for (commit, date), n in sorted(commits.items())]
    return "Files measured: " + ", ".join(parts) + ".\n"


def not_measured(files: dict, snapshot: str) -> str:
    """The lines naming the snapshot's test files of modules here that no JSON measured.

    Args:
        files: As `merge` returns.
        snapshot: AXLearn's repository (the folder holding `axlearn/`).

    Returns:
        Markdown text (empty when every file was measured).
    """
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import axlearn_unit_tests  # pylint: disable=import-outside-toplevel

    found, left_out = axlearn_unit_tests.discover(snapshot)
    missing = [name for name in found if name not in files]
    text = (
        f"\nOf the snapshot's {len(found) + len(left_out)} test files, {len(found)} test a module "
        f"that exists here; {len(left_out)} test modules not built here.\n"
    )
    if missing:
        text += (
            f"Not measured yet ({len(missing)}): " + ", ".join(f"`{n}`" for n in missing) + ".\n"
        )
    return text


def write_docs(path: str, text: str) -> None:
    """Replaces the text between the marker lines of the page at `path` with `text`.

    Args:
        path: A Markdown page holding `BEGIN` and `END` once each, in that order.
        text: The new text between them.

    Raises:
        FileAccessError: The page cannot be read (missing, a link, a FIFO, too large).
        ValueError: The page lacks a marker, holds one twice, or has them out of order.
    """
    full = os.path.abspath(path)
    folder, base = os.path.dirname(full), os.path.basename(full)
    page = read_text(folder, base, max_bytes=MAX_BYTES)
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"{path}: needs the lines {BEGIN!r} and {END!r} once each, in order")
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    write_atomic(folder, base, (head + BEGIN + "\n" + text + END + tail).encode("utf-8"))


def main() -> None:
    """Parses flags, prints the table and writes it into `--docs` if given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", nargs="+", help="axlearn_unit_tests.py outputs, oldest first.")
    parser.add_argument("--docs", default="", help="A page with the two marker lines.")
    parser.add_argument(
        "--snapshot",
        default="",
        help="AXLearn's repository: also list its test files of modules here not yet measured.",
    )
    args = parser.parse_args()
    try:
        files, _ = merge(args.json)
    except (FileAccessError, OSError, ValueError) as e:
        raise SystemExit(f"axlearn_unit_tests_table: {e}") from e
    text = _measured_line(files) + "\n" + table(files)
    if args.snapshot:
        text += not_measured(files, args.snapshot)
    print(text, end="")
    if args.docs:
        try:
            write_docs(args.docs, text)
        except (FileAccessError, OSError, ValueError) as e:
            raise SystemExit(f"axlearn_unit_tests_table: {e}") from e
        print(f"wrote {args.docs}", file=sys.stderr)


if __name__ == "__main__":
    main()
