"""Tests for axlearn/common/trainer_metrics.py: the learning rate shown in the step log line."""

from __future__ import annotations

import pytest

from axlearn.common.trainer_metrics import applied_learning_rate


def test_decoupled_optimizer_shows_alpha_times_schedule_not_alpha():
    # First step of a warm-up from 0 under adamw_decoupled_optimizer: alpha is 0.01, the rate the
    # step applied is 0 (the summary values the optimizer writes; see test_learner).
    scalars = {
        "learner/optimizer/learning_rate": 0.01,
        "learner/optimizer/schedule_scale": 0.0,
        "learner/optimizer/effective_learning_rate": 0.0,
    }
    assert applied_learning_rate(scalars) == 0.0


def test_plain_schedule_shows_learning_rate():
    assert applied_learning_rate({"learner/optimizer/learning_rate": 1e-4}) == pytest.approx(1e-4)
    assert applied_learning_rate({"lr": 0.5}) == 0.5
    assert applied_learning_rate({"learner/optimizer/gradient_norm": 1.0}) is None
