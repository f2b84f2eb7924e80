"""`axlearn config ...`: inspect named experiments' config trees.

- `axlearn config dump --module=M --config=C [--output=PATH]` prints (or writes) the config's
  `debug_string()`: one `path: value` line per leaf, keys sorted. With `--init`, AXLearn's
  `_init.txt` text instead (each model parameter's initializer, in creation order); with
  `--regularizer`, its `_regularizer.txt` text (per-parameter weight-decay scales, under
  `====================weight_decay_scale root.optimizer====================` headers).
- `axlearn config list --module=M` prints the module's config names, one per line; with no
  `--module`, every experiment module under the `experiments` package and its configs.
- `axlearn config diff --module=A --config=X [--module=B] --config=Y` and
  `axlearn config diff DUMP_A DUMP_B`: the changed, added and removed config paths, grouped by
  subtree; exit code 0 when equal, 1 when they differ, 2 on an error (so it can gate CI).
"""

from __future__ import annotations

import argparse
import os
import sys

from axlearn.common import experiment_registry
from axlearn.common.config import ConfigBase


class CommandError(Exception):
    """A command failed for a reason the user can fix; `main` prints the message and exits with
    `exit_code` (default 1)."""

    def __init__(self, message: str, *, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


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
    what = dump.add_mutually_exclusive_group()
    what.add_argument(
        "--init",
        action="store_true",
        help="Print the parameter-initializer dump (AXLearn's _init.txt) instead.",
    )
    what.add_argument(
        "--regularizer",
        action="store_true",
        help="Print the per-parameter weight-decay scales (AXLearn's _regularizer.txt) instead.",
    )
    dump.set_defaults(func=dump_command)

    listing = commands.add_parser(
        "list",
        help="List the config names of an experiment module (of every module without --module).",
    )
    _add_module_flag(listing, required=False)
    listing.set_defaults(func=list_command)

    diff = commands.add_parser(
        "diff",
        help="Show the config paths that differ between two experiments or two dump files; "
        "exit 0 when equal, 1 when different.",
        description="Either two dump files (`axlearn config dump` output, or a trainer dir's "
        "trainer_config), or --config twice with --module once (both configs in that module) or "
        "twice (one per config).",
    )
    diff.add_argument(
        "dumps", nargs="*", metavar="DUMP", help="Two config dump files (or trainer dirs)."
    )
    diff.add_argument(
        "--module", action="append", default=None, help="Experiment module (once or twice)."
    )
    diff.add_argument("--config", action="append", default=None, help="Config name (twice).")
    diff.add_argument(
        "--depth", type=int, default=2, help="Path components that name a group (default 2)."
    )
    diff.set_defaults(func=diff_command)


def _add_module_flag(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--module",
        required=required,
        help="Experiment module: full path (axlearn.experiments.text.gpt.tiny) or relative to the "
        "axlearn.experiments package (text.gpt.tiny).",
    )


def dump_command(args: argparse.Namespace) -> int:
    """Prints (or writes to `--output`) the `debug_string()` of a named trainer config.

    With `--init` / `--regularizer`, prints the `_init.txt` / `_regularizer.txt` text instead
    (see `axlearn.common.golden_config`).

    Args:
        args: Parsed arguments with `module`, `config`, `output`, `init` and `regularizer`.

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
    if getattr(args, "init", False) or getattr(args, "regularizer", False):
        # Imported here: it pulls in the model and learner stack.
        from axlearn.common import golden_config  # pylint: disable=import-outside-toplevel

        text = golden_config.init_text(cfg) if args.init else golden_config.regularizer_text(cfg)
    else:
        text = cfg.debug_string() + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _config_dump(module: str, config: str) -> str:
    try:
        config_fn = experiment_registry.get_named_trainer_config(config, config_module=module)
    except _LOOKUP_ERRORS as e:
        raise CommandError(str(e), exit_code=2) from e
    cfg = config_fn()
    if not isinstance(cfg, ConfigBase):
        raise CommandError(
            f"Config function {config!r} of {module!r} returned {type(cfg).__name__}, not a config",
            exit_code=2,
        )
    return cfg.debug_string()


def list_command(args: argparse.Namespace) -> int:
    """Prints the config names of an experiment module, sorted, one per line.

    Without `--module`, prints every experiment module under the `experiments` package, each
    followed by its config names (indented).

    Args:
        args: Parsed arguments with `module` (may be None).

    Returns:
        0 on success.

    Raises:
        CommandError: If the module cannot be found.
    """
    if args.module is None:
        for module, names in experiment_registry.list_experiment_modules().items():
            print(module)
            for name in names:
                print(f"  {name}")
        return 0
    try:
        configs = experiment_registry.named_trainer_configs(args.module)
    except _LOOKUP_ERRORS as e:
        raise CommandError(str(e)) from e
    for name in sorted(configs):
        print(name)
    return 0


# The largest config dump `config diff` reads (the largest golden dump is well under 1 MB).
MAX_DUMP_BYTES = 64 * 2**20


def _read_dump(path: str) -> str:
    """Reads a config dump as text, refusing a binary, non-UTF-8 or oversized file (exit 2)."""
    chunks, size = [], 0
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(2**20)
                if not chunk:
                    break
                if b"\0" in chunk:
                    raise CommandError(
                        f"{path} is a binary file, not a config dump (a dump is the text of "
                        "`axlearn config dump` or a trainer dir's `trainer_config`).",
                        exit_code=2,
                    )
                size += len(chunk)
                if size > MAX_DUMP_BYTES:
                    raise CommandError(
                        f"{path} is over {MAX_DUMP_BYTES // 2**20} MiB: not a config dump "
                        "(refused before reading it whole).",
                        exit_code=2,
                    )
                chunks.append(chunk)
    except OSError as e:
        raise CommandError(f"Cannot read dump {path!r}: {e}", exit_code=2) from e
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CommandError(
            f"{path} is not UTF-8 text (byte {e.start}), not a config dump.", exit_code=2
        ) from e


def diff_command(args: argparse.Namespace) -> int:
    """Prints the config paths that differ between two configs.

    Args:
        args: Parsed arguments: `dumps` (two files), or `module` (1-2) and `config` (2).

    Returns:
        0 when the configs are equal (nothing printed), 1 when they differ.

    Raises:
        CommandError: (exit code 2) Wrong arguments, unknown module/config, unreadable dump.
    """
    from axlearn.common import config_diff  # pylint: disable=import-outside-toplevel

    modules, configs = args.module or [], args.config or []
    if args.dumps:
        if len(args.dumps) != 2 or modules or configs:
            raise CommandError(
                "config diff takes two dump files, or --config twice with --module once or "
                f"twice; got files {args.dumps}, --module {modules}, --config {configs}.",
                exit_code=2,
            )
        texts, labels = [], list(args.dumps)
        for path in args.dumps:
            if os.path.isdir(path):
                # A trainer dir: its record's dump (the config the run trained with).
                path = os.path.join(path, "trainer_config")
            texts.append(_read_dump(path))
    else:
        if len(configs) != 2 or len(modules) not in (1, 2):
            raise CommandError(
                "config diff needs --config twice and --module once or twice (or two dump "
                f"files); got --module {modules}, --config {configs}.",
                exit_code=2,
            )
        if len(modules) == 1:
            modules = modules * 2
        texts = [_config_dump(m, c) for m, c in zip(modules, configs)]
        labels = [f"{m}:{c}" for m, c in zip(modules, configs)]
    try:
        diff = config_diff.diff_config_dumps(
            texts[0], texts[1], source_a=labels[0], source_b=labels[1]
        )
    except config_diff.ConfigDumpFormatError as e:
        raise CommandError(
            f"{e}. config diff compares two config dumps: a trainer dir (its `trainer_config`), "
            "or the output of `axlearn config dump`.",
            exit_code=2,
        ) from e
    if not diff:
        return 0
    print(
        config_diff.format_config_diff(diff, label_a=labels[0], label_b=labels[1], depth=args.depth)
    )
    return 1
