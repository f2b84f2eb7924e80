"""`axlearn compare`: runs side by side, with diffs against a baseline and noise-aware verdicts.

    axlearn compare RUN_DIR_A RUN_DIR_B [RUN_DIR_C ...] [--baseline A] [--label NAME ...]
        [--format text|markdown|html|json] [--output FILE] [--plot DIR]
    axlearn compare --suite SUITE_DIR_A SUITE_DIR_B [--format ...]

A suite directory holds one run directory per named case (`03_dropout`, ...), as written by
`benchmarks/suite.py`; `--suite` prints one table per case present in both and a summary of the
regressions. See docs/compare.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from axlearn.cli.config_commands import CommandError

_FORMATS = ("text", "markdown", "html", "json")


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `compare` command.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    parser = groups.add_parser(
        "compare",
        help="Compare training runs (or suites of runs) side by side.",
        description="Compare training runs: one column per run, a diff column per run against "
        "the baseline, and a noise test on step times. Reads trainer directories "
        "(run_summary.json, metrics.jsonl, trainer_config), local or gs://.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="Trainer directories.")
    parser.add_argument(
        "--suite",
        action="store_true",
        help="The two arguments are suite directories (one run directory per named case).",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="The baseline run: its directory, label or 0-based index (default: the first).",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=None,
        help="Names of the runs, in order (repeat once per run; default: directory names).",
    )
    parser.add_argument("--format", default="text", help=f"One of: {', '.join(_FORMATS)}.")
    parser.add_argument("--output", default=None, help="Write to this file instead of stdout.")
    parser.add_argument("--plot", default=None, metavar="DIR", help="Write PNG charts here.")
    parser.add_argument(
        "--color",
        default="auto",
        choices=("auto", "always", "never"),
        help="Color the text table (auto: when stdout is a terminal).",
    )
    parser.set_defaults(func=compare_command)


def _baseline_index(baseline: Optional[str], paths: Sequence[str], labels: Sequence[str]) -> int:
    if baseline is None:
        return 0
    for i, (path, label) in enumerate(zip(paths, labels)):
        if baseline in (label, path) or os.path.abspath(baseline) == os.path.abspath(path):
            return i
    if baseline.isdigit() and int(baseline) < len(paths):
        return int(baseline)
    raise CommandError(
        f"--baseline={baseline!r} is none of the runs (labels: {', '.join(labels)}; "
        f"or a directory given, or an index 0-{len(paths) - 1})."
    )


def _emit(text: str, output: Optional[str]) -> None:
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"Wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text + "\n")


def _compare(args: argparse.Namespace, paths: Sequence[str], labels: Sequence[Optional[str]]):
    from axlearn.common import run_comparison  # pylint: disable=import-outside-toplevel

    try:
        runs = [run_comparison.load_run(p, label=lbl) for p, lbl in zip(paths, labels)]
        baseline = _baseline_index(args.baseline, paths, [r.label for r in runs])
        return run_comparison.compare_runs(runs, baseline=baseline)
    except (run_comparison.NotARunError, run_comparison.NoCommonStepsError, ValueError) as e:
        raise CommandError(str(e)) from e


def compare_command(args: argparse.Namespace) -> int:
    """Runs `axlearn compare`.

    Args:
        args: Parsed arguments.

    Returns:
        0 on success (regressions are reported, not an error).

    Raises:
        CommandError: Bad input (not a run, no common steps, unknown format, bad baseline).
    """
    from axlearn.common import run_comparison_format as fmt  # pylint: disable=import-outside-toplevel

    if args.format not in _FORMATS:
        raise CommandError(
            f"Unknown --format={args.format!r}; choose one of: {', '.join(_FORMATS)}."
        )
    color = args.color == "always" or (
        args.color == "auto" and args.output is None and sys.stdout.isatty()
    )
    if args.suite:
        return _suite_command(args, color=color)
    if len(args.runs) < 2:
        raise CommandError("Give at least two run directories to compare.")
    labels = list(args.label or [])
    if labels and len(labels) != len(args.runs):
        raise CommandError(
            f"--label given {len(labels)} times for {len(args.runs)} runs; give one per run."
        )
    labels += [None] * (len(args.runs) - len(labels))
    comparison = _compare(args, args.runs, labels)
    charts: list[str] = []
    if args.plot:
        from axlearn.common import run_plots  # pylint: disable=import-outside-toplevel

        charts = run_plots.plot_runs(comparison.runs, args.plot)
        print(f"Wrote {len(charts)} charts to {args.plot}", file=sys.stderr)
    _emit(fmt.format_comparison(comparison, args.format, color=color, charts=charts), args.output)
    return 0


def _suite_command(args: argparse.Namespace, *, color: bool) -> int:
    from axlearn.common import run_comparison_format as fmt  # pylint: disable=import-outside-toplevel

    if len(args.runs) != 2:
        raise CommandError(f"--suite takes two suite directories, got {len(args.runs)}.")
    suite_a, suite_b = args.runs
    cases = {}
    for suite in (suite_a, suite_b):
        if not os.path.isdir(suite):
            raise CommandError(f"Suite directory {suite!r} does not exist.")
        cases[suite] = {d for d in os.listdir(suite) if os.path.isdir(os.path.join(suite, d))}
    common = sorted(cases[suite_a] & cases[suite_b])
    if not common:
        raise CommandError(
            f"The suites share no case: {suite_a} has {sorted(cases[suite_a])}, "
            f"{suite_b} has {sorted(cases[suite_b])}."
        )
    name_a = os.path.basename(suite_a.rstrip("/")) or suite_a
    name_b = os.path.basename(suite_b.rstrip("/")) or suite_b
    if name_a == name_b:
        name_a, name_b = suite_a, suite_b
    sections, summary, json_cases = [], [], {}
    for case in common:
        paths = [os.path.join(suite_a, case), os.path.join(suite_b, case)]
        comparison = _compare(args, paths, [name_a, name_b])
        regressions = [title for _, title in comparison.regressions]
        summary.append((case, regressions))
        if args.format == "json":
            json_cases[case] = fmt.to_json_dict(comparison)
        elif args.format == "markdown":
            sections.append(f"### {case}\n\n" + fmt.format_markdown(comparison))
        elif args.format == "html":
            sections.append(fmt.format_html(comparison, title=case))
        else:
            sections.append(f"== {case} ==\n" + fmt.format_text(comparison, color=color))
    only = sorted(cases[suite_a] ^ cases[suite_b])
    lines = [
        f"{case}: " + (("REGRESSED: " + ", ".join(regs)) if regs else "no regression")
        for case, regs in summary
    ]
    if only:
        lines.append("Cases in one suite only: " + ", ".join(only))
    if args.format == "json":
        import json  # pylint: disable=import-outside-toplevel

        text = json.dumps(
            {"cases": json_cases, "regressions": {c: r for c, r in summary}, "unpaired": only},
            indent=2,
            sort_keys=True,
        )
    elif args.format == "markdown":
        text = "\n\n".join(sections + ["### Summary\n\n" + "\n".join(f"- {x}" for x in lines)])
    elif args.format == "html":
        text = "\n".join(sections)
    else:
        text = "\n\n".join(sections + ["== Summary ==\n" + "\n".join(lines)])
    _emit(text, args.output)
    return 0
