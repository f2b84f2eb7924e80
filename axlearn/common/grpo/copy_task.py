"""A verifiable toy task for GRPO: copy a short digit string.

Token ids: 0 pad, 1 EOS (also the prompt token), 2 the separator, 3.. the digits. A prompt is
`[EOS, d_1, ..., d_k, SEP]` and the expected completion `d_1 ... d_k` (then EOS); the target
is the prompt's `target` field, which `rewards.CopyDigitsReward` checks.

`CopyDigitsPrompts.batch(index)` is a pure function of (seed, index): a run that resumes at
step s reads the same prompts as one that never stopped (the prompt source's position is the
step).
"""

from __future__ import annotations

import numpy as np

from axlearn.common.config import Configurable, config_class

PAD_ID, EOS_ID, SEP_ID, FIRST_DIGIT_ID = 0, 1, 2, 3


class CopyDigitsPrompts(Configurable):
    """Prompt batches of the copy task: {"prefix": [B, k + 2], "target": [B, k]} int32."""

    @config_class
    class Config(Configurable.Config):
        """Configures CopyDigitsPrompts."""

        # Prompts per batch.
        num_prompts: int = 8
        # Digits per prompt (k).
        num_digits: int = 3
        # How many distinct digits (ids FIRST_DIGIT_ID .. FIRST_DIGIT_ID + num_symbols - 1).
        num_symbols: int = 10
        # The seed; batch `index` is drawn from (seed, index).
        seed: int = 0

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        for name in ("num_prompts", "num_digits", "num_symbols"):
            value = getattr(cfg, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{type(self).__name__}.{name}={value!r}: must be an integer >= 1."
                )

    @property
    def vocab_size(self) -> int:
        """The smallest vocabulary that holds every id of the task."""
        return FIRST_DIGIT_ID + self.config.num_symbols

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """The prompts of batch `index` (>= 0).

        Args:
            index: The batch index (the trainer passes step - 1).

        Returns:
            {"prefix": int32 [num_prompts, num_digits + 2], "target": int32 [num_prompts,
            num_digits]}.
        """
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, index])
        digits = rng.integers(0, cfg.num_symbols, size=(cfg.num_prompts, cfg.num_digits))
        target = (digits + FIRST_DIGIT_ID).astype(np.int32)
        prefix = np.concatenate(
            [
                np.full((cfg.num_prompts, 1), EOS_ID, np.int32),
                target,
                np.full((cfg.num_prompts, 1), SEP_ID, np.int32),
            ],
            axis=1,
        )
        return dict(prefix=prefix, target=target)
