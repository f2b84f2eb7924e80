"""`axlearn aot`: compile a named experiment for a TPU topology here and report whether it fits.

    axlearn aot --module=text.gpt.honeycrisp --config=honeycrisp-3B --topology=v5litepod-256

Same flags as `python -m axlearn.experiments.run_aot_compilation`; jax and libtpu are imported only
when the command runs. Exit code 0 when the train step fits, 1 when it does not (or on an error).
"""

from __future__ import annotations

import argparse

from axlearn.cli.config_commands import CommandError


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `aot` command.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    parser = groups.add_parser(
        "aot",
        help="Compile an experiment for a TPU topology on this machine (libtpu) and report "
        "per-chip memory vs HBM, FLOPs and the mesh.",
    )
    parser.add_argument("--module", required=True, help="The experiment module.")
    parser.add_argument("--config", required=True, help="The config name.")
    parser.add_argument(
        "--topology", required=True, help="TPU topology, e.g. v5p-128, v5litepod-256."
    )
    parser.add_argument("--topology_num_slices", type=int, default=1, help="Number of slices.")
    parser.add_argument(
        "--compiler_options",
        choices=["none", "default"],
        default="none",
        help="XLA options: none, or axlearn.common.compiler_options' per-generation defaults.",
    )
    parser.add_argument("--dump_hlo", default=None, help="Directory for the optimized HLO.")
    parser.add_argument(
        "--report",
        "--report_json",
        dest="report",
        default=None,
        help="Where to write the JSON report (default: "
        "~/.cache/axlearn/aot_reports/<module>_<config>@<topology>x<slices>.json; never the "
        "current directory).",
    )
    parser.add_argument(
        "--config_override",
        action="append",
        default=[],
        help="PATH=VALUE change to the config (repeatable), as launch_trainer_main's.",
    )
    parser.add_argument(
        "--remat",
        default=None,
        help="Remat of every transformer layer: none, save_matmuls, save_context, full, or all "
        "(each compiled in turn, then a table of their memory). Default: the experiment's.",
    )
    parser.set_defaults(func=aot_command)


def aot_command(args: argparse.Namespace) -> int:
    """Runs `axlearn aot`.

    Args:
        args: The parsed arguments.

    Returns:
        0 when the train step fits, 1 when it does not.

    Raises:
        CommandError: Unknown topology or experiment, or libtpu missing (the message says which
            extra to install).
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.experiments.run_aot_compilation import exit_interrupted, run_aot

    try:
        return run_aot(
            module=args.module,
            config=args.config,
            topology=args.topology,
            topology_num_slices=args.topology_num_slices,
            compiler_options=args.compiler_options,
            dump_hlo=args.dump_hlo,
            report_json=args.report,
            config_overrides=args.config_override,
            remat=args.remat,
        )
    except (ValueError, ImportError) as e:
        raise CommandError(str(e)) from e
    except KeyboardInterrupt:
        exit_interrupted("axlearn aot")
        raise  # Not reached.
