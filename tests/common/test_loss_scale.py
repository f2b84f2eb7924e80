"""Tests of axlearn/common/loss_scale.py: dynamic loss scaling in the learner, fp16 vs fp32."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import learner as learner_lib
from axlearn.common import optimizers
from axlearn.common.config import config_for_function
from axlearn.common.loss_scale import DynamicLossScaler
from axlearn.common.module import functional as F
from axlearn.common.module import new_output_collection
from axlearn.common.optimizer_base import OptParam
from axlearn.common.utils import cast_floats

D, C, H, N = 16, 4, 16, 256


def _data():
    rng = np.random.RandomState(0)
    x = rng.standard_normal((N, D)).astype(np.float32)
    teacher = rng.standard_normal((D, C)).astype(np.float32)
    y = np.argmax(x @ teacher + rng.standard_normal((N, C)), axis=-1).astype(np.int32)
    params = dict(
        w1=(rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32),
        b1=np.zeros((H,), np.float32),
        w2=(rng.standard_normal((H, C)) / np.sqrt(H)).astype(np.float32),
        b2=np.zeros((C,), np.float32),
    )
    return params, dict(x=x, y=y, inject=np.float32(0.0))


def make_loss_fn(dtype):
    """An MLP whose parameters and inputs are cast to `dtype` inside the loss (like train_dtype)."""

    def fn(*, model_params, inputs):
        batch = inputs["input_batch"]
        p = cast_floats(model_params, dtype)
        h = jnp.tanh(batch["x"].astype(dtype) @ p["w1"] + p["b1"])
        logits = (h @ p["w2"] + p["b2"]).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits)
        loss = -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], axis=1))
        # `inject` > 0 multiplies the loss by a factor whose scaled gradients overflow float32.
        loss = loss * (1.0 + batch.get("inject", 0.0) * 1e30)
        return learner_lib.ForwardOutputs(
            loss=loss, aux={}, output_collection=new_output_collection()
        )

    return fn


def _trainer(dtype, scaler):
    cfg = learner_lib.Learner.default_config().set(
        name="learner",
        optimizer=config_for_function(optimizers.adamw_optimizer).set(
            learning_rate=5e-4, b1=0.9, b2=0.999, eps=1e-8
        ),
        loss_scaler=scaler,
    )
    return _trainer_from(cfg, dtype)


def _trainer_from(cfg, dtype=jnp.float32):
    learner = cfg.instantiate(parent=None)
    fn = make_loss_fn(dtype)
    opt = lambda p: jax.tree.map(lambda v: OptParam(v, None, None), p)

    @jax.jit
    def step(params, state, batch):
        out, collection = F(
            learner,
            method="forward_and_backward",
            prng_key=jax.random.PRNGKey(0),
            state=state,
            inputs=dict(fn=fn, opt_params=opt(params), inputs=dict(input_batch=batch)),
            is_training=True,
        )
        return (
            out.backward_outputs.updated_params,
            collection.state_updates,
            out.forward_outputs.loss,
            collection.summaries,
        )

    return learner, step, opt


def test_injected_overflow_halves_scale_and_skips_that_step():
    params, batch = _data()
    scaler = DynamicLossScaler.default_config().set(growth_interval=3)
    learner, step, opt = _trainer(jnp.float32, scaler)
    state = learner.init(opt(params))
    assert float(state["loss_scale"].scale) == 2.0**32

    history = []
    for i in range(6):
        inject = np.float32(1.0 if i == 1 else 0.0)
        new_params, new_state, loss, summaries = step(params, state, dict(batch, inject=inject))
        changed = any(
            np.any(np.asarray(a) != b)
            for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params))
        )
        opt_changed = any(
            np.any(np.asarray(a) != np.asarray(b))
            for a, b in zip(
                jax.tree.leaves(new_state["optimizer"]), jax.tree.leaves(state["optimizer"])
            )
        )
        history.append(
            (
                float(summaries["loss_scale/scale"]),
                int(summaries["loss_scale/num_skipped_steps"]),
                int(summaries["loss_scale/num_nan_steps"]),
                changed,
                opt_changed,
                float(loss),
            )
        )
        params, state = new_params, new_state
    scales = [h[0] for h in history]
    # Step 1 overflows: scale halves, that step (and only it) is skipped, params/state unchanged.
    assert scales[:2] == [2.0**32, 2.0**31]
    assert [h[1] for h in history] == [0, 1, 1, 1, 1, 1]
    assert [h[3] for h in history] == [True, False, True, True, True, True]
    assert [h[4] for h in history] == [True, False, True, True, True, True]
    # The loss itself was finite (huge), so no NaN step; the reported loss is unscaled.
    assert [h[2] for h in history] == [0] * 6
    assert history[1][5] == pytest.approx(history[0][5] * 1e30, rel=1e-2)
    # Growth after growth_interval=3 clean steps (steps 2, 3, 4), capped at max_scale=2^32.
    assert scales[2:] == [2.0**31, 2.0**31, 2.0**32, 2.0**32]


def test_nan_loss_counts_as_nan_and_skipped():
    params, batch = _data()
    learner, step, opt = _trainer(jnp.float32, DynamicLossScaler.default_config())
    state = learner.init(opt(params))
    new_params, state, loss, summaries = step(params, state, dict(batch, inject=np.float32(np.nan)))
    assert np.isnan(float(loss))
    assert int(summaries["loss_scale/num_nan_steps"]) == 1
    assert int(summaries["loss_scale/num_skipped_steps"]) == 1
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def test_fp16_loss_curve_tracks_fp32():
    """200 full-batch steps of a small MLP: fp16 with default dynamic loss scaling vs fp32.

    The default initial scale 2^32 overflows float16 until it has been halved to 2^18, so the
    first 14 steps are skipped (as in Megatron-style trainers); after that no step is skipped.
    The per-step curves then differ mostly by that 14-step lag; aligned by applied update, the
    fp16 curve matches the fp32 one to ~1e-4 nats.
    """
    params, batch = _data()
    curves, skipped = {}, None
    for name, dtype, scaler in (
        ("fp32", jnp.float32, None),
        ("fp16", jnp.float16, DynamicLossScaler.default_config()),
    ):
        learner, step, opt = _trainer(dtype, scaler)
        p, state, losses, skips = params, learner.init(opt(params)), [], []
        for _ in range(200):
            p, state, loss, summaries = step(p, state, batch)
            losses.append(float(loss))
            skips.append(int(summaries.get("loss_scale/num_skipped_steps", 0)))
        curves[name] = np.array(losses)
        if scaler is not None:
            skipped = np.array(skips)
            final_scale = float(summaries["loss_scale/scale"])
    fp32, fp16 = curves["fp32"], curves["fp16"]
    n_skip = int(skipped[-1])
    # All skips are the initial back-off from 2^32: consecutive, starting at step 0.
    np.testing.assert_array_equal(skipped[:n_skip], np.arange(1, n_skip + 1))
    assert final_scale == 2.0 ** (32 - n_skip) and 5 <= n_skip <= 24
    assert fp32[-1] < fp32[0] - 0.3  # It trains.
    per_step = np.abs(fp16 - fp32).mean()
    aligned = np.abs(fp16[n_skip:] - fp32[: 200 - n_skip]).mean()
    assert per_step < 0.05, per_step
    assert aligned < 1e-3, aligned


def test_loss_scaling_composes_with_gradient_accumulation():
    """Scaled microbatch gradients, unscaled after accumulation == plain full-batch step."""
    from axlearn.common.gradient_accumulation import with_minibatch_steps

    params, batch = _data()
    batch = dict(x=batch["x"][:32], y=batch["y"][:32])
    results = []
    for steps, scaler in (
        (0, None),
        (4, DynamicLossScaler.default_config().set(initial_scale=1024.0)),
    ):
        learner, step, opt = _trainer(jnp.float32, scaler)
        if steps:
            cfg = learner.config.set(
                forward_fn_transformation=config_for_function(with_minibatch_steps).set(steps=steps)
            )
            learner, step, opt = _trainer_from(cfg)
        new_params, _, loss, _ = step(params, learner.init(opt(params)), batch)
        results.append((float(loss), new_params))
    assert results[1][0] == pytest.approx(results[0][0], abs=1e-6)
    for k, v in results[0][1].items():
        np.testing.assert_allclose(results[1][1][k], v, atol=1e-6)
