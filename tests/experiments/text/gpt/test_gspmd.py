"""Tests axlearn/experiments/text/gpt/gspmd.py (registered by c4_trainer)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from axlearn.common.module import functional as F
from axlearn.common.pipeline import GPipeSchedule
from axlearn.common.utils import HybridMeshShape
from axlearn.experiments.text.gpt import c4_trainer, gspmd


def test_gspmd_16b_values():
    cfg = c4_trainer.named_trainer_configs()["gspmd-16B-2x16x8"]()
    assert isinstance(cfg.mesh_shape, HybridMeshShape)
    assert cfg.mesh_shape.ici_mesh_shape == (1, -1, 1, 1, 1, 8)
    assert cfg.mesh_shape.dcn_mesh_shape == (2, -1, 1, 1, 1, 1)
    stack = cfg.model.decoder.transformer
    assert (stack.num_layers, stack.num_stages, stack.num_microbatches) == (64, 2, 16)
    assert stack.pipeline.schedule.klass is GPipeSchedule
    assert cfg.input.input_dispatcher.global_logical_batch_size == 512
    assert (cfg.max_step, cfg.model.decoder.vocab_size, cfg.model.decoder.dim) == (
        100000,
        32768,
        4096,
    )


def test_gspmd_16b_stream_differs_only_in_schedule():
    from axlearn.common.pipeline import StreamSchedule

    configs = c4_trainer.named_trainer_configs()
    gpipe = configs["gspmd-16B-2x16x8"]()
    stream = configs["gspmd-16B-2x16x8-stream"]()
    assert stream.model.decoder.transformer.pipeline.schedule.klass is StreamSchedule
    # 16 microbatches over 2 stages: the stream schedule needs num_stages | num_microbatches.
    schedule = stream.model.decoder.transformer.pipeline.schedule.clone(
        num_stages=2, num_microbatches=16
    ).instantiate()
    assert schedule.num_steps() == 16 + 2 - 1
    stream.model.decoder.transformer.pipeline.schedule = GPipeSchedule.default_config()
    assert stream.debug_string() == gpipe.debug_string()


@pytest.mark.slow  # Compiling the pipelined step takes about a minute on 2 busy cores.
def test_tiny_gspmd_model_trains_over_two_pipeline_stages():
    """The 16B model's structure at tiny shapes: 4 layers over 2 stages on a (pipeline=2, data=4)
    mesh of the 8 CPU devices; 4 SGD steps lower the loss."""
    cfg = gspmd.model_config(GPipeSchedule.default_config()).set(name="model")
    cfg.decoder.set(dim=16, vocab_size=64)
    cfg.decoder.transformer.set(num_layers=4, num_microbatches=2)
    attention = cfg.decoder.transformer.layer.self_attention.attention
    attention.set(num_heads=4)
    attention.input_linear.input_linear.num_kv_heads = 2
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:8]).reshape(2, 4, 1, 1, 1, 1),
        ("pipeline", "data", "expert", "fsdp", "seq", "model"),
    )
    rng = np.random.RandomState(0)
    ids = rng.randint(1, 64, size=(8, 16)).astype(np.int32)
    batch = dict(input_ids=ids, target_labels=np.roll(ids, -1, axis=1))
    with jax.set_mesh(mesh):
        model = cfg.instantiate(parent=None)
        params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))

        def loss_fn(params):
            (loss, _), _ = F(
                model,
                prng_key=jax.random.PRNGKey(1),
                state=params,
                inputs=dict(input_batch=batch),
                is_training=True,
            )
            return loss

        step = jax.jit(jax.value_and_grad(loss_fn))
        losses = []
        for _ in range(4):
            loss, grads = step(params)
            losses.append(float(loss))
            params = jax.tree.map(lambda p, g: p - 0.5 * g.astype(p.dtype), params, grads)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert abs(losses[0] - np.log(64)) < 1.0  # Near-uniform predictions at initialization.
