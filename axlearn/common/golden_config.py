"""Golden dumps of named trainer configs, in AXLearn's formats (`axlearn.common.golden_config`).

Three texts describe a trainer config for review; each is checked in as a golden file next to
the experiment (`<name>.txt`, `<name>_init.txt`, `<name>_regularizer.txt`):

- `config_text`: the config's `debug_string()`, one `path: value` line per leaf.
- `init_text`: one line per model parameter, in creation order, naming its initializer, e.g.
  `decoder/emb/token_emb/weight: normal(0, 1.0 / fan_out), shape=[32768, 2048], axes=FanAxes(...)`.
- `regularizer_text`: the weight-decay (and L2) scale of every parameter as the learner resolves
  it, one block per registration:

      ====================weight_decay_scale root.optimizer====================
      decoder/emb/token_emb/weight: 1

`check`, `check_init` and `check_regularizer` compare a config function's text with a golden
file (writing it instead when `UPDATE_GOLDEN` or `AXLEARN_UPDATE_GOLDENS` is set), and
`test_main(module, testdata_dir)` runs them for every config of an experiment module, as
AXLearn's `golden_config.test_main` does. `axlearn config dump --init/--regularizer` prints the
same texts.

Configs are built inside `utils.set_data_dir("$DATA_DIR")`, as AXLearn builds its goldens.
"""

from __future__ import annotations

import os
import re
import sys
from types import ModuleType
from typing import Any, Callable, Optional

from axlearn.common.base_layer import param_init_debug_string
from axlearn.common.config import ConfigBase, TrainerConfigFn
from axlearn.common.learner import per_param_settings_records
from axlearn.common.per_param_settings import (
    L2_REGULARIZER_SCALE,
    WEIGHT_DECAY_SCALE,
    per_param_settings_golden_text,
)
from axlearn.common.utils import set_data_dir

# Environment variables that make the checks write the golden files instead of comparing.
UPDATE_ENVS = ("UPDATE_GOLDEN", "AXLEARN_UPDATE_GOLDENS")
# The data dir configs are built with (AXLearn's golden convention).
GOLDEN_DATA_DIR = "$DATA_DIR"
# The per-parameter settings that make up the `_regularizer.txt` text.
REGULARIZER_DESCRIPTIONS = (WEIGHT_DECAY_SCALE, L2_REGULARIZER_SCALE)


# Lines that AXLearn's dumps gained after mid-2025 (fields added with their defaults): the
# learner's `ignore_undefined_loss` and the default `KVCache` of every attention layer. A
# reference dump from an older AXLearn lacks them; `drop_newer_axlearn_lines` removes them from
# ours before comparing with such a dump.
NEWER_AXLEARN_LINES = (
    r"(.*\.)?learner\.ignore_undefined_loss: False",
    r".*\.attention\.kv_cache\.klass: 'axlearn\.common\.kv_cache\.kv_cache\.KVCache'",
)


def drop_newer_axlearn_lines(lines: list[str]) -> list[str]:
    """`lines` (of a dump) without those matching NEWER_AXLEARN_LINES.

    Args:
        lines: Dump lines (`path: value`).

    Returns:
        The lines an older AXLearn's dump of the same config would have (same order).
    """
    return [line for line in lines if not any(re.fullmatch(p, line) for p in NEWER_AXLEARN_LINES)]


def _build(config: Any) -> ConfigBase:
    """`config` itself if it is a config, else the config its function returns."""
    if isinstance(config, ConfigBase):
        return config
    with set_data_dir(GOLDEN_DATA_DIR):
        cfg = config()
    if not isinstance(cfg, ConfigBase):
        raise TypeError(f"The trainer config function returned {type(cfg).__name__}, not a config")
    return cfg


def config_text(config: Any) -> str:
    """The config dump: `debug_string()` plus a final newline.

    Args:
        config: A trainer config, or a `TrainerConfigFn` returning one.

    Returns:
        The text.
    """
    return _build(config).debug_string() + "\n"


def init_text(config: Any) -> str:
    """The `_init.txt` text: each model parameter's initializer, in creation order.

    Args:
        config: A trainer config (with a `model` field), or a `TrainerConfigFn` returning one.

    Returns:
        The text, one line per parameter, ending with a newline.
    """
    cfg = _build(config)
    model = cfg.model.clone(name="init_debug_string").instantiate(parent=None)
    return param_init_debug_string(model)


