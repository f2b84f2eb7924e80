"""Trains a named experiment.

    python -m axlearn.common.launch_trainer_main --module=text.gpt.tiny --config=<name> \\
        --trainer_dir=/tmp/run --jax_backend=cpu [--data_dir=FAKE] [--mesh_selector=cpu]

Multi-process CPU/GPU runs add --distributed_coordinator=HOST:PORT --num_processes=N
--process_id=I on every process; TPU pods discover their peers.

--config_override=PATH=VALUE (repeatable) changes a field of the config, e.g.
--config_override=max_step=20; the trainer dir's `trainer_config` dump records the result.
--verbose_start logs the config dump and parameter table (by default they go to files in the
trainer dir: `trainer_config`, `model_parameters.txt`).
"""

import sys

from absl import app

# `launch` defines the process flags and must come before anything that touches devices.
from axlearn.common import launch  # isort: skip
from axlearn.common import launch_trainer
from axlearn.common.config.override import ConfigOverrideError
from axlearn.common.mesh_resolution import MeshSelectorError


def main(_):
    """Sets up JAX, builds the trainer config from flags, and runs it."""
    launch.setup()
    try:
        trainer_config = launch_trainer.get_trainer_config()
    except ConfigOverrideError as e:
        sys.exit(f"launch_trainer_main: error: --config_override: {e}")
    except MeshSelectorError as e:  # The message names the flag, the rules and the fix.
        sys.exit(f"launch_trainer_main: error: {e}")
    launch_trainer.run_trainer(trainer_config)


if __name__ == "__main__":
    app.run(main)
