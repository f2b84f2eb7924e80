"""Tests for axlearn/common/config/override.py: `--config_override=PATH=VALUE` on a config tree."""

from __future__ import annotations

import pytest

from axlearn.common.config.override import (
    ConfigOverrideError,
    apply_overrides,
    nearest_path,
    parse_override,
)
from axlearn.experiments.text.gpt.tiny import tiny_trainer_config


@pytest.mark.parametrize(
    "text,expected",
    [
        ("max_step=20", ("max_step", 20)),
        ("a.b=1e-3", ("a.b", 1e-3)),
        ("x=(2, 4)", ("x", (2, 4))),
        ("x=None", ("x", None)),
        ("x=True", ("x", True)),
        ("x='quoted'", ("x", "quoted")),
        ("name=my_run", ("name", "my_run")),  # Not a literal: a string.
        (" x = [1, 2] ", ("x", [1, 2])),
        ("x=a=b", ("x", "a=b")),
    ],
)
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["max_step", "=3", ""])
def test_parse_override_needs_path_and_equals(text):
    with pytest.raises(ConfigOverrideError, match="PATH=VALUE"):
        parse_override(text)


def test_overrides_set_fields_through_configs_dicts_and_functions():
    cfg = tiny_trainer_config()
    apply_overrides(
        cfg,
        [
            "max_step=20",
            "model.decoder.transformer.num_layers=4",
            "learner.optimizer.inner.learning_rate.peak_lr=1e-3",
            "evalers.validation.eval_policy.n=7",
            "checkpointer.keep_last_n=None",
            # None removes an optional child config.
            "model.decoder.transformer.layer.self_attention.attention.query_scale.norm=None",
            "name=my_trainer",
        ],
    )
    assert cfg.max_step == 20
    assert cfg.model.decoder.transformer.num_layers == 4
    assert cfg.learner.optimizer.inner.learning_rate.peak_lr == 1e-3
    assert cfg.evalers["validation"].eval_policy.n == 7
    assert cfg.checkpointer.keep_last_n is None
    assert cfg.model.decoder.transformer.layer.self_attention.attention.query_scale.norm is None
    assert cfg.name == "my_trainer"
    dump = cfg.debug_string()
    assert "max_step: 20\n" in dump
    assert "model.decoder.transformer.num_layers: 4\n" in dump
    assert "learner.optimizer.inner.learning_rate.peak_lr: 0.001\n" in dump


@pytest.mark.parametrize(
    "override,nearest",
    [
        ("max_steps=20", "max_step"),
        ("model.decoder.transformer.num_layer=4", "model.decoder.transformer.num_layers"),
        # The example: peak_lr lives under the inner optimizer's schedule.
        ("learner.optimizer.peak_lr=1e-3", "learner.optimizer.inner.learning_rate.peak_lr"),
        ("evalers.valid.eval_policy.n=3", "evalers.validation.eval_policy.n"),
    ],
)
def test_bad_path_names_the_nearest_valid_one(override, nearest):
    cfg = tiny_trainer_config()
    before = cfg.debug_string()
    with pytest.raises(ConfigOverrideError, match="does not exist") as e:
        apply_overrides(cfg, [override])
    assert f"did you mean {nearest}?" in str(e.value)
    assert override.split("=")[0] in str(e.value)
    assert cfg.debug_string() == before


@pytest.mark.parametrize(
    "override,expected",
    [
        ("max_step=abc", "expects int or float, got str"),  # Union[int, float].
        ("max_step=True", "expects int or float, got bool"),
        ("model.decoder.transformer.num_layers=2.5", "expects int, got float"),  # set()'s check.
        ("save_input_iterator=1", "expects bool, got int"),
        ("model.decoder=3", "is a config"),
    ],
)
def test_bad_type_names_the_expected_type(override, expected):
    cfg = tiny_trainer_config()
    with pytest.raises(ConfigOverrideError, match=expected) as e:
        apply_overrides(cfg, [override])
    assert override.split("=")[0] in str(e.value)


def test_nearest_path_prefers_same_last_name():
    paths = ["a.lr", "a.inner.peak_lr", "a.peak_lx"]
    assert nearest_path("a.peak_lr", paths) == "a.inner.peak_lr"
    assert nearest_path("zzz", []) is None


def test_tuple_item_override_names_the_whole_tuple_to_set():
    """Issue 38: `mesh_axis_names.3=...` says how to set the tuple, and that override works."""
    cfg = tiny_trainer_config()
    names = tuple(cfg.mesh_axis_names)
    with pytest.raises(ConfigOverrideError) as e:
        apply_overrides(cfg, ["mesh_axis_names.1=x"])
    expected = names[:1] + ("x",) + names[2:]
    suggestion = f"mesh_axis_names={expected!r}"
    assert "is a tuple, whose items cannot be set one by one" in str(e.value)
    assert suggestion in str(e.value)
    apply_overrides(cfg, [suggestion])
    assert tuple(cfg.mesh_axis_names) == expected


@pytest.mark.parametrize(
    "override,expected",
    [
        ("max_step=" + "9" * 10_000_000, r"is 10000009 characters, more than the 65536"),
        ("x" * 10_000_000, "is 10000000 characters"),
        ("max_step='" + "a" * 60_000 + "'", r"expects int or float, got str"),
        ("model.nope" + "x" * 60_000 + "=1", r"does not exist"),
        ("model.decoder.dim=[" + "[" * 30_000 + "]" * 30_001, r"expects int, got str"),
    ],
)
def test_oversized_override_is_one_short_line(override, expected):
    """Unclear case: a gigantic --config_override (10 MB) echoed whole, or a traceback."""
    cfg = tiny_trainer_config()
    with pytest.raises(ConfigOverrideError, match=expected) as e:
        apply_overrides(cfg, [override])
    message = str(e.value)
    assert "\n" not in message and len(message) < 1000, len(message)
    assert "characters)" in message or "65536" in message
