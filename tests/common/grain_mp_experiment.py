"""An experiment module for the Grain elastic-resume launcher test: gpt-tiny-grain, shrunk.

Used as `--module=tests.common.grain_mp_experiment --config=grain-elastic-4` (then `-8`) with
`--data_dir=FAKE` (the Grain source becomes `input_fake.fake_grain_lm_source`).
"""

from __future__ import annotations

from axlearn.experiments.text.gpt.tiny import tiny_grain_trainer_config


def _config(max_step: int):
    """1 layer of dim 128, batch 8 x 32, a checkpoint every 4 steps, elastic Grain input."""
    cfg = tiny_grain_trainer_config(
        max_step=max_step,
        global_batch_size=8,
        seq_len=32,
        num_layers=1,
        model_dim=128,
        checkpoint_every_n_steps=4,
    )
    cfg.evalers = {}
    cfg.input.elastic_resume = True
    cfg.peak_flops_per_device = 1e11
    return cfg


def named_trainer_configs() -> dict:
    """The named configs: the same run stopping at step 4 or 8."""
    return {"grain-elastic-4": lambda: _config(4), "grain-elastic-8": lambda: _config(8)}
