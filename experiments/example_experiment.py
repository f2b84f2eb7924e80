"""An experiment module of your own: copy this file into your project and edit it.

An experiment module is any importable module with `named_trainer_configs()`, a dict from config
name to a function returning an `SpmdTrainer.Config`. Build on a named experiment of
`axlearn.experiments` and change fields, as here, or build the trainer config from layers. Run it
by its module path (from the directory that holds it):

    axlearn config dump --module=experiments.example_experiment --config=gpt-tiny-deeper
    python -m axlearn.common.launch_trainer_main --module=experiments.example_experiment \\
        --config=gpt-tiny-deeper --trainer_dir=/tmp/gpt-tiny-deeper --jax_backend=cpu

This folder is not installed with axlearn; `experiments/test_example_experiment.py` checks that
the example keeps working.
"""

from axlearn.common.trainer import SpmdTrainer
from axlearn.experiments.text.gpt.tiny import tiny_trainer_config


def deeper_tiny_config() -> SpmdTrainer.Config:
    """gpt-tiny with 4 layers instead of 2 and a lower peak learning rate, for 600 steps.

    Returns:
        The trainer config.
    """
    cfg = tiny_trainer_config(num_layers=4, peak_lr=2e-3, max_step=600)
    cfg.name = "gpt_tiny_deeper"
    return cfg


def named_trainer_configs() -> dict:
    """The named trainer configs of this module."""
    return {"gpt-tiny-deeper": deeper_tiny_config}
