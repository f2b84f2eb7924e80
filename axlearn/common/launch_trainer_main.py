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
one line naming it and the fix, without a traceback, with an exit code of
`axlearn.common.exit_codes` that says the error is the same on every attempt (64: usage, 65:
input or checkpoint data, 73: the trainer dir is held by another run, 78: config), so that
`axlearn local launch --max_restarts` does not retry it.
"""

import errno
import os
import re
import sys
from typing import Any, Optional

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
from axlearn.common.exit_codes import (
    BUSY_EXIT_CODE,
    CONFIG_ERROR_EXIT_CODE,
    DATA_ERROR_EXIT_CODE,
    USAGE_ERROR_EXIT_CODE,
)
from axlearn.common.input_iterator import InputStateError
from axlearn.common.mesh_resolution import MeshSelectorError
from axlearn.common.preemption import INTERRUPTED_EXIT_CODE, TrainingPreempted
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


def _fail(code: int, message: str) -> None:
    """Prints the one line of a deterministic error and exits with its code (exit_codes.py).

    `axlearn local launch` does not retry these codes: the error is the same on every attempt.

    Args:
        code: One of `exit_codes.DETERMINISTIC_EXIT_CODES`.
        message: The line.
    """
    print(message, file=sys.stderr, flush=True)
    sys.exit(code)


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses the flags; a mistake exits with one line that names it and the fix."""
    try:
        return flags.FLAGS(argv)
    except flags.UnrecognizedFlagError as e:
        name = e.flagname
        _fail(
            USAGE_ERROR_EXIT_CODE,
            f"{_PROG}: error: unknown flag --{name}. Fields of the trainer config are set with "
            f"--config_override=PATH=VALUE (e.g. --config_override={name}=...); --help lists "
            "the flags."
        )
    except flags.Error as e:
        _fail(USAGE_ERROR_EXIT_CODE, f"{_PROG}: error: {e}. --help lists the flags.")


def main(argv: list[str]) -> None:
    """Runs `_main`; a Ctrl-C outside training (start-up, compile) exits 130 with one line.

    Inside training the trainer handles Ctrl-C itself (saves the step in flight, exits 130; see
    axlearn/common/preemption.py).

    Args:
        argv: The positional arguments absl leaves.
    """
    try:
        _main(argv)
    except KeyboardInterrupt:
        sys.stderr.write(
            f"{_PROG}: interrupted (Ctrl-C) before training started or after it ended: nothing "
            "was being trained, so nothing is lost; rerun the same command to start or resume.\n"
        )
        sys.exit(INTERRUPTED_EXIT_CODE)


