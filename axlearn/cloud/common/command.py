"""Completing a user's command for a launch target.

When the command runs `axlearn.common.launch_trainer_main`, the launch adds the flags the target
decides, unless the command already sets them:

- `--mesh_selector=<selector>`: the experiment's `mesh_rules` (regexes) pick the mesh; the
  selector follows AXLearn's convention (`system_characteristics.mesh_selector_for`: the
  instance type, `-<slices>` for several TPU slices, `-<GPUs>` for GPU nodes);
- `--jax_backend=tpu|gpu`;
- `--trainer_dir=<dir>`: the job's directory on the configured bucket.

Other commands run as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

TRAINER_MODULE = "axlearn.common.launch_trainer_main"


def runs_trainer(command: Sequence[str]) -> bool:
    """Returns whether `command` runs `launch_trainer_main` (as a module or a script path)."""
    return any(
        arg == TRAINER_MODULE or arg.endswith("axlearn/common/launch_trainer_main.py")
        for arg in command
    )


def _has_flag(command: Sequence[str], flag: str) -> bool:
    return any(arg == f"--{flag}" or arg.startswith(f"--{flag}=") for arg in command)


def complete_trainer_command(
    command: Sequence[str],
    *,
    mesh_selector: Optional[str] = None,
    jax_backend: Optional[str] = None,
    trainer_dir: Optional[str] = None,
) -> list[str]:
    """Returns `command` with the target's trainer flags added where it lacks them.

    Args:
        command: The user's command (argv).
        mesh_selector: The `--mesh_selector` value.
        jax_backend: The `--jax_backend` value.
        trainer_dir: The `--trainer_dir` value.

    Returns:
        The completed command (unchanged unless it runs launch_trainer_main).
    """
    command = list(command)
    if not runs_trainer(command):
        return command
    for flag, value in (
        ("mesh_selector", mesh_selector),
        ("jax_backend", jax_backend),
        ("trainer_dir", trainer_dir),
    ):
        if value is not None and not _has_flag(command, flag):
            command.append(f"--{flag}={value}")
    return command
