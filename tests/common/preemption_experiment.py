"""An experiment module for the launcher preemption test: the tiny GPT config, shrunk.

Used as `--module=tests.common.preemption_experiment --config=gpt-tiny-preempt`.
"""

from __future__ import annotations

from axlearn.experiments.text.gpt.tiny import tiny_trainer_config
from tests.common.resume_test_utils import SigtermFakeLmInput

MAX_STEP = 300


def preempt_config():
    """The tiny GPT config: 1 layer of dim 64, MAX_STEP steps, no evaler, no periodic saves."""
    cfg = tiny_trainer_config(
        max_step=MAX_STEP,
        global_batch_size=4,
        seq_len=32,
        num_layers=1,
        model_dim=64,
        checkpoint_every_n_steps=10**6,
    )
    cfg.evalers = {}
    # Fake data that takes 20 ms a batch: the run lasts seconds, so a signal lands mid-run.
    cfg.input = SigtermFakeLmInput.default_config().set(
        is_training=True,
        global_batch_size=4,
        source_length=32,
        max_token_id=4096,
        seconds_per_batch=0.02,
    )
    cfg.peak_flops_per_device = 1e11
    cfg.preemption_timeout_seconds = 120
    return cfg


def named_trainer_configs() -> dict:
    """The named configs."""
    return {"gpt-tiny-preempt": preempt_config}
