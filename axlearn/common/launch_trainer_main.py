"""Trains a named experiment.

    python -m axlearn.common.launch_trainer_main --module=text.gpt.tiny --config=<name> \\
        --trainer_dir=/tmp/run --jax_backend=cpu [--data_dir=FAKE] [--mesh_selector=cpu]

Multi-process CPU/GPU runs add --distributed_coordinator=HOST:PORT --num_processes=N
--process_id=I on every process; TPU pods discover their peers.

--config_override=PATH=VALUE (repeatable) changes a field of the config, e.g.
--config_override=max_step=20; the trainer dir's `trainer_config` dump records the result.
--verbose_start logs the config dump and parameter table (by default they go to files in the
trainer dir: `trainer_config`, `model_parameters.txt`).

`--help` prints these lines and the training flags and exits 0. A mistake in the command line
(an unknown flag, experiment or config, a missing --trainer_dir, a bad --config_override) is
one line naming it and the fix, exit code 1, without a traceback.
"""

import errno
import os
import re
import sys
from typing import Any

from absl import app, flags, logging

# `launch` defines the process flags and must come before anything that touches devices.
from axlearn.common import launch  # isort: skip
from axlearn.common import experiment_registry, launch_trainer, measurement, measurement_base
from axlearn.common.checkpointer import (
    CheckpointCorruptionError,
    RestoreStepError,
    StateMismatchError,
)
from axlearn.common.config.override import ConfigOverrideError
from axlearn.common.config_ranges import ConfigRangeError
from axlearn.common.mesh_resolution import MeshSelectorError
from axlearn.common.run_lock import RunLockError

_PROG = "launch_trainer_main"
_HELP_ARGS = ("--help", "-h", "--helpshort", "-?")

# Errors in what the user typed: reported in one line, without a traceback.
_USER_ERRORS = (
    ConfigOverrideError,
    experiment_registry.ExperimentModuleNotFoundError,
    experiment_registry.NotAnExperimentModuleError,
    experiment_registry.UnknownTrainerConfigError,
)


def help_text() -> str:
    """Returns the `--help` text: the usage above and every training flag with its help.

    Returns:
        The text.
    """
    parts = [__doc__.strip(), ""]
    for module in (launch_trainer, measurement_base, launch):
        parts.append(f"Flags of {module.__name__}:")
        parts.append(flags.FLAGS.module_help(module))
        parts.append("")
    parts.append("absl's logging flags (--v, --logtostderr, ...): --helpfull.")
    return "\n".join(parts)


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses the flags; a mistake exits with one line that names it and the fix."""
    try:
        return flags.FLAGS(argv)
    except flags.UnrecognizedFlagError as e:
        name = e.flagname
        sys.exit(
            f"{_PROG}: error: unknown flag --{name}. Fields of the trainer config are set with "
            f"--config_override=PATH=VALUE (e.g. --config_override={name}=...); --help lists "
            "the flags."
        )
    except flags.Error as e:
        sys.exit(f"{_PROG}: error: {e}. --help lists the flags.")


def main(_):
    """Sets up JAX, builds the trainer config from flags, and runs it."""
    if not flags.FLAGS.module or not flags.FLAGS.config:
        sys.exit(
            f"{_PROG}: error: --module and --config are required (e.g. --module=text.gpt.tiny "
            "--config=gpt-tiny); `axlearn config list` lists the experiments and their configs."
        )
    try:
        # Before any device is set up: a mistyped experiment fails at once.
        config_fn = experiment_registry.get_named_trainer_config(
            flags.FLAGS.config, config_module=flags.FLAGS.module
        )
    except (ValueError, *_USER_ERRORS) as e:
        sys.exit(f"{_PROG}: error: {e}")
    fv = flags.FLAGS
    if fv.trainer_dir and os.path.exists(fv.trainer_dir) and not os.path.isdir(fv.trainer_dir):
        # Before anything writes under it (the event recorder, the run lock).
        sys.exit(
            f"{_PROG}: error: --trainer_dir={fv.trainer_dir} is a file, not a directory: pass a "
            "directory (a new one is created)."
        )
    if fv.recorder_type == "local" and not fv.recorder_spec and "://" in (fv.trainer_dir or "://"):
        # The config sets its own dir, or the dir is remote (gs://, which cannot be appended to):
        # the default recorder has nowhere to write.
        logging.info(
            "The run's events are not recorded: the local recorder appends to a local "
            "directory (--recorder_spec=dir=PATH picks one; --trainer_dir=%s is not).",
            fv.trainer_dir,
        )
    else:
        try:
            measurement.initialize(fv)
        except ValueError as e:
            sys.exit(f"{_PROG}: error: {e}")
    measurement.record_event(measurement.Event.START_JOB)
    try:
        with measurement.record_span(measurement.EventType.ACCELERATOR_INIT):
            launch.setup()
    except launch.LaunchFlagError as e:
        sys.exit(f"{_PROG}: error: {e}")
    try:
        trainer_config = launch_trainer.get_trainer_config(config_fn)
    except ConfigOverrideError as e:
        sys.exit(f"{_PROG}: error: --config_override: {e}")
    except (ValueError, MeshSelectorError, *_USER_ERRORS) as e:
        # A missing --trainer_dir, a --mesh_selector matching no rule (the message names the
        # flag, the rules and the fix), an unknown experiment.
        sys.exit(f"{_PROG}: error: {e}")
    try:
        launch_trainer.run_trainer(trainer_config)
        measurement.record_event(measurement.Event.END_JOB)
    except (
        ConfigRangeError,
        launch_trainer.InvalidTrainerConfigError,
        RunLockError,
        CheckpointCorruptionError,
        RestoreStepError,
        StateMismatchError,
    ) as e:
        # Also a damaged checkpoint (the message names the file and --restore_fallback) and a
        # model that does not match the checkpoint (naming the parameters).
        sys.exit(f"{_PROG}: error: {e}")
    except Exception as e:  # pylint: disable=broad-except
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            _exit_disk_full(e, trainer_config)
        if "RESOURCE_EXHAUSTED" in str(e):
            sys.exit(f"{_PROG}: error: {out_of_memory_message(str(e))}")
        raise


def out_of_memory_message(error: str) -> str:
    """One line for a train step that does not fit in device memory (XLA's RESOURCE_EXHAUSTED).

    Args:
        error: The XLA error text.

    Returns:
        The message: how much was asked for and what to change.
    """
    match = re.search(r"allocating (\d+) bytes", error)
    asked = f" (it asked for {int(match.group(1)) / 1e9:,.1f} GB at once)" if match else ""
    return (
        f"the train step does not fit in device memory{asked}: lower the sequence length "
        "(e.g. input.source.max_sequence_length), the global batch size (input.batcher."
        "global_batch_size) or the model, or use more devices; the compiled memory analysis is "
        "in the log above."
    )


def _exit_disk_full(e: OSError, trainer_config: Any) -> None:
    """Exits with one line naming the path that could not be written (a full disk or quota)."""
    where = e.filename or trainer_config.dir
    sys.exit(
        f"{_PROG}: error: {e.strerror or e} (writing {where}). Free space and rerun the same "
        "command: the run resumes from its last committed checkpoint."
    )


if __name__ == "__main__":
    if any(arg in _HELP_ARGS for arg in sys.argv[1:]):
        print(help_text())
        sys.exit(0)
    app.run(main, flags_parser=_parse_flags)
