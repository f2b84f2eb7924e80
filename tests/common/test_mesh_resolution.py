"""Tests axlearn/common/mesh_resolution.py: instance type -> selector -> rule -> mesh."""

from __future__ import annotations

import pytest

from axlearn.cloud.gcp.system_characteristics import mesh_selector_for
from axlearn.common.mesh_resolution import (
    MeshSelectorError,
    apply_mesh_rule,
    match_mesh_rule,
    overrides_set_mesh,
    resolve_mesh,
)
from axlearn.common.trainer import SpmdTrainer, select_mesh_config
from axlearn.common.trainer_config_modifier import MeshShapeModifier


def test_selector_convention_is_axlearns():
    # TPU: the instance type for one slice, "-<slices>" for several.
    assert mesh_selector_for("tpu-v5p-8") == "tpu-v5p-8"
    assert mesh_selector_for("tpu-v5p-128", 2) == "tpu-v5p-128-2"
    assert mesh_selector_for("tpu-v5litepod-256", 4) == "tpu-v5litepod-256-4"
    # GPU: "-<total GPUs>" (8 per node).
    assert mesh_selector_for("gpu-a3-highgpu-8g", 2) == "gpu-a3-highgpu-8g-16"
    assert mesh_selector_for("gpu-a3-highgpu-8g", 32) == "gpu-a3-highgpu-8g-256"
    # AXLearn's own fuji rules match what the launcher passes.
    assert match_mesh_rule(
        _cfg(("gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-(256|512|1024)", (8,))),
        mesh_selector_for("gpu-a3-highgpu-8g", 32),
    ) == (0, "gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-(256|512|1024)", (8,))
    assert match_mesh_rule(_cfg(("tpu-v5p-.*", (8,))), "tpu-v5p-128-2")[0] == 0
    with pytest.raises(ValueError, match="Unknown instance type 'tpu-v5p-127'"):
        mesh_selector_for("tpu-v5p-127")
    with pytest.raises(ValueError, match="--num_replicas must be >= 1, got 0"):
        mesh_selector_for("tpu-v5p-8", 0)


def _cfg(*rules):
    cfg = SpmdTrainer.default_config().set(mesh_shape=(-1, 1), mesh_axis_names=("data", "model"))
    cfg.mesh_rules = list(rules) or None
    return cfg


def test_the_first_full_match_wins_and_is_described():
    cfg = _cfg(("tpu-v5p-8", (1, 4)), ("tpu-v5p-.*", (-1, 2)), ("tpu-v5p-8-2", (9, 9)))
    out, res = resolve_mesh(cfg, mesh_selector="tpu-v5p-8-2")
    assert out.mesh_shape == (-1, 2)
    assert (res.rule, res.rule_index, res.source) == ("tpu-v5p-.*", 1, "rule")
    assert res.describe() == (
        "--mesh_selector=tpu-v5p-8-2 matched mesh rule 'tpu-v5p-.*' (mesh_rules[1]): "
        "mesh_shape (-1, 2)"
    )
    # trainer.select_mesh_config applies the same rule.
    assert select_mesh_config(_cfg(*cfg.mesh_rules), mesh_selector="tpu-v5p-8-2").mesh_shape == (
        -1,
        2,
    )


def test_a_modifier_rule_is_named():
    modifier = MeshShapeModifier.default_config().set(mesh_shape=(2, -1))
    out, res = resolve_mesh(_cfg(("gpu-.*", modifier)), mesh_selector="gpu-a3-highgpu-8g-16")
    assert out.mesh_shape == (2, -1)
    assert res.modifier == "MeshShapeModifier"
    assert "modifier MeshShapeModifier, mesh_shape (2, -1)" in res.describe()
    with pytest.raises(TypeError, match="must be a mesh shape or a ConfigModifier config; got int"):
        apply_mesh_rule(_cfg(), 3, mesh_selector="x")


def test_unmatched_selector_is_refused_naming_rules_and_closest_names():
    cfg = _cfg(("cpu-fsdp", (1, -1)), ("tpu-v5p-(8|16)", (-1, 1)), ("gpu-a3-highgpu-8g-16", (2, 8)))
    with pytest.raises(MeshSelectorError) as e:
        resolve_mesh(cfg, mesh_selector="tpu-v5p-32", config_name="m:c")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(
        "--mesh_selector=tpu-v5p-32 matches none of m:c's mesh_rules "
        "['cpu-fsdp', 'tpu-v5p-(8|16)', 'gpu-a3-highgpu-8g-16']; closest selectors its rules "
        "match: tpu-v5p-8, tpu-v5p-16; closest rules: 'tpu-v5p-(8|16)'"
    )
    assert "--config_override=mesh_shape=(...)" in message and "catch-all '.*'" in message
    # The config is untouched by a refusal.
    assert cfg.mesh_shape == (-1, 1)


def test_explicit_mesh_catch_all_and_no_rules_are_accepted():
    cfg = _cfg(("tpu-v5p-8", (1, 4)))
    out, res = resolve_mesh(
        cfg.set(mesh_shape=(4, 1)), mesh_selector="tpu-v6e-8", explicit_mesh=True
    )
    assert out.mesh_shape == (4, 1) and res.source == "explicit" and res.rule is None
    assert "explicit mesh_shape (4, 1) from --config_override" in res.describe()
    # A catch-all last rule is the experiment's default for every other selector.
    out, res = resolve_mesh(_cfg(("tpu-v5p-8", (1, 4)), (".*", (-1, 1))), mesh_selector="x-1")
    assert (res.rule, out.mesh_shape) == (".*", (-1, 1))
    # No rules: the config's mesh everywhere.
    out, res = resolve_mesh(_cfg(), mesh_selector="tpu-v6e-8")
    assert res.source == "no_rules" and out.mesh_shape == (-1, 1)
    # No selector: nothing applied, even when rules exist.
    out, res = resolve_mesh(_cfg(("tpu-v5p-8", (1, 4))), mesh_selector=None)
    assert res.source == "no_selector" and out.mesh_shape == (-1, 1)
    assert overrides_set_mesh(["max_step=3", "mesh_shape=(1,-1)"])
    assert not overrides_set_mesh(["mesh_rules=[]", "model.mesh_shape=1"])
