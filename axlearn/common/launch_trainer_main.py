"""Trains a named experiment.

    python -m axlearn.common.launch_trainer_main --module=text.gpt.tiny --config=<name> \\
        --trainer_dir=/tmp/run --jax_backend=cpu [--data_dir=FAKE] [--mesh_selector=cpu]

Multi-process CPU/GPU runs add --distributed_coordinator=HOST:PORT --num_processes=N
--process_id=I on every process; TPU pods discover their peers.
"""

from absl import app

# `launch` defines the process flags and must come before anything that touches devices.
from axlearn.common import launch  # isort: skip
from axlearn.common import launch_trainer


def main(_):
    """Sets up JAX, builds the trainer config from flags, and runs it."""
    launch.setup()
    trainer_config = launch_trainer.get_trainer_config()
    launch_trainer.run_trainer(trainer_config)


if __name__ == "__main__":
    app.run(main)
