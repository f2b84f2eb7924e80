"""`axlearn hf export` and `axlearn hf import`: Hugging Face Llama directories <-> trained runs.

- `axlearn hf export --trainer_dir=DIR [--step N] --output=HF_DIR [--max_shard_gb G]
  [--overwrite]` writes the checkpoint's model as `config.json` + `model.safetensors` (sharded
  above G GB) + tokenizer files, loadable with
  `transformers.LlamaForCausalLM.from_pretrained(HF_DIR)`. A non-empty HF_DIR needs
  `--overwrite`, which replaces only the files an earlier export wrote there.
- `axlearn hf import HF_DIR --module=M --config=C --trainer_dir=DIR [--config_override ...]`
  writes a step-0 trainer checkpoint of experiment C with HF_DIR's weights into DIR; then
  `python -m axlearn.common.launch_trainer_main --module=M --config=C --trainer_dir=DIR` (with
  the same overrides) fine-tunes from it.

See `axlearn.common.hf_checkpoint`.
"""

from __future__ import annotations

import argparse
import os

from axlearn.cli.config_commands import CommandError
from axlearn.common.accelerator_probe import quiet_accelerator_probes


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `hf` command group and its subcommands.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    group = groups.add_parser("hf", help="Export to / import from Hugging Face Llama directories.")
    commands = group.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    export = commands.add_parser("export", help="Write a run's checkpoint as a Llama directory.")
    export.add_argument("--trainer_dir", required=True, help="The trained run's trainer dir.")
    export.add_argument("--step", type=int, default=None, help="The step; default: the latest.")
    export.add_argument("--output", required=True, help="The Hugging Face directory to write.")
    export.add_argument(
        "--module",
        default=None,
        help="The run's experiment module, when it is not one of axlearn's (a module named only "
        "by the run's record is never imported).",
    )
    export.add_argument(
        "--max_shard_gb",
        type=float,
        default=5.0,
        help="Largest safetensors file in GB; bigger models are sharded (default 5).",
    )
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="Allow a non-empty --output: replace the files an earlier export wrote there "
        "(other files are kept; a file of an exported name that no export wrote is refused).",
    )
    export.set_defaults(func=export_command)
    imp = commands.add_parser(
        "import", help="Write a step-0 trainer checkpoint from a Llama directory (fine-tuning)."
    )
    imp.add_argument("hf_dir", help="The Hugging Face directory (safetensors weights).")
    imp.add_argument("--module", required=True, help="The experiment module.")
    imp.add_argument("--config", required=True, help="The experiment's config name.")
    imp.add_argument("--trainer_dir", required=True, help="The new run's trainer dir.")
    imp.add_argument(
        "--config_override",
        action="append",
        default=[],
        help="PATH=VALUE override of the trainer config (repeatable; pass the same ones to "
        "launch_trainer_main).",
    )
    imp.set_defaults(func=import_command)


def export_command(args: argparse.Namespace) -> int:
    """Exports a run's checkpoint to `--output`.

    Args:
        args: Parsed arguments (see `add_parser`).

    Returns:
        0 on success.

    Raises:
        CommandError: If the run cannot be read or the model has no Llama equivalent.
    """
    quiet_accelerator_probes()  # Before JAX or TensorFlow start (no E-lines on CPU).
    # pylint: disable=import-outside-toplevel
    from axlearn.common.hf_checkpoint import HfConversionError, export_trainer_dir
    from axlearn.common.launch_trainer import TrainerDirError

    if args.max_shard_gb <= 0:
        raise CommandError(f"--max_shard_gb must be > 0, got {args.max_shard_gb}")
    try:
        step, written = export_trainer_dir(
            args.trainer_dir,
            args.output,
            step=args.step,
            max_shard_bytes=int(args.max_shard_gb * 1e9),
            overwrite=args.overwrite,
            module=args.module,
        )
    except (HfConversionError, TrainerDirError, ValueError) as e:
        raise CommandError(str(e)) from e
    except OSError as e:  # E.g. a name too long for the filesystem.
        raise CommandError(f"{e.filename or args.output}: {e.strerror}") from e
    print(f"Exported step {step} of {args.trainer_dir} to {args.output}: {', '.join(written)}")
    return 0


def import_command(args: argparse.Namespace) -> int:
    """Writes a step-0 checkpoint of the experiment with the weights of `args.hf_dir`.

    Args:
        args: Parsed arguments (see `add_parser`).

    Returns:
        0 on success.

    Raises:
        CommandError: If the directory does not match the experiment's model.
    """
    quiet_accelerator_probes()  # Before JAX or TensorFlow start (no E-lines on CPU).
    # pylint: disable=import-outside-toplevel
    from axlearn.common import experiment_registry
    from axlearn.common.config.override import ConfigOverrideError, apply_overrides
    from axlearn.common.hf_checkpoint import HfConversionError, import_hf_dir
    from axlearn.common.launch_trainer import apply_launch_settings

    if not os.path.isdir(args.hf_dir):
        raise CommandError(f"{args.hf_dir} is not a directory")
    try:
        cfg = experiment_registry.get_named_trainer_config(args.config, config_module=args.module)()
        apply_overrides(cfg, args.config_override)
    except (ValueError, ConfigOverrideError) as e:
        raise CommandError(str(e)) from e
    cfg.dir = args.trainer_dir
    settings = argparse.Namespace(
        trainer_dir=args.trainer_dir,
        mesh_selector=None,
        trace_at_steps=[],
        trainer_watchdog_timeout_seconds=None,
        data_dir=None,
        restore_step=None,
        restore_fallback=None,
    )
    cfg = apply_launch_settings(cfg, flag_values=settings)
    try:
        step_dir = import_hf_dir(args.hf_dir, cfg)
    except (HfConversionError, ValueError) as e:
        raise CommandError(str(e)) from e
    print(f"Wrote {step_dir}. Fine-tune with:")
    overrides = "".join(f" --config_override={o!r}" for o in args.config_override)
    print(
        f"  python -m axlearn.common.launch_trainer_main --module={args.module} "
        f"--config={args.config} --trainer_dir={args.trainer_dir}{overrides}"
    )
    return 0
