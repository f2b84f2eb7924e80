"""Tests axlearn/common/skip_streak.py and the trainer stopping on a streak of skipped steps."""

import math
import os

import jax
import pytest

from axlearn.common.skip_streak import SkipStreak, TooManySkippedStepsError


def _feed(streak: SkipStreak, steps):
    for step, (loss, scalars) in enumerate(steps, start=1):
        streak.note(step, loss=loss, scalars=scalars)


def test_streak_counts_skips_and_nans_and_resets():
    streak = SkipStreak(limit=3, config_path="trainer")
    ok = (1.0, {"learner/optimizer/nonvalid_count": 0})
    _feed(streak, [ok, (math.nan, {}), (2.0, {"learner/optimizer/nonvalid_count": 2}), ok])
    # Two skipped (a NaN, a counter increase), then a good step: the streak restarts.
    streak.note(5, loss=math.inf, scalars={})
    streak.note(5, loss=math.inf, scalars={})  # The same step twice counts once.
    streak.note(6, loss=1.0, scalars={"learner/optimizer/nonvalid_count": 3})
    with pytest.raises(TooManySkippedStepsError, match=r"Steps 5-7: 3 consecutive") as e:
        streak.note(7, loss=math.nan, scalars={"learner/optimizer/nonvalid_count": 4})
    assert "trainer.max_consecutive_skipped_steps=3" in str(e.value)
    assert "vocab_size" in str(e.value) and "learning rate" in str(e.value)
    assert streak.skip_counter == 4


def test_fp16_scale_search_does_not_count():
    """fp16 loss scaling from 2^32 skips ~17 steps while halving its scale: expected."""
    streak = SkipStreak(limit=None, config_path="trainer")  # Default: 10.
    scale = 2.0**32
    for step in range(1, 21):
        scale /= 2
        streak.note(
            step,
            loss=1.0,
            scalars={"loss_scale/scale": scale, "loss_scale/num_skipped_steps": step},
        )
    # Once the scale stops going down, skips count.
    with pytest.raises(TooManySkippedStepsError, match=r"Steps 21-30"):
        for step in range(21, 31):
            streak.note(
                step,
                loss=1.0,
                scalars={"loss_scale/scale": scale, "loss_scale/num_skipped_steps": step},
            )


def test_limit_is_validated():
    with pytest.raises(ValueError, match=r"trainer.max_consecutive_skipped_steps must be"):
        SkipStreak(limit=0, config_path="trainer")


def test_all_nan_run_stops_without_checkpointing_the_streak(tmp_path):
    """Every step from the second on has a NaN loss (as with token ids beyond the model's
    vocabulary) and is skipped: the run stops at the limit; nothing after the streak is saved."""
    from axlearn.common import checkpointer  # pylint: disable=import-outside-toplevel
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=12, skip_nonfinite=True)
    cfg.input = tu.PoisonedFakeLmInput.default_config().set(
        **{k: v for k, v in cfg.input.items() if k != "klass"}, poison_batches=list(range(1, 12))
    )
    cfg.checkpointer.save_policy.n = 1
    cfg.max_consecutive_skipped_steps = 4
    with pytest.raises(TooManySkippedStepsError, match=r"Steps 2-5: 4 consecutive steps"):
        cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    # Step 1 was saved; no step of the streak 2-5 was (issue 29 case 11).
    steps = [s for s, _ in checkpointer.step_dirs(os.path.join(tmp_path, "checkpoints"))]
    assert max(steps) == 1


def test_drop_norm_streak_names_drop_norm_not_non_finite_values(tmp_path):
    """Issue 29 case 11: every step dropped by drop_norm=1e-9 with finite loss and gradient norm:
    the error says so and names drop_norm; no step of the streak is committed."""
    from axlearn.common import checkpointer  # pylint: disable=import-outside-toplevel
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=12, skip_nonfinite=True)
    cfg.learner.optimizer.drop_norm = 1e-9
    cfg.checkpointer.save_policy.n = 1
    cfg.max_consecutive_skipped_steps = 3
    with pytest.raises(TooManySkippedStepsError) as e:
        cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    message = str(e.value)
    assert message.startswith("Steps 1-3: 3 consecutive steps were skipped (loss ")
    assert "gradient norm" in message and "were finite" in message
    assert "a drop_norm below the run's gradient norms" in message
    assert "non-finite" not in message
    assert checkpointer.step_dirs(os.path.join(tmp_path, "checkpoints")) == []
