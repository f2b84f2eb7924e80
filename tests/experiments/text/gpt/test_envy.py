"""Tests axlearn/experiments/text/gpt/envy.py: AXLearn's dumps, errors, and tiny copies training."""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
import pytest

from axlearn.common import golden_config
from axlearn.common.mixture_of_experts import TransformerFeedForwardMoE
from axlearn.experiments.text.gpt import c4_trainer, envy
from axlearn.experiments.text.gpt.fuji_tiny import tiny_model_kwargs, tiny_sources

_REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
)
_GOLDENS = os.path.join(_REPO, "tests", "testdata", "axlearn_goldens")


@functools.cache
def _configs():
    return c4_trainer.named_trainer_configs()


def test_registered_names():
    names = {n for n in _configs() if n.startswith("envy-")}
    assert names == {
        "envy-test",
        "envy-Switch-Base",
        "envy-Switch-Base-single-host",
        "envy-Switch-Large",
        "envy-Switch-XXL",
    }


def test_init_dump_equals_axlearn():
    with open(os.path.join(_GOLDENS, "envy-test_init.txt"), encoding="utf-8") as f:
        expected = f.read().splitlines()
    assert golden_config.init_text(_configs()["envy-test"]()).splitlines() == expected


def test_alternating_dense_and_moe_layers_with_axlearn_values():
    cfg = _configs()["envy-Switch-Base"]()
    stack = cfg.model.decoder.transformer
    assert stack.num_layers == 6 and stack.layer.num_layers == 2
    dense, sparse = (layer.feed_forward for layer in stack.layer.layer)
    assert dense.klass.__name__ == "TransformerFeedForwardLayer"
    assert sparse.klass is TransformerFeedForwardMoE
    assert (sparse.num_experts, sparse.num_groups, sparse.gating.train_capacity_factor) == (
        128,
        2,
        2.0,
    )
    assert sparse.structure == dense.structure == "hybridnorm"
    # Outer batch over (data, fsdp) of the (fsdp=-1, expert=16) mesh: resolved at run time.
    assert sparse.outer_batch == -1 and tuple(cfg.mesh_shape) == (1, 1, 16, -1, 1, 1)
    attention = stack.layer.layer[0].self_attention.attention
    assert attention.query_scale.norm.eps == attention.key_scale.norm.eps == 1e-5  # QK norm.
    assert cfg.model.metrics.metrics["lm"].z_loss_scale == 1e-6
    assert [rule for rule, _ in cfg.mesh_rules] == [
        "tpu-v5p-(1024|2048)",
        "tpu-v6e-256",
        "tpu-7x-256",
    ]
    with pytest.raises(ValueError, match="multiple of len\\(ffn_layer_types\\)=2"):
        envy.model_config(**dict(_tiny_model_kwargs(), num_layers=3))


def _tiny_model_kwargs(**overrides):
    kwargs = dict(
        num_layers=4,
        hidden_dim=16,
        num_heads=2,
        num_kv_heads=1,
        num_experts=4,
        vocab_size=tiny_model_kwargs()["vocab_size"],
        train_capacity_factor=2.0,
        num_groups=2,
        ffn_layer_types=("dense", "sparse"),
        ffn_dim=32,
    )
    kwargs.update(overrides)
    return kwargs


def _tiny_copy(name: str, rule: str | None, trainer_dir: str, *, mesh_shape, max_step: int = 4):
    """Config `name` with tiny shapes (same structure), its mesh rule's modifiers applied, on
    an 8-device mesh with a 2-way expert axis, training on the embedded corpus."""
    cfg = _configs()[name]()
    sparse = cfg.model.decoder.transformer.layer.layer[1].feed_forward
    cfg.model = envy.model_config(
        **_tiny_model_kwargs(),
        flash_attention=name != "envy-test",
        ffn_structure=sparse.structure,
        mesh_shape=(1, -1, 2, 4, 1, 1),
        z_loss_scale=1e-6,
    ).set(name="model")
    if rule is not None:
        cfg = dict(cfg.mesh_rules)[rule].instantiate()(cfg)
    train, _ = tiny_sources(max_sequence_length=32)
    cfg.input.source = train
    cfg.input.input_dispatcher.global_logical_batch_size = 16
    cfg.evalers = {}
    cfg.set(name="trainer", dir=trainer_dir, max_step=max_step, mesh_shape=mesh_shape)
    cfg.learner.optimizer.args[1].update_schedule.max_step = max_step
    cfg.learner.optimizer.args[1].update_schedule.warmup_steps = 1
    cfg.checkpointer.save_policy.max_step = max_step
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,rule", [("envy-test", None), ("envy-Switch-Base", "tpu-v5p-(1024|2048)")]
)
def test_tiny_copy_trains_four_steps(name, rule, tmp_path):
    cfg = _tiny_copy(name, rule, str(tmp_path), mesh_shape=(1, 1, 2, 4, 1, 1))
    if rule is not None:
        # The rule's remat modifier reached the stack (its mesh shape is replaced for 8 devices).
        assert cfg.model.decoder.transformer.layer.remat_spec.prevent_cse is True
    trainer = cfg.instantiate(parent=None)
    output = trainer.run(jax.random.PRNGKey(0))
    assert output is not None and np.isfinite(float(output["loss"]))
    assert int(trainer.step) == 4


def test_num_experts_not_divisible_by_the_expert_axis_is_a_one_line_error(tmp_path):
    cfg = _tiny_copy("envy-test", None, str(tmp_path), mesh_shape=(1, 1, 8, 1, 1, 1))
    cfg.model.decoder.transformer.layer.layer[1].feed_forward.num_experts = 12
    with pytest.raises(ValueError) as e:
        cfg.instantiate(parent=None)
    message = str(e.value)
    assert "\n" not in message
    assert "num_experts=12 is not divisible by the 8-way expert sharding" in message
    assert "feed_forward.num_experts" in message and "use a multiple of 8 experts" in message
