"""Tests of axlearn.experiments.text.gpt.long_context (8 CPU devices, float32).

A whole tiny Fuji v3 decoder (RoPE, GQA, QK-norm) with `set_context_parallel` at degree 2, 4
and 8 equals the same decoder on one device in loss and gradients, packed and not, both forms;
20 training steps at degree 4 give degree 1's losses.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from axlearn.common.attention import StackedTransformerLayer
from axlearn.common.module import functional
from axlearn.experiments.text.gpt import fuji, long_context
from axlearn.experiments.text.gpt.common import MESH_AXIS_NAMES, scaled_hidden_dim

VOCAB, BATCH = 64, 2


def _model(*, form=None):
    cfg = fuji.model_config(
        num_layers=2,
        hidden_dim=32,
        num_heads=4,
        num_kv_heads=2,
        vocab_size=VOCAB,
        rope_theta=5e5,
        ffn_dim=scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=16),
        shared_lm_head=True,
        flash_attention=True,
        stack_cfg=StackedTransformerLayer.default_config(),
    )
    if form is not None:
        assert long_context.set_context_parallel(cfg, form=form) == 1
    return cfg.set(name="model").instantiate(parent=None)


def _mesh(degree: int) -> Mesh:
    shape = dict(pipeline=1, data=8 // degree, expert=1, fsdp=1, seq=degree, model=1)
    devices = np.array(jax.devices()[:8]).reshape([shape[a] for a in MESH_AXIS_NAMES])
    return Mesh(devices, MESH_AXIS_NAMES)


def _batch(length: int, *, packed: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(BATCH, length + 1))
    batch = dict(
        input_ids=jnp.asarray(ids[:, :-1], jnp.int32),
        target_labels=jnp.asarray(ids[:, 1:], jnp.int32),
    )
    if packed:
        # Two packed examples per row; positions restart at 0 in each (RoPE per segment).
        cut = length // 3
        segments = np.where(np.arange(length) < cut, 1, 2)[None].repeat(BATCH, 0)
        positions = np.where(np.arange(length) < cut, np.arange(length), np.arange(length) - cut)
        batch["input_segment_ids"] = jnp.asarray(segments, jnp.int32)
        batch["input_positions"] = jnp.asarray(positions[None].repeat(BATCH, 0), jnp.int32)
        batch["positions"] = batch["input_positions"]
    return batch


def _loss_fn(model):
    def loss(params, batch):
        (value, _), _ = functional(
            model, jax.random.PRNGKey(1), params, dict(input_batch=batch), is_training=True
        )
        return value

    return loss


def _check_decoder(degree: int, form: str, packed: bool):
    single = _model()
    params = single.initialize_parameters_recursively(jax.random.PRNGKey(0))
    batch = _batch(64, packed=packed)
    expected = jax.jit(jax.value_and_grad(_loss_fn(single)))(params, batch)
    split = _model(form=form)
    with jax.set_mesh(_mesh(degree)):
        actual = jax.jit(jax.value_and_grad(_loss_fn(split)))(params, batch)
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(jax.tree.leaves(actual[1]), jax.tree.leaves(expected[1])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_decoder_equals_one_device():
    _check_decoder(4, "ring", packed=True)


@pytest.mark.slow
@pytest.mark.parametrize("degree", [2, 4, 8])
@pytest.mark.parametrize("form", ["ring", "all_gather"])
@pytest.mark.parametrize("packed", [False, True])
def test_decoder_equals_one_device_all(degree, form, packed):
    _check_decoder(degree, form, packed)


def _train(model, params, mesh, steps: int, length: int) -> list[float]:
    optimizer = optax.adamw(3e-3)
    loss = _loss_fn(model)

    @jax.jit
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    opt_state = optimizer.init(params)
    losses = []
    for i in range(steps):
        batch = _batch(length, packed=i % 2 == 1, seed=i)
        if mesh is None:
            params, opt_state, value = step(params, opt_state, batch)
        else:
            with jax.set_mesh(mesh):
                params, opt_state, value = step(params, opt_state, batch)
        losses.append(float(value))
    return losses


@pytest.mark.slow
def test_twenty_steps_degree_4_equal_degree_1():
    length = 512
    single = _model()
    params = single.initialize_parameters_recursively(jax.random.PRNGKey(0))
    expected = _train(single, params, None, 20, length)
    actual = _train(_model(form="ring"), params, _mesh(4), 20, length)
    assert expected[-1] < expected[0]  # It trains.
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_named_configs():
    configs = long_context.named_trainer_configs()
    assert sorted(configs) == [
        "fuji-7B-v3-flash-128k-cp",
        "fuji-7B-v3-flash-128k-cp-ag",
        "fuji-7B-v3-flash-32k-cp",
        "fuji-7B-v3-flash-32k-cp-ag",
    ]
    cfg = configs["fuji-7B-v3-flash-128k-cp"]()
    attention = cfg.model.decoder.transformer.layer.self_attention.attention
    assert attention.context_parallel.form == "ring"
    assert cfg.input.source.max_sequence_length == 131072
    # Same 16M tokens per batch as fuji-7B-v3; the mesh's seq axis is the degree (16).
    assert cfg.input.input_dispatcher.global_logical_batch_size * 131072 == 16 * 1024**2
    assert cfg.mesh_shape[MESH_AXIS_NAMES.index("seq")] == 16
