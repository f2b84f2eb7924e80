"""The `axlearn` command: entry point of the console script declared in pyproject.toml.

Usage:

    axlearn config dump --module=text.gpt.tiny --config=gpt-tiny
    axlearn config list --module=text.gpt.tiny
    axlearn config diff --module=text.gpt.tiny --config=gpt-tiny \
        --module=text.gpt.honeycrisp --config=honeycrisp-3B
    axlearn checkpoint verify /path/to/checkpoints
    axlearn aot --module=text.gpt.honeycrisp --config=honeycrisp-3B --topology=v5litepod-256
    axlearn gcp launch --dry_run --name=x --instance_type=tpu-v5p-128 -- python -m ...
    axlearn local launch --num_processes=2 -- python -m axlearn.common.launch_trainer_main ...
    axlearn compare /tmp/run_main /tmp/run_branch --format=markdown
    axlearn goodput /tmp/gpt-tiny [--json]
    axlearn pipeline ticks --schedule=1f1b --num_stages=4 --num_microbatches=8
    axlearn eval --trainer_dir=/tmp/gpt-tiny [--step 300]
    axlearn generate --trainer_dir=/tmp/gpt-tiny --prompt="The Python" --seed=0
    axlearn hf export --trainer_dir=/tmp/gpt-tiny --output=/tmp/gpt-tiny-hf
    axlearn --version

Each command group lives in its own module under `axlearn/cli/` and registers its subcommands
with `add_parser(subparsers)`. Start-up stays light: nothing heavy (jax, TensorFlow, seqio) is
imported until a command needs it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Optional

from axlearn.cli import (
    aot,
    checkpoint,
    compare,
    config_commands,
    gcp,
    goodput,
    hf,
    inference_commands,
    local,
    pipeline_commands,
)


def version_string() -> str:
    """Returns "axlearn X.Y.Z (jax A.B.C, Python D.E.F)" without importing jax.

    Returns:
        The version line.
    """
    from importlib import metadata  # pylint: disable=import-outside-toplevel

    import axlearn  # pylint: disable=import-outside-toplevel

    try:
        jax_version = metadata.version("jax")
    except metadata.PackageNotFoundError:
        jax_version = "not installed"
    python = ".".join(str(v) for v in sys.version_info[:3])
    return f"axlearn {axlearn.__version__} (jax {jax_version}, Python {python})"


def build_parser() -> argparse.ArgumentParser:
    """Returns the parser of the `axlearn` command with every command group registered.

    Returns:
        The parser; each leaf subcommand sets the `func` default to its handler, which takes the
        parsed arguments and returns an exit code.
    """
    parser = argparse.ArgumentParser(
        prog="axlearn",
        description="axlearn: configure, inspect and run training experiments.",
    )
    parser.add_argument(
        "--version", action="version", version=version_string(), help="Print the version and exit."
    )
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    config_commands.add_parser(groups)
    checkpoint.add_parser(groups)
    aot.add_parser(groups)
    gcp.add_parser(groups)
    local.add_parser(groups)
    inference_commands.add_parser(groups)
    hf.add_parser(groups)
    compare.add_parser(groups)
    goodput.add_parser(groups)
    pipeline_commands.add_parser(groups)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the `axlearn` command.

    The current directory is appended to `sys.path`, so that `--module` can name experiment
    modules of a project that is not installed.

    Args:
        argv: The arguments after the program name; defaults to `sys.argv[1:]`.

    Returns:
        The exit code: 0 on success, 1 when the command failed (the reason is printed to
        stderr), 2 on a usage error.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv):
        if len(arg) > MAX_ARG_CHARS:
            print(
                f"axlearn: error: argument {i + 1} ({arg[:60]!r}...) is {len(arg)} characters, "
                f"more than the {MAX_ARG_CHARS} an argument may have; shorten it (large values "
                "belong in the experiment's code or a config modifier)",
                file=sys.stderr,
            )
            return 2
    argv = gcp.normalize_argv(argv)
    args = parser.parse_args(argv)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return args.func(args)
    except config_commands.CommandError as e:
        print(f"axlearn {args.group}: error: {_bounded(str(e))}", file=sys.stderr)
        return e.exit_code


# The longest command-line argument accepted (an override may hold 65536 characters).
MAX_ARG_CHARS = 70_000
# The longest line of an error message printed (longer ones keep their start and end).
_MAX_ERROR_LINE = 4000


def _bounded(message: str) -> str:
    """`message` with each line over `_MAX_ERROR_LINE` characters cut in its middle."""
    half = _MAX_ERROR_LINE // 2
    return "\n".join(
        line
        if len(line) <= _MAX_ERROR_LINE
        else f"{line[:half]} ...[{len(line) - 2 * half} characters cut]... {line[-half:]}"
        for line in message.split("\n")
    )


if __name__ == "__main__":
    sys.exit(main())
