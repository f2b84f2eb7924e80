"""Stops a run whose steps are all skipped: NaN losses, or a learner that skips every update.

A run whose vocabulary is larger than the model's `vocab_size`, or whose learning rate is absurd,
can have every step skipped by `skip_and_clip_by_global_norm` or loss scaling, and would still
"finish" and checkpoint a useless state. `SkipStreak` counts consecutive skipped steps and raises
`TooManySkippedStepsError` at a limit, which the trainer checks before a step's state is saved.
"""

from __future__ import annotations

import math
from typing import Any, Optional

# Default of SpmdTrainer.Config.max_consecutive_skipped_steps.
DEFAULT_MAX_CONSECUTIVE_SKIPPED_STEPS = 10


class TooManySkippedStepsError(RuntimeError):
    """Too many consecutive steps were skipped (non-finite loss or gradients)."""


def _find_skip_counter(scalars: dict[str, Any]) -> Optional[int]:
    """The learner's cumulative skipped-step counter among a step's scalar summaries."""
    for path, value in scalars.items():
        if path.rsplit("/", 1)[-1] in ("nonvalid_count", "num_skipped_steps"):
            return int(value)
    return None


def _find_grad_norm(scalars: dict[str, Any]) -> Optional[float]:
    """The learner's global gradient norm among a step's scalar summaries."""
    for path, value in scalars.items():
        if path.rsplit("/", 1)[-1] == "gradient_norm":
            return float(value)
    return None


def _find_loss_scale(scalars: dict[str, Any]) -> Optional[float]:
    """The fp16 loss scale among a step's scalar summaries."""
    for path, value in scalars.items():
        if path.endswith("loss_scale/scale") or path.rsplit("/", 1)[-1] == "loss_scale":
            return float(value)
    return None


class SkipStreak:
    """Counts consecutive skipped steps; raises at `limit`.

    A step is skipped when its loss is not finite or the learner's skip counter
    (`nonvalid_count`, `num_skipped_steps`) grew. A skip at which the fp16 loss scale went down
    is the loss scaler finding its scale (expected at the start of fp16 runs) and does not count
    (nor does it end a streak).
    """

    def __init__(self, *, limit: Optional[int], config_path: str):
        """Args:
        limit: Consecutive skipped steps that stop the run; None: the default (10).
        config_path: The trainer's config path, for the message.

        Raises:
            ValueError: If `limit` is not a positive int.
        """
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(
                f"{config_path}.max_consecutive_skipped_steps must be a positive int or None, "
                f"got {limit!r}"
            )
        self._limit = limit or DEFAULT_MAX_CONSECUTIVE_SKIPPED_STEPS
        self._path = config_path
        self._streak = 0
        self._last_step = -1
        self._counter: Optional[int] = None
        self._scale: Optional[float] = None
        # The learner's global gradient norm at the last step noted, if it reports one.
        self._grad_norm: Optional[float] = None

    @property
    def streak(self) -> int:
        """Consecutive skipped steps up to the last step noted (0: that step was not skipped)."""
        return self._streak

    @property
    def skip_counter(self) -> int:
        """The learner's cumulative skip count last seen (0 if it keeps none)."""
        return self._counter or 0

    def note(self, step: int, *, loss: float, scalars: dict[str, Any]) -> None:
        """Records step `step` (once; later calls for it are ignored).

        Args:
            step: The step.
            loss: Its loss.
            scalars: Its scalar summaries, flattened ('a/b/c' paths).

        Raises:
            TooManySkippedStepsError: When this step makes `limit` consecutive skipped steps.
        """
        if step <= self._last_step:
            return
        self._last_step = step
        counter = _find_skip_counter(scalars)
        scale = _find_loss_scale(scalars)
        self._grad_norm = _find_grad_norm(scalars)
        skipped = not math.isfinite(loss)
        if counter is not None:
            skipped = skipped or counter > (self._counter or 0)
            self._counter = counter
        adjusting = scale is not None and (self._scale is None or scale < self._scale)
        if scale is not None:
            self._scale = scale
        if not skipped:
            self._streak = 0
            return
        if adjusting:
            return
        self._streak += 1
        if self._streak >= self._limit:
            first = step - self._streak + 1
            norm = self._grad_norm
            if math.isfinite(loss) and norm is not None and math.isfinite(norm):
                # Nothing was non-finite: the learner dropped the updates by their norm.
                why = (
                    f"loss {loss} and gradient norm {norm:.4g} were finite: the learner dropped "
                    "the updates, as skip_and_clip_by_global_norm does for a gradient norm at or "
                    "above its drop_norm"
                )
                causes = (
                    "a drop_norm below the run's gradient norms (raise it, or set it to None), "
                    "or a drop_norm threshold function that is too strict"
                )
            else:
                why = f"non-finite loss or gradients; last loss {loss}"
                causes = (
                    "token ids at or above the model's vocab_size (a vocabulary larger than the "
                    "model's), a learning rate far too high, an fp16/bf16 overflow, bad input "
                    "data, or a drop_norm below the gradient norms"
                )
            raise TooManySkippedStepsError(
                f"Steps {first}-{step}: {self._streak} consecutive steps were skipped ({why}), "
                f"the limit {self._path}.max_consecutive_skipped_steps={self._limit}. Likely "
                f"causes: {causes}. Stopping; no step of the streak is checkpointed (the last "
                "committed checkpoint, from before it, is kept)."
            )
