"""`axlearn local launch --num_processes=N -- COMMAND`: N local processes, as a JobSet's pods.

Each process gets the environment a GKE pod at the same position gets (DISTRIBUTED_COORDINATOR,
NUM_PROCESSES, PROCESS_ID; see `axlearn.cloud.common.process_env`), so

    axlearn local launch --num_processes=2 -- python -m axlearn.common.launch_trainer_main \\
        --module=text.gpt.tiny --config=gpt-tiny --trainer_dir=/tmp/gpt-tiny-2p --data_dir=FAKE

trains one model with two `jax.distributed` processes. Output lines are prefixed `[i] `; when a
process fails the others are stopped and its exit code is returned.

--max_restarts=N restarts every process after any fails, up to N times (as the JobSet's
failurePolicy.maxRestarts does on GKE); the trainer resumes from its last committed checkpoint.
Each failed attempt is logged with its cause; when the command has --trainer_dir=DIR, the
attempts are also recorded in DIR/events/launcher.jsonl for `axlearn goodput DIR`.
"""

from __future__ import annotations

import argparse
from typing import Optional

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
    launch.add_argument(
        "--max_restarts",
        type=int,
        default=0,
        help="Restart every process after any fails, up to this many times (default 0).",
    )
    launch.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    launch.set_defaults(func=launch_command)


def trainer_dir_of(command: list[str]) -> Optional[str]:
    """Returns the value of `--trainer_dir` in a command, if it has one.

    Args:
        command: The command and its arguments.

    Returns:
        The trainer dir, or None.
    """
    for i, arg in enumerate(command):
        if arg.startswith("--trainer_dir="):
            return arg.split("=", 1)[1] or None
        if arg == "--trainer_dir" and i + 1 < len(command):
            return command[i + 1]
    return None


def launch_command(args: argparse.Namespace) -> int:
    """Runs `axlearn local launch`.

    Args:
        args: Parsed arguments with `num_processes`, `port`, `max_restarts` and `cmd`.

    Returns:
        0, or the exit code of the first process that failed (in the last attempt).

    Raises:
        CommandError: No command, --num_processes < 1 or --max_restarts < 0.
    """
    from axlearn.cloud.common.local_launch import launch_local  # pylint: disable=C0415

    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.measurement_local import events_dir

    command = strip_separator(args.cmd)
    trainer_dir = trainer_dir_of(command)
    try:
        return launch_local(
            command,
            num_processes=args.num_processes,
            port=args.port,
            max_restarts=args.max_restarts,
            events_dir=events_dir(trainer_dir) if trainer_dir else None,
        )
    except ValueError as e:
        raise CommandError(str(e)) from e