def regularizer_text(config: Any, *, descriptions: tuple[str, ...] = REGULARIZER_DESCRIPTIONS):
    """The `_regularizer.txt` text: per-parameter weight-decay scales as the learner resolves them.

    The learner's `init` and one `update` run abstractly on the model's parameter specs; every
    registration of a selected description becomes a `====...` block (see
    `per_param_settings.per_param_settings_golden_text`). A learner that registers none (e.g.
    adastar without `weight_decay_per_param_scale`, as in AXLearn) gives an empty text.

    Args:
        config: A trainer config (with `model` and `learner`), or a `TrainerConfigFn`.
        descriptions: The per-parameter settings to include.

    Returns:
        The text, ending with a newline unless empty.
    """
    cfg = _build(config)
    model = cfg.model.clone(name="model").instantiate(parent=None)
    learner = cfg.learner.clone(name="learner").instantiate(parent=None)
    records = per_param_settings_records(learner, model.create_parameter_specs_recursively())
    text = per_param_settings_golden_text(records, descriptions)
    return text + "\n" if text else ""


def _should_update() -> bool:
    return any(os.environ.get(name) for name in UPDATE_ENVS)


def _check_or_update(golden_file: str, actual: str) -> None:
    """Compares `actual` with the golden file, or writes it when an update variable is set.

    Raises:
        AssertionError: If the file is missing or differs (naming the file and the fix).
    """
    if _should_update():
        os.makedirs(os.path.dirname(os.path.abspath(golden_file)), exist_ok=True)
        with open(golden_file, "w", encoding="utf-8") as f:
            f.write(actual)
        return
    if not os.path.exists(golden_file):
        raise AssertionError(
            f"Golden file not found: {golden_file}; rerun with UPDATE_GOLDEN=1 to write it"
        )
    with open(golden_file, encoding="utf-8") as f:
        expected = f.read()
    if actual != expected:
        raise AssertionError(
            f"Golden file mismatch: {golden_file}; if the change is intended, rerun with "
            "UPDATE_GOLDEN=1 and review the diff"
        )


def check(config_fn: TrainerConfigFn, golden_file: str) -> None:
    """Asserts that the config dump of `config_fn` equals `golden_file` (see `config_text`)."""
    _check_or_update(golden_file, config_text(config_fn))


def check_init(config_fn: TrainerConfigFn, golden_file: str) -> None:
    """Asserts that the `_init.txt` text of `config_fn` equals `golden_file`."""
    _check_or_update(golden_file, init_text(config_fn))


def check_regularizer(config_fn: TrainerConfigFn, golden_file: str) -> None:
    """Asserts that the `_regularizer.txt` text of `config_fn` equals `golden_file`."""
    _check_or_update(golden_file, regularizer_text(config_fn))


# The golden file suffix of each check.
SUFFIXES: dict[Callable, str] = {
    check: ".txt",
    check_init: "_init.txt",
    check_regularizer: "_regularizer.txt",
}


def test_main(
    module: ModuleType,
    testdata_dir: str,
    *,
    match: Optional[str] = None,
    checks: tuple = (check, check_init),
) -> None:
    """Runs the golden checks for every named config of `module` (AXLearn's entry point).

    Prints a summary and exits with status 1 if any check fails.

    Args:
        module: A module with `named_trainer_configs()`.
        testdata_dir: The directory of the golden files (`<name><suffix>`).
        match: Optional regex; only config names that fully match it are checked.
        checks: The checks to run, from `SUFFIXES`.
    """
    with set_data_dir(GOLDEN_DATA_DIR):
        configs = module.named_trainer_configs()
    if match:
        configs = {n: fn for n, fn in configs.items() if re.fullmatch(match, n)}
    failures = []
    for name, config_fn in configs.items():
        for check_fn in checks:
            golden_file = os.path.join(testdata_dir, f"{name}{SUFFIXES[check_fn]}")
            try:
                check_fn(config_fn, golden_file)
            except (AssertionError, KeyError, TypeError, ValueError) as e:
                failures.append(f"{name} ({check_fn.__name__}): {e}")
    if failures:
        print(f"FAILED: {len(failures)} failures out of {len(configs)} configs:")
        for failure in failures:
            print(f"  {failure}")
        sys.exit(1)
    print(f"PASSED: {len(configs)} configs, {len(checks)} checks each")
