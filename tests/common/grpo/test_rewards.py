"""Tests axlearn/common/grpo/rewards.py: the checker's values, import paths, bad rewards."""

import math

import numpy as np
import pytest

from axlearn.common.config import InvalidConfigValueError
from axlearn.common.grpo.rewards import (
    CopyDigitsReward,
    RewardError,
    RewardFunction,
    score_samples,
)


def length_reward(*, prompt, completion, example):
    """A reward found by import path in the tests: the completion's length."""
    del prompt, example
    return len(completion)


def raising_reward(*, prompt, completion, example):
    """A reward that fails on completions starting with 5."""
    del prompt, example
    if len(completion) and completion[0] == 5:
        raise KeyError("no score for\nfive")
    return 1.0


def nan_reward(*, prompt, completion, example):
    """A reward that returns NaN for long completions."""
    del prompt, example
    return math.nan if len(completion) > 2 else 0.5


def _score(reward, completions, targets=None):
    n = len(completions)
    targets = targets if targets is not None else [np.array([3, 4, 5])] * n
    return score_samples(
        reward,
        prompts=[np.array([1, 3, 4, 5, 2])] * n,
        completions=[np.asarray(c) for c in completions],
        examples=[dict(target=t) for t in targets],
        config_path="grpo_trainer.reward",
    )


def test_copy_digits_reward_per_digit_and_exact():
    completions = [[3, 4, 5], [3, 9, 5], [], [3, 4], [3, 4, 5, 6], [9, 9, 9]]
    per_digit = CopyDigitsReward.default_config().set(mode="per_digit").instantiate()
    exact = CopyDigitsReward.default_config().set(mode="exact").instantiate()
    np.testing.assert_allclose(_score(per_digit, completions), [1, 2 / 3, 0, 2 / 3, 1, 0])
    np.testing.assert_array_equal(_score(exact, completions), [1, 0, 0, 0, 0, 0])


def test_copy_digits_reward_refuses_an_unknown_mode():
    with pytest.raises(InvalidConfigValueError, match="mode expects Literal"):
        CopyDigitsReward.default_config().set(mode="close").instantiate()


@pytest.mark.parametrize("path", [f"{__name__}:length_reward", f"{__name__}.length_reward"])
def test_reward_function_by_import_path(path):
    reward = RewardFunction.default_config().set(fn=path).instantiate()
    np.testing.assert_array_equal(_score(reward, [[3], [3, 4, 5], []]), [1, 3, 0])


@pytest.mark.parametrize(
    "path,message",
    [
        ("no_such_module_xyz:fn", "module 'no_such_module_xyz' does not import"),
        (f"{__name__}:missing", "has no function 'missing'"),
        ("justaname", "not an import path"),
        ("", "give the reward function's import path as a string"),
    ],
)
def test_reward_function_bad_paths_name_the_field(path, message):
    with pytest.raises(ValueError, match="reward.fn=") as e:
        RewardFunction.default_config().set(fn=path).instantiate()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_raising_reward_is_one_line_naming_the_config_path_and_sample():
    reward = RewardFunction.default_config().set(fn=f"{__name__}:raising_reward").instantiate()
    with pytest.raises(RewardError) as e:
        _score(reward, [[3, 4], [5, 4, 3], [5]])
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("grpo_trainer.reward: the reward raised KeyError")
    assert "sample 1 (prompt [1, 3, 4, 5, 2], completion [5, 4, 3])" in msg
    assert "fix the reward function" in msg


@pytest.mark.parametrize(
    "fn,shown",
    [
        (nan_reward, "nan"),
        (lambda **kw: math.inf, "inf"),
        (lambda **kw: "1.0x", "'1.0x'"),
        (lambda **kw: None, "None"),
        (lambda **kw: [1.0], "[1.0]"),
    ],
)
def test_a_non_finite_reward_is_one_line_naming_the_sample(fn, shown):
    with pytest.raises(RewardError) as e:
        _score(fn, [[3], [3, 4, 5, 6]] if fn is nan_reward else [[3, 4, 5]])
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"grpo_trainer.reward: the reward returned {shown} on sample")
    assert msg.endswith("it must return a finite float.")
    if fn is nan_reward:
        assert "sample 1 (prompt [1, 3, 4, 5, 2], completion [3, 4, 5, 6])" in msg


def test_numpy_and_bool_rewards_are_numbers():
    np.testing.assert_array_equal(_score(lambda **kw: np.float64(0.25), [[3]]), [0.25])
    np.testing.assert_array_equal(_score(lambda **kw: True, [[3]]), [1.0])
