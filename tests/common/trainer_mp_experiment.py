"""An experiment module for the trainer's launcher tests: the tiny GPT config, shrunk.

Used as `--module=tests.common.trainer_mp_experiment --config=gpt-tiny-test`.
"""

from __future__ import annotations

from axlearn.experiments.text.gpt.tiny import tiny_trainer_config


def small_config():
    """The tiny GPT config with 1 layer of dim 128, 5 steps, no evaler, no checkpoints."""
    cfg = tiny_trainer_config(
        max_step=5,
        global_batch_size=8,
        seq_len=32,
        num_layers=1,
        model_dim=128,
        checkpoint_every_n_steps=10**6,
    )
    cfg.evalers = {}
    cfg.checkpointer.save_policy.max_step = 10**6
    cfg.peak_flops_per_device = 1e11
    return cfg


def named_trainer_configs() -> dict:
    """The named configs."""
    return {"gpt-tiny-test": small_config, "gpt-tiny-eval": eval_config}


def eval_config():
    """1 layer of dim 64, 6 steps on the embedded corpus, a checkpoint and an eval at step 6.

    The small model for `axlearn eval` / `generate` / `hf` tests: a real vocabulary and real
    validation data, trained just enough to leave a trainer dir with a committed checkpoint.
    """
    cfg = tiny_trainer_config(
        max_step=6,
        global_batch_size=4,
        seq_len=32,
        num_layers=1,
        model_dim=64,
        eval_every_n_steps=6,
        checkpoint_every_n_steps=6,
    )
    cfg.peak_flops_per_device = 1e11
    return cfg
