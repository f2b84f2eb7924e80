"""Range checks of well-known config fields, run when a trainer is instantiated.

Type checks happen at `set()` (axlearn/common/config/typecheck.py); values that have the right
type but make no sense (a negative `max_step`, a negative learning rate, a zero batch size) are
caught here, before anything is written, with the full config path in the message.
"""

from __future__ import annotations

import math
from typing import Any

from absl import logging

from axlearn.common.config import ConfigBase

# Field name -> (lower bound, whether the bound itself is allowed, what it is).
_RANGES: dict[str, tuple[float, bool, str]] = {
    "max_step": (0, True, "a step count"),
    "warmup_steps": (0, True, "a step count"),
    "total_steps": (0, True, "a step count"),
    "max_consecutive_skipped_steps": (1, True, "a step count"),
    "learning_rate": (0, True, "a learning rate"),
    "peak_lr": (0, True, "a learning rate"),
    "weight_decay": (0, True, "a rate"),
    "max_norm": (0, False, "a norm"),
    "eps": (0, True, "an epsilon"),
    "global_batch_size": (1, True, "a size"),
    "vocab_size": (1, True, "a size"),
    "num_layers": (1, True, "a size"),
    "dim": (1, True, "a size"),
    "num_heads": (1, True, "a size"),
    "hidden_dim": (1, True, "a size"),
    "input_dim": (1, True, "a size"),
    "output_dim": (1, True, "a size"),
    "source_length": (1, True, "a size"),
    "keep_last_n": (1, True, "a count"),
}


# Fields whose value 0 is allowed but trains nothing: a warning names them.
_ZERO_TRAINS_NOTHING = ("learning_rate", "peak_lr")


# Step counts: a float is allowed only for infinity or a whole number (20.5 steps is no count).
_WHOLE_NUMBERS = ("max_step", "warmup_steps", "total_steps", "keep_last_n")


class ConfigRangeError(ValueError):
    """A well-known numeric config field is outside its range (or NaN)."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def validate_config_ranges(cfg: ConfigBase, *, root: str = "") -> None:
    """Raises `ConfigRangeError` for a well-known numeric field outside its range (or NaN).

    A learning rate of exactly 0 is allowed, with a warning (it trains nothing).

    Args:
        cfg: The config tree (e.g. a trainer config).
        root: The path of `cfg`, prefixed to field paths in messages.

    Raises:
        ConfigRangeError: (a ValueError) Naming each field's full path, its value and the
            allowed range, in one line.
    """
    problems = []

    def visit(path: str, value: Any) -> None:
        name = path.rsplit(".", 1)[-1]
        if name not in _RANGES or not _number(value):
            return
        low, inclusive, what = _RANGES[name]
        full = f"{root}.{path}" if root else path
        if math.isnan(value):
            problems.append(f"{full}={value!r} is NaN")
        elif name in _WHOLE_NUMBERS and math.isfinite(value) and value != int(value):
            problems.append(f"{full}={value!r}: {what} must be a whole number")
        elif value < low or (value == low and not inclusive):
            bound = f">= {low}" if inclusive else f"> {low}"
            problems.append(f"{full}={value!r}: {what} must be {bound}")
        elif value == 0 and name in _ZERO_TRAINS_NOTHING:
            logging.warning(
                "%s=%r: with a learning rate of 0 training changes no parameter; set it > 0 "
                "(e.g. --config_override=%s=1e-3) unless that is what you want.",
                full,
                value,
                path,
            )

    cfg.visit(visit)
    if problems:
        raise ConfigRangeError(
            "Config values out of range: "
            + "; ".join(problems)
            + ". Set them with --config_override=PATH=VALUE (or in the experiment)."
        )
