"""`axlearn pipeline ticks`: prints a pipeline schedule's tick table and bubble fraction.

    axlearn pipeline ticks --schedule=1f1b --num_stages=4 --num_microbatches=8
    axlearn pipeline ticks --schedule=interleaved_1f1b --num_stages=4 --num_microbatches=8 \
        --num_virtual_stages=2
    axlearn pipeline ticks --module=text.gpt.c4_trainer --config=gspmd-16B-2x16x8

With `--module/--config`, every pipelined transformer stack of the named trainer config is
printed (its path, then its table). jax is imported only when the command runs.
"""

from __future__ import annotations

import argparse

from axlearn.cli.config_commands import CommandError

_SCHEDULES = ("gpipe", "circular", "1f1b", "interleaved_1f1b")


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `pipeline` command group.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    group = groups.add_parser("pipeline", help="Inspect pipeline-parallel schedules.")
    commands = group.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    ticks = commands.add_parser(
        "ticks", help="Print what every stage runs at every tick, and the bubble fraction."
    )
    ticks.add_argument("--schedule", choices=_SCHEDULES, default="1f1b", help="Schedule name.")
    ticks.add_argument("--num_stages", type=int, default=None, help="S (pipeline axis size).")
    ticks.add_argument("--num_microbatches", type=int, default=None, help="M.")
    ticks.add_argument(
        "--num_virtual_stages", type=int, default=1, help="V (circular / interleaved_1f1b)."
    )
    ticks.add_argument("--module", default=None, help="Experiment module (with --config).")
    ticks.add_argument("--config", default=None, help="Named trainer config of --module.")
    ticks.set_defaults(func=ticks_command)


def _find_stacks(cfg, path: str, klass, found: list) -> None:
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.config import ConfigBase

    if isinstance(cfg, ConfigBase):
        target = getattr(cfg, "klass", None)
        if isinstance(target, type) and issubclass(target, klass):
            found.append((path, cfg))
            return
        for key in cfg.keys():
            _find_stacks(getattr(cfg, key), f"{path}.{key}" if path else key, klass, found)
    elif isinstance(cfg, (list, tuple)):
        for i, item in enumerate(cfg):
            _find_stacks(item, f"{path}[{i}]", klass, found)
    elif isinstance(cfg, dict):
        for key, item in cfg.items():
            _find_stacks(item, f"{path}.{key}", klass, found)


def _instantiate(schedule_cfg, num_stages: int, num_microbatches: int, where: str):
    try:
        return schedule_cfg.clone(
            num_stages=num_stages, num_microbatches=num_microbatches
        ).instantiate()
    except ValueError as e:
        raise CommandError(f"{where}: {e}") from e


def ticks_command(args: argparse.Namespace) -> int:
    """Prints the tick table(s).

    Args:
        args: Parsed arguments (see `add_parser`).

    Returns:
        0 on success.

    Raises:
        CommandError: On missing or conflicting flags, a bad schedule, or a config without a
            pipelined stack.
    """
    # pylint: disable=import-outside-toplevel
    from axlearn.common.attention import PipelinedTransformerLayer, schedule_config
    from axlearn.common.pipeline_1f1b import format_schedule_table

    if (args.module is None) != (args.config is None):
        raise CommandError("pass --module and --config together (or neither)")
    if args.module is not None:
        from axlearn.cli.config_commands import _LOOKUP_ERRORS
        from axlearn.common import experiment_registry

        try:
            config_fn = experiment_registry.get_named_trainer_config(
                args.config, config_module=args.module
            )
        except _LOOKUP_ERRORS as e:
            raise CommandError(str(e)) from e
        found = []
        _find_stacks(config_fn(), "", PipelinedTransformerLayer, found)
        if not found:
            raise CommandError(
                f"{args.module} {args.config} has no PipelinedTransformerLayer; pipeline it with "
                "PipelineModifier or pass --num_stages/--num_microbatches"
            )
        for path, stack in found:
            schedule = _instantiate(
                stack.pipeline.schedule, stack.num_stages, stack.num_microbatches, path
            )
            print(f"{path}:")
            print(format_schedule_table(schedule))
        return 0
    if args.num_stages is None or args.num_microbatches is None:
        raise CommandError("pass --num_stages and --num_microbatches (or --module and --config)")
    try:
        cfg = schedule_config(args.schedule, num_virtual_stages=args.num_virtual_stages)
    except ValueError as e:
        raise CommandError(f"--schedule: {e}") from e
    schedule = _instantiate(cfg, args.num_stages, args.num_microbatches, "axlearn pipeline ticks")
    print(format_schedule_table(schedule))
    return 0
