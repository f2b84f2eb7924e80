"""`axlearn local launch --num_processes=N -- COMMAND`: N local processes, as a JobSet's pods.

Each process gets the environment a GKE pod at the same position gets (DISTRIBUTED_COORDINATOR,
NUM_PROCESSES, PROCESS_ID; see `axlearn.cloud.common.process_env`), so

    axlearn local launch --num_processes=2 -- python -m axlearn.common.launch_trainer_main \\
        --module=text.gpt.tiny --config=gpt-tiny --trainer_dir=/tmp/gpt-tiny-2p --data_dir=FAKE

trains one model with two `jax.distributed` processes. Output lines are prefixed `[i] `; when a
process fails the others are stopped and its exit code is returned.
"""

from __future__ import annotations

import argparse

from axlearn.cli.config_commands import CommandError


def strip_separator(command: list[str]) -> list[str]:
    """Returns the command after a leading `--` (argparse keeps it in a REMAINDER)."""
    return command[1:] if command and command[0] == "--" else command


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `local` command group.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    group = groups.add_parser("local", help="Run jobs on this machine as they run on GKE.")
    commands = group.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    launch = commands.add_parser(
        "launch",
        help="Start N processes of a command on 127.0.0.1 with the JobSet pods' environment.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    launch.add_argument(
        "--num_processes", type=int, default=1, help="How many processes to start (default 1)."
    )
    launch.add_argument(
        "--port", type=int, default=None, help="Coordinator port on 127.0.0.1 (default: free)."
    )
    launch.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    launch.set_defaults(func=launch_command)


def launch_command(args: argparse.Namespace) -> int:
    """Runs `axlearn local launch`.

    Args:
        args: Parsed arguments with `num_processes`, `port` and `cmd`.

    Returns:
        0, or the exit code of the first process that failed.

    Raises:
        CommandError: No command, or --num_processes < 1.
    """
    from axlearn.cloud.common.local_launch import launch_local  # pylint: disable=C0415

    try:
        return launch_local(
            strip_separator(args.cmd), num_processes=args.num_processes, port=args.port
        )
    except ValueError as e:
        raise CommandError(str(e)) from e