def _main(_):
    """Sets up JAX, builds the trainer config from flags, and runs it."""
    if not flags.FLAGS.module or not flags.FLAGS.config:
        _fail(
            USAGE_ERROR_EXIT_CODE,
            f"{_PROG}: error: --module and --config are required (e.g. --module=text.gpt.tiny "
            "--config=gpt-tiny); `axlearn config list` lists the experiments and their configs."
        )
    try:
        # Before any device is set up: a mistyped experiment fails at once.
        config_fn = experiment_registry.get_named_trainer_config(
            flags.FLAGS.config, config_module=flags.FLAGS.module
        )
    except (ValueError, *_USER_ERRORS) as e:
        _fail(USAGE_ERROR_EXIT_CODE, f"{_PROG}: error: {e}")
    fv = flags.FLAGS
    if fv.trainer_dir and os.path.exists(fv.trainer_dir) and not os.path.isdir(fv.trainer_dir):
        # Before anything writes under it (the event recorder, the run lock).
        _fail(
            USAGE_ERROR_EXIT_CODE,
            f"{_PROG}: error: --trainer_dir={fv.trainer_dir} is a file, not a directory: pass a "
            "directory (a new one is created)."
        )
    problem = trainer_dir_problem(fv.trainer_dir)
    if problem:
        _fail(USAGE_ERROR_EXIT_CODE, f"{_PROG}: error: {problem}")
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
            _fail(USAGE_ERROR_EXIT_CODE, f"{_PROG}: error: {e}")
    # Held in memory until the run holds its trainer dir's lock and its trainer is built
    # (`launch_trainer.run_trainer` flushes them): a refused or rejected run writes nothing
    # into the events of the run it was refused from.
    measurement.defer_events()
    measurement.record_event(measurement.Event.START_JOB)
    try:
        with measurement.record_span(measurement.EventType.ACCELERATOR_INIT):
            launch.setup()
    except launch.LaunchFlagError as e:
        _fail(USAGE_ERROR_EXIT_CODE, f"{_PROG}: error: {e}")
    try:
        trainer_config = launch_trainer.get_trainer_config(config_fn)
    except ConfigOverrideError as e:
        _fail(CONFIG_ERROR_EXIT_CODE, f"{_PROG}: error: --config_override: {e}")
    except (ValueError, MeshSelectorError, *_USER_ERRORS) as e:
        # A missing --trainer_dir, a --mesh_selector matching no rule (the message names the
        # flag, the rules and the fix), an unknown experiment.
        _fail(CONFIG_ERROR_EXIT_CODE, f"{_PROG}: error: {e}")
    try:
        launch_trainer.run_trainer(trainer_config)
        measurement.record_event(measurement.Event.END_JOB)
    except TrainingPreempted:
        # Saved and stopping on SIGTERM (exit 75): its own attempt outcome, not a failure.
        measurement.record_event(measurement.Event.END_JOB, outcome="preempted")
        raise
    except (ConfigRangeError, launch_trainer.InvalidTrainerConfigError) as e:
        _fail(CONFIG_ERROR_EXIT_CODE, f"{_PROG}: error: {e}")
    except RunLockError as e:
        _fail(BUSY_EXIT_CODE, f"{_PROG}: error: {e}")
    except (CheckpointCorruptionError, RestoreStepError, StateMismatchError, InputStateError) as e:
        # A damaged checkpoint (the message names the file and --restore_fallback), a model or
        # an input that does not match the checkpoint (naming the parameters or the inputs).
        _fail(DATA_ERROR_EXIT_CODE, f"{_PROG}: error: {e}")
    except Exception as e:  # pylint: disable=broad-except
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            _exit_disk_full(e, trainer_config)
        if "RESOURCE_EXHAUSTED" in str(e):
            _fail(CONFIG_ERROR_EXIT_CODE, f"{_PROG}: error: {out_of_memory_message(str(e))}")
        raise


def trainer_dir_problem(trainer_dir: Optional[str]) -> Optional[str]:
    """Why a local `--trainer_dir` cannot hold a run (checked before anything is written).

    Creates the directory (with its parents) if it is missing, then creates and removes a probe
    file in it, so that a directory under a file, under /sys or /proc, or one without write
    permission is found here rather than as a traceback from the first writer.

    Args:
        trainer_dir: The flag's value; None, empty or remote (`gs://...`): not checked.

    Returns:
        None if the directory is usable, else the one-line message naming it and the fix.
    """
    if not trainer_dir or "://" in trainer_dir:
        return None
    fix = "pass a directory you can write (a missing one is created)"
    if os.path.exists(trainer_dir) and not os.path.isdir(trainer_dir):
        return f"--trainer_dir={trainer_dir} is a file, not a directory: {fix}."
    try:
        os.makedirs(trainer_dir, exist_ok=True)
        probe = os.path.join(trainer_dir, f".axlearn_write_probe.{os.getpid()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except NotADirectoryError:
        return (
            f"--trainer_dir={trainer_dir} is under a file, not a directory (a part of the path "
            f"is a regular file): {fix}."
        )
    except OSError as e:
        return f"--trainer_dir={trainer_dir} cannot be written ({e.strerror or e}): {fix}."
    return None


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
