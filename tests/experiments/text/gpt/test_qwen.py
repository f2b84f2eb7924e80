"""Tests axlearn/experiments/text/gpt/qwen.py: AXLearn's values, and a tiny copy training."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from axlearn.common.mixture_of_experts import (
    GMMBackend,
    TopKDropFreeGating,
    TransformerFeedForwardDropFreeMoE,
)
from axlearn.common.trainer_config_modifier import ReplaceLayerConfigModifier
from axlearn.experiments.text.gpt import c4_trainer, qwen
from axlearn.experiments.text.gpt.fuji_tiny import tiny_model_kwargs, tiny_sources

_GPU_RULE = "gpu-(p6-b200.48xlarge|p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-512"


@functools.cache
def _configs():
    return c4_trainer.named_trainer_configs()


def test_registered_names_and_values():
    assert {n for n in _configs() if n.startswith("qwen3-")} == {
        "qwen3-30B-A3B-bs16m-seq32k",
        "qwen3-30B-A3B-bs8m-seq8k",
    }
    cfg = _configs()["qwen3-30B-A3B-bs16m-seq32k"]()
    assert cfg.input.input_dispatcher.global_logical_batch_size == 16 * 1024 * 1024 // 32768
    layer = cfg.model.decoder.transformer.layer
    ff = layer.feed_forward
    assert ff.klass is TransformerFeedForwardDropFreeMoE and ff.gating.klass is TopKDropFreeGating
    assert (ff.num_experts, ff.gating.num_experts_per_token, ff.hidden_dim) == (128, 8, 768)
    assert cfg.model.decoder.transformer.num_layers == 48
    attention = layer.self_attention.attention
    assert (attention.num_heads, attention.hidden_dim) == (32, 4096)
    assert attention.query_scale.norm.eps == 1e-6  # QK norm.
    assert cfg.model.decoder.lm_head is not None  # Untied.
    # AXLearn's output constraint and splash-kernel option (its dump lists both).
    assert attention.o_partition_spec == (("data", "expert", "fsdp"), "seq", "model")
    assert attention.backend_overrides == {"splash_use_fused_bwd_kernel": True}


def test_dump_matches_axlearn_but_for_the_attention_mask():
    """AXLearn's qwen3-30B-A3B-bs8m-seq8k dump, line for line, but for the documented mask line."""
    from tests.experiments.text.gpt.test_c4_trainer import _GOLDENS, match_ratio

    ours = _configs()["qwen3-30B-A3B-bs8m-seq8k"]().debug_string().splitlines()
    with open(f"{_GOLDENS}/qwen3-30B-A3B-bs8m-seq8k.txt", encoding="utf-8") as f:
        theirs = f.read().splitlines()
    _, only_ours, only_theirs = match_ratio(ours, theirs)
    assert (only_ours, only_theirs) == (["model.decoder.attention_mask: None"], [])


def test_replace_layer_modifier_swaps_the_backend_only():
    cfg = _configs()["qwen3-30B-A3B-bs8m-seq8k"]()
    chain = dict(cfg.mesh_rules)[_GPU_RULE]
    replace = chain.config_modifiers[2]
    assert replace.klass is ReplaceLayerConfigModifier
    before = cfg.model.decoder.transformer.layer.feed_forward
    cfg = replace.instantiate()(cfg)
    after = cfg.model.decoder.transformer.layer.feed_forward
    assert after.gmm_backend is GMMBackend.TOKAMAX
    assert after.tokamax_implementation == ["triton", "xla"]
    for key in ("num_experts", "hidden_dim", "tiling", "load_balance_loss_weight"):
        assert getattr(after, key) == getattr(before, key)
    assert after.gating.num_experts_per_token == 8
    with pytest.raises(ValueError, match="no config of TransformerFeedForwardDropFreeMoE"):
        replace.instantiate()(_configs()["envy-test"]())


@pytest.mark.slow
def test_tiny_copy_trains_four_steps_with_the_gpu_rule(tmp_path):
    cfg = _configs()["qwen3-30B-A3B-bs8m-seq8k"]()
    cfg.model = qwen.model_config(
        num_layers=2,
        hidden_dim=16,
        num_heads=2,
        num_kv_heads=1,
        num_experts=4,
        vocab_size=tiny_model_kwargs()["vocab_size"],
        train_capacity_factor=0,
        num_groups=1,
        ffn_dim=32,
        moe_ffn_dim=32,
        atten_hidden_dim=16,
        num_experts_per_token=2,
        tiling=(8, 8, 8),
        z_loss_scale=1e-6,
    ).set(name="model")
    cfg = dict(cfg.mesh_rules)[_GPU_RULE].instantiate()(cfg)
    assert cfg.model.decoder.transformer.layer.feed_forward.gmm_backend is GMMBackend.TOKAMAX
    train, _ = tiny_sources(max_sequence_length=32)
    cfg.input.source = train
    cfg.input.input_dispatcher.global_logical_batch_size = 16
    cfg.evalers = {}
    cfg.set(name="trainer", dir=str(tmp_path), max_step=4, mesh_shape=(1, 1, 2, 4, 1, 1))
    cfg.learner.optimizer.args[1].update_schedule.max_step = 4
    cfg.learner.optimizer.args[1].update_schedule.warmup_steps = 1
    cfg.checkpointer.save_policy.max_step = 4
    trainer = cfg.instantiate(parent=None)
    output = trainer.run(jax.random.PRNGKey(0))
    assert output is not None and np.isfinite(float(output["loss"]))
    assert int(trainer.step) == 4
