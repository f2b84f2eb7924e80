"""`axlearn config ...`: inspect named experiments' config trees.

- `axlearn config dump --module=M --config=C [--output=PATH]` prints (or writes) the config's
  `debug_string()`: one `path: value` line per leaf, keys sorted.
- `axlearn config list --module=M` prints the module's config names, one per line.
"""

from __future__ import annotations

import argparse
import sys

from axlearn.common import experiment_registry
from axlearn.common.config import ConfigBase


class CommandError(Exception):
    """A command failed for a reason the user can fix; `main` prints the message, exits 1."""


# The errors of an experiment lookup whose messages are complete explanations for the user.
_LOOKUP_ERRORS = (
    ValueError,
    experiment_registry.ExperimentModuleNotFoundError,
    experiment_registry.NotAnExperimentModuleError,
)


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `config` command group and its subcommands.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    group = groups.add_parser("config", help="Inspect named experiment configs.")
    commands = group.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)

    dump = commands.add_parser(
        "dump", help="Print a named experiment's trainer config, one `path: value` per line."
    )
    _add_module_flag(dump)
    dump.add_argument(
        "--config", required=True, help="The config name, a key of named_trainer_configs()."
    )
    dump.add_argument(
        "--output", default=None, help="Write the dump to this file instead of stdout."
    )
    dump.set_defaults(func=dump_command)

    listing = commands.add_parser("list", help="List the config names of an experiment module.")
    _add_module_flag(listing)
    listing.set_defaults(func=list_command)


def _add_module_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--module",
        required=True,
        help="Experiment module: full path (experiments.text.gpt.tiny) or relative to the "
        "experiments package (text.gpt.tiny).",
    )


def dump_command(args: argparse.Namespace) -> int:
    """Prints (or writes to `--output`) the `debug_string()` of a named trainer config.

    Args:
        args: Parsed arguments with `module`, `config` and `output`.

    Returns:
        0 on success.

    Raises:
        CommandError: If the module or config cannot be found, or the config function does not
            return a config.
    """
    try:
        config_fn = experiment_registry.get_named_trainer_config(
            args.config, config_module=args.module
        )
    except _LOOKUP_ERRORS as e:  # UnknownTrainerConfigError is a ValueError.
        raise CommandError(str(e)) from e
    cfg = config_fn()
    if not isinstance(cfg, ConfigBase):
        raise CommandError(
            f"Config function {args.config!r} of {args.module!r} returned "
            f"{type(cfg).__name__}, not a config"
        )
    text = cfg.debug_string() + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def list_command(args: argparse.Namespace) -> int:
    """Prints the config names of an experiment module, sorted, one per line.

    Args:
        args: Parsed arguments with `module`.

    Returns:
        0 on success.

    Raises:
        CommandError: If the module cannot be found.
    """
    try:
        configs = experiment_registry.named_trainer_configs(args.module)
    except _LOOKUP_ERRORS as e:
        raise CommandError(str(e)) from e
    for name in sorted(configs):
        print(name)
    return 0
