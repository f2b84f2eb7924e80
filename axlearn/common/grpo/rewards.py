"""GRPO rewards: a Python function by import path, or a verifiable checker, as a config.

A reward scores one sample: `reward(prompt=..., completion=..., example=...) -> float`, where
`prompt` is the prompt's token ids (int32, without padding), `completion` the sampled ids after
it (cut before the first EOS), and `example` the prompt's other input fields (e.g. a target).

- `RewardFunction` imports `fn` ("package.module:function" or "package.module.function").
- `CopyDigitsReward` checks a copy: the completion must equal `example["target"]` ("exact") or
  scores the fraction of target positions it matches ("per_digit").

`score_samples` calls a reward on every sample of a rollout; a reward that raises or returns
anything but a finite number stops the run with one line naming the config path and the sample.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from typing import Any, Callable, Literal

import numpy as np

from axlearn.common.config import REQUIRED, Configurable, Required, config_class


class RewardError(ValueError):
    """A reward raised, or returned something other than a finite number, for a sample."""


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ids_text(ids: np.ndarray, limit: int = 16) -> str:
    ids = [int(i) for i in ids]
    shown = ", ".join(str(i) for i in ids[:limit])
    return f"[{shown}{', ...' if len(ids) > limit else ''}]"


class RewardFunction(Configurable):
    """A reward implemented by a Python function, found by its import path."""

    @config_class
    class Config(Configurable.Config):
        """Configures RewardFunction."""

        # "package.module:function" (or "package.module.function"), called as
        # fn(prompt=..., completion=..., example=...) -> float for each sample.
        fn: Required[str] = REQUIRED

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self._fn = resolve_function(cfg.fn, config_path="reward.fn")

    def __call__(self, *, prompt: np.ndarray, completion: np.ndarray, example: dict) -> float:
        """The reward of one sample (see the module docstring)."""
        return self._fn(prompt=prompt, completion=completion, example=example)


def resolve_function(path: Any, *, config_path: str) -> Callable:
    """Imports the function named by `path`.

    Args:
        path: "package.module:function" or "package.module.function".
        config_path: The config field, for the error.

    Returns:
        The callable.

    Raises:
        ValueError: If the path is malformed, the module does not import, or the name is missing
            or not callable.
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(
            f"{config_path}={path!r}: give the reward function's import path as a string, e.g. "
            "'my_package.rewards:exact_match'."
        )
    module_name, sep, name = path.partition(":")
    if not sep:
        module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise ValueError(
            f"{config_path}={path!r}: not an import path; use 'package.module:function'."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"{config_path}={path!r}: module {module_name!r} does not import "
            f"({_one_line(e)}); fix the path or install the module."
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(
            f"{config_path}={path!r}: module {module_name!r} has no function {name!r}; fix the "
            "name."
        )
    return fn


class CopyDigitsReward(Configurable):
    """A verifiable checker: does the completion copy `example["target"]`?"""

    @config_class
    class Config(Configurable.Config):
        """Configures CopyDigitsReward."""

        # "exact": 1 if the completion equals the target, else 0; "per_digit": the fraction of
        # target positions the completion matches (extra tokens are not rewarded).
        mode: Literal["exact", "per_digit"] = "per_digit"

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        if cfg.mode not in ("exact", "per_digit"):
            raise ValueError(f"reward.mode={cfg.mode!r}: must be 'exact' or 'per_digit'; pick one.")

    def __call__(self, *, prompt: np.ndarray, completion: np.ndarray, example: dict) -> float:
        """The reward of one sample (see the class docstring)."""
        del prompt
        target = np.asarray(example["target"])
        completion = np.asarray(completion)
        if self.config.mode == "exact":
            return float(completion.shape == target.shape and np.array_equal(completion, target))
        n = min(len(completion), len(target))
        return float(np.sum(completion[:n] == target[:n])) / max(len(target), 1)


def score_samples(
    reward: Callable[..., Any],
    *,
    prompts: Sequence[np.ndarray],
    completions: Sequence[np.ndarray],
    examples: Sequence[dict],
    config_path: str,
) -> np.ndarray:
    """Calls `reward` on every sample; checks that each result is a finite number.

    Args:
        reward: The reward (see the module docstring).
        prompts: Per sample, the prompt ids.
        completions: Per sample, the completion ids.
        examples: Per sample, the prompt's other input fields.
        config_path: The reward's config path, for errors.

    Returns:
        Float32 [num_samples].

    Raises:
        RewardError: If the reward raises or returns a non-number or a non-finite number (one
            line: the config path, the sample index, its prompt and completion ids, the fix).
    """
    out = np.zeros([len(completions)], np.float32)
    for i, (prompt, completion, example) in enumerate(zip(prompts, completions, examples)):
        where = f"sample {i} (prompt {_ids_text(prompt)}, completion {_ids_text(completion)})"
        try:
            value = reward(prompt=prompt, completion=completion, example=example)
        except Exception as e:  # pylint: disable=broad-except
            raise RewardError(
                f"{config_path}: the reward raised {type(e).__name__}: {_one_line(e)} on "
                f"{where}; fix the reward function."
            ) from None
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number):
            shown = _one_line(repr(value), 40)
            raise RewardError(
                f"{config_path}: the reward returned {shown} on {where}; it must return a finite "
                "float."
            )
        out[i] = number
    return out
