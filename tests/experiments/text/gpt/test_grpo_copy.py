"""The GRPO toy run (axlearn/experiments/text/gpt/grpo_copy.py): the mean reward doubles.

A 2-layer, dim-64 decoder from random weights, 8 prompts x 8 samples per step, the per-digit
copy reward. Its mean reward starts near 0.05 (1 / vocab per digit, less for completions that
stop early); within 120 CPU steps it at least doubles (measured: about 0.3 at the end).
"""

import numpy as np
import pytest

from axlearn.experiments.text.gpt.grpo_copy import grpo_copy_trainer_config

STEPS = 120


@pytest.mark.slow
def test_mean_reward_at_least_doubles(tmp_path):
    cfg = grpo_copy_trainer_config(max_step=STEPS, checkpoint_every_n_steps=STEPS)
    trainer = cfg.set(dir=str(tmp_path)).instantiate(parent=None)
    records = trainer.run()
    rewards = np.asarray([r["reward_mean"] for r in records])
    assert len(rewards) == STEPS and ((rewards >= 0) & (rewards <= 1)).all()
    start, end = rewards[:10].mean(), rewards[-20:].mean()
    # The start is not degenerate: a near-uniform policy scores about 1/13 per digit.
    assert 0.01 < start < 0.15, start
    assert end >= 2 * start, (start, end, rewards.round(3).tolist())
