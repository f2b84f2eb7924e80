"""GRPO (Group Relative Policy Optimization): rollouts with the KV-cache decoder, group-relative
advantages, a clipped policy-gradient loss with a k3 KL to a frozen reference, and rewards as
configs. In `SpmdTrainer`: `model.GrpoModel` with the rollout batch processor
`rollout.GrpoRollout` (the `grpo-copy-digits` config of
`axlearn.experiments.text.gpt.post_training`); standalone: `trainer.GrpoTrainer`.
"""

from axlearn.common.grpo.loss import (
    GrpoLossOutputs,
    group_advantages,
    grpo_loss,
    k3_kl,
    token_log_probs,
)
from axlearn.common.grpo.model import GrpoModel
from axlearn.common.grpo.rewards import (
    CopyDigitsReward,
    RewardError,
    RewardFunction,
    score_samples,
)
from axlearn.common.grpo.rollout import GrpoRollout, PromptInput
from axlearn.common.grpo.trainer import GrpoTrainer

__all__ = [
    "CopyDigitsReward",
    "GrpoLossOutputs",
    "GrpoModel",
    "GrpoRollout",
    "GrpoTrainer",
    "PromptInput",
    "RewardError",
    "RewardFunction",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "score_samples",
    "token_log_probs",
]
