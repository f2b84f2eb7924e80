"""`axlearn goodput TRAINER_DIR`: how much of a run's wall time, over all attempts, trained.

    axlearn goodput /tmp/run            # a table of the parts and of the attempts
    axlearn goodput /tmp/run --json     # the same as JSON

Reads `<TRAINER_DIR>/events/` (written by the local recorder, `--recorder_type=local`, the
default of `launch_trainer_main`; and by `axlearn local launch`). See docs/goodput.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from axlearn.cli.config_commands import CommandError


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `goodput` command.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    parser = groups.add_parser(
        "goodput",
        help="Split a run's wall time over all its attempts into productive steps and badput.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trainer_dir", metavar="TRAINER_DIR", help="The run's trainer dir.")
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    parser.set_defaults(func=goodput_command)


def goodput_command(args: argparse.Namespace) -> int:
    """Runs `axlearn goodput`.

    Args:
        args: Parsed arguments with `trainer_dir` and `json`.

    Returns:
        0.

    Raises:
        CommandError: If the run recorded no events (one line saying so), or the report broke
            an invariant (parts >= 0 summing to the wall time, goodput in [0, 1]).
    """
    from axlearn.common import goodput  # pylint: disable=import-outside-toplevel

    try:
        report = goodput.compute_goodput(args.trainer_dir)
    except goodput.NoEventsError as e:
        raise CommandError(str(e)) from e
    except goodput.GoodputInvariantError as e:  # Never expected: the parts hold by construction.
        raise CommandError(f"the goodput of {args.trainer_dir} breaks an invariant: {e}") from e
    for warning in report.warnings:
        print(f"axlearn goodput: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        report.warnings = []  # Already on stderr.
        print(goodput.format_goodput(report))
    return 0
