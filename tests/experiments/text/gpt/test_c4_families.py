"""A tiny-shaped copy of each `c4_trainer` family trains 4 steps on the 8 CPU devices, with the
mesh rule a real launch would pick applied (its modifiers: mesh shape, remat, flash block sizes,
FP8, ...), the mesh then fitted to 8 devices.

Families: fuji v1, v2, v3, v3-tiktoken, -fp8 (fp8 emulated on CPU) and gspmd (pipelined, stream
schedule). The MoE families (envy, qwen3) are tested with their modules.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from axlearn.common.mesh_resolution import resolve_mesh
from axlearn.common.utils import flatten_items
from tests.experiments.text.gpt.test_c4_trainer import _configs, _tiny_equivalent

STEPS = 4

# (config name, --mesh_selector, the rule it must resolve to).
FAMILIES = [
    ("fuji-7B-v1", "gpu-a3-highgpu-8g-256", "gpu-(a3-highgpu-8g|a3-megagpu-8g|a3-ultragpu-8g)"),
    ("fuji-7B-v2-flash", "gpu-a4-highgpu-8g-256", "gpu-(a4-highgpu-8g)"),
    ("fuji-7B-v3", "tpu-v5p-512", "tpu-v5p-.*"),
    ("fuji-8B-v3-tiktoken", "gpu-a3-highgpu-8g-256", "gpu-(p5.48xlarge|p4de.24xlarge|a3"),
    ("fuji-7B-v3-flash-fp8", "gpu-a3-highgpu-8g-256", "gpu-(a3-highgpu-8g|a3-megagpu-8g"),
    # Multi-head attention: the fused q/k/v projection keeps fp8 state per projection.
    ("fuji-7B-v1-flash-fp8", "gpu-a3-highgpu-8g-256", "gpu-(a3-highgpu-8g|a3-megagpu-8g"),
]


def _fit_to_8_devices(mesh_shape) -> tuple:
    """The rule's mesh with every axis above 8 cut to 8 (e.g. fsdp=64 -> 8, data=-1 -> 1)."""
    return tuple(min(d, 8) if d > 0 else d for d in mesh_shape)


def _kv_heads(cfg):
    """The config's number of KV heads (None: multi-head attention)."""
    qkv = cfg.model.decoder.transformer.layer.self_attention.attention.input_linear
    inner = getattr(qkv, "input_linear", qkv)
    return getattr(inner, "num_kv_heads", None)


@pytest.mark.slow  # One trainer compile and 4 steps per family: ~1 min each on 2 busy cores.
@pytest.mark.parametrize("name,selector,rule_prefix", FAMILIES)
def test_tiny_family_trains_with_its_mesh_rule(name, selector, rule_prefix, tmp_path):
    cfg = _tiny_equivalent(name, str(tmp_path), max_step=STEPS)
    # The tiny copy keeps the attention kind (multi-head for v1/v2 7B, grouped-query otherwise).
    assert (_kv_heads(cfg) is None) == (_kv_heads(_configs()[name]()) is None)
    cfg, res = resolve_mesh(cfg, mesh_selector=selector, config_name=name)
    assert res.rule.startswith(rule_prefix), res
    cfg.mesh_shape = _fit_to_8_devices(cfg.mesh_shape)
    trainer = cfg.instantiate(parent=None)
    output = trainer.run(jax.random.PRNGKey(0))
    assert output is not None and np.isfinite(float(output["loss"]))
    params = dict(flatten_items(trainer.trainer_state.model))
    histories = {p: v for p, v in params.items() if p.endswith("amax_history")}
    if name.endswith("-fp8"):
        # The FP8 modifier of the rule ran: every dense matmul kept an amax history, filled for
        # the steps taken (newest first).
        assert histories
        # Attention's projections are quantized too, not only the feed-forward.
        assert any("/o_proj/" in p for p in histories), sorted(histories)
        assert any("/qkv_proj/" in p for p in histories), sorted(histories)
        for path, history in histories.items():
            history = np.asarray(history)
            # [num_layers, length] in the repeated stack.
            assert np.all(history[..., :STEPS] > 0), path
            assert not np.any(history[..., STEPS:]), path
    else:
        assert not histories


@pytest.mark.slow
def test_tiny_gspmd_stream_trains(tmp_path):
    """gspmd-16B-2x16x8-stream at tiny shapes: 4 layers over 2 pipeline stages (stream
    schedule, 2 microbatches) on a (pipeline=2, data=4) mesh; its config has no mesh rules."""
    from axlearn.experiments.text.gpt.fuji_tiny import tiny_sources

    cfg = _configs()["gspmd-16B-2x16x8-stream"]()
    assert not cfg.mesh_rules
    decoder = cfg.model.decoder
    decoder.set(dim=16, vocab_size=4096)
    decoder.transformer.set(num_layers=4, num_microbatches=2)
    decoder.transformer.layer.self_attention.attention.set(num_heads=4)
    decoder.transformer.layer.self_attention.attention.input_linear.input_linear.num_kv_heads = 2
    train, _ = tiny_sources(max_sequence_length=32)
    cfg.input.source = train
    cfg.input.input_dispatcher.global_logical_batch_size = 8
    cfg.evalers = {}
    cfg.set(name="trainer", dir=str(tmp_path), max_step=STEPS, mesh_shape=(2, 4, 1, 1, 1, 1))
    cfg.checkpointer.save_policy.max_step = STEPS
    trainer = cfg.instantiate(parent=None)
    output = trainer.run(jax.random.PRNGKey(0))
    assert output is not None and np.isfinite(float(output["loss"]))
