"""GRPO (Group Relative Policy Optimization): rollouts with the KV-cache decoder, group-relative
advantages, a clipped policy-gradient loss with a k3 KL to a frozen reference, and rewards as
configs. See `trainer.GrpoTrainer`.
"""

from axlearn.common.grpo.loss import (
    GrpoLossOutputs,
    group_advantages,
    grpo_loss,
    k3_kl,
    token_log_probs,
)
from axlearn.common.grpo.rewards import (
    CopyDigitsReward,
    RewardError,
    RewardFunction,
    score_samples,
)
from axlearn.common.grpo.trainer import GrpoTrainer

__all__ = [
    "CopyDigitsReward",
    "GrpoLossOutputs",
    "GrpoTrainer",
    "RewardError",
    "RewardFunction",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "score_samples",
    "token_log_probs",
]
