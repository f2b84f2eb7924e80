"""The GRPO toy run: a tiny decoder learns to copy a short digit string from a reward alone.

    from axlearn.experiments.text.gpt.grpo_copy import grpo_copy_trainer_config
    trainer = grpo_copy_trainer_config().set(dir="/tmp/grpo").instantiate(parent=None)
    records = trainer.run()

The task is `axlearn.common.grpo.copy_task` (prompt `[EOS, digits, SEP]`, the completion should
repeat the digits) with the per-digit checker `CopyDigitsReward`. From random weights the
mean reward starts near 1 / vocab per digit; it doubles within 120 CPU steps (measured in
tests/experiments/text/gpt/test_grpo_copy.py: about 0.07 -> 0.3).
"""

from __future__ import annotations

from typing import Any

from axlearn.common import learner, optimizers
from axlearn.common.checkpointer import every_n_steps_policy
from axlearn.common.config import config_for_function
from axlearn.common.grpo import CopyDigitsReward, GrpoTrainer
from axlearn.common.grpo.copy_task import EOS_ID, FIRST_DIGIT_ID, PAD_ID, CopyDigitsPrompts
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config


def copy_digits_policy_config(*, num_layers: int, model_dim: int, num_symbols: int) -> Any:
    """The policy of the GRPO copy task (both GRPO trainers' configs use it).

    Args:
        num_layers: Transformer layers.
        model_dim: Model dim (heads of dim 16).
        num_symbols: Distinct digits.

    Returns:
        A causal LM config over the copy task's vocabulary.
    """
    return transformer_lm_config(
        num_layers=num_layers,
        model_dim=model_dim,
        num_heads=model_dim // 16,
        hidden_dim=4 * model_dim,
        vocab_size=FIRST_DIGIT_ID + num_symbols,
        stack="stack",
        # An untied head starts near uniform (a tied one repeats the last prompt token).
        tied_embedding=False,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
    )


def grpo_copy_trainer_config(
    *,
    max_step: int = 200,
    num_prompts: int = 8,
    group_size: int = 8,
    num_digits: int = 3,
    num_symbols: int = 10,
    model_dim: int = 64,
    num_layers: int = 2,
    learning_rate: float = 3e-3,
    kl_coef: float = 0.01,
    checkpoint_every_n_steps: int = 100,
) -> GrpoTrainer.Config:
    """The toy GRPO trainer config (its `dir` unset).

    Args:
        max_step: Training steps.
        num_prompts: Prompts per step.
        group_size: Samples per prompt.
        num_digits: Digits to copy.
        num_symbols: Distinct digits.
        model_dim: Model dim (heads of dim 16).
        num_layers: Transformer layers.
        learning_rate: Adam's learning rate (constant).
        kl_coef: The KL weight.
        checkpoint_every_n_steps: Checkpoint interval.

    Returns:
        The config.
    """
    model = copy_digits_policy_config(
        num_layers=num_layers, model_dim=model_dim, num_symbols=num_symbols
    )
    cfg = GrpoTrainer.default_config().set(
        name="grpo_trainer",
        max_step=max_step,
        input=CopyDigitsPrompts.default_config().set(
            num_prompts=num_prompts, num_digits=num_digits, num_symbols=num_symbols
        ),
        model=model,
        learner=learner.Learner.default_config().set(
            optimizer=config_for_function(optimizers.adam_optimizer).set(
                learning_rate=learning_rate, b1=0.9, b2=0.99, eps=1e-8
            )
        ),
        reward=CopyDigitsReward.default_config().set(mode="per_digit"),
        group_size=group_size,
        max_new_tokens=num_digits + 1,
        kl_coef=kl_coef,
    )
    cfg.checkpointer.save_policy = config_for_function(every_n_steps_policy).set(
        n=checkpoint_every_n_steps
    )
    return cfg
