"""Tests of AXLearn's step convention and state layouts in axlearn/common/optimizers.

Every transformation that evaluates a schedule passes it the 1-based update step (the state's
count + 1), as AXLearn does, so a linear warm-up of 100 steps to 1.0 gives learning rate 0.01 at
the first update. The expected values below are computed by hand / with NumPy.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from jax import numpy as jnp

from axlearn.common import optimizers, schedule
from axlearn.common.config import config_for_function
from axlearn.common.optimizer_base import OptParam, OptStateSpec

WARMUP_100 = config_for_function(schedule.constant_with_linear_warmup).set(
    peak_lr=1.0, warmup_steps=100
)


def _opt(params):
    return jax.tree.map(lambda x: OptParam(x, None, None), params)


def _run(tx, params, grads_list):
    opt = _opt(params)
    state = tx.init(opt)
    outs = []
    for g in grads_list:
        u, state = tx.update(g, state, opt)
        outs.append(u)
    return outs, state


def test_sgd_first_update_sees_step_1():
    params = {"w": np.zeros((3,), np.float32)}
    g = {"w": np.ones((3,), np.float32)}
    tx = optimizers.sgd_optimizer(WARMUP_100, decouple_weight_decay=True)
    outs, state = _run(tx, params, [g, g, g])
    # Updates are -lr(step) * g with lr(step) = step / 100 for steps 1, 2, 3.
    for step, u in enumerate(outs, start=1):
        np.testing.assert_allclose(u["w"], -step / 100 * np.ones(3), rtol=1e-6)
    # The state's count is the number of updates done.
    assert int(state[-1].count) == 3


def test_adam_bias_correction_and_schedule_share_the_count():
    """Adam's bias correction uses t = 1 at the first update, as the schedule does."""
    b1, b2, eps = 0.9, 0.99, 1e-12
    params = {"w": np.zeros((2,), np.float32)}
    grads = [{"w": np.asarray([0.5, -2.0], np.float32)}, {"w": np.asarray([1.5, 1.0], np.float32)}]
    tx = optimizers.adamw_optimizer(WARMUP_100, b1=b1, b2=b2, eps=eps)
    outs, state = _run(tx, params, grads)
    m = v = np.zeros(2)
    for t, (g, u) in enumerate(zip(grads, outs), start=1):
        g = np.asarray(g["w"], np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        want = -(t / 100) * m_hat / (np.sqrt(v_hat) + eps)
        np.testing.assert_allclose(u["w"], want, rtol=1e-5)
    adam_state, _, sched_state = state
    assert int(adam_state.count) == 2 and int(sched_state.count) == 2


def test_param_ema_uses_the_1_based_step():
    """With ema_schedule the decay at step t is t / (1 + t): 1/2 at the first update."""
    tx = optimizers.param_ema(decay=schedule.ema_schedule(0.9, warmup_steps=10))
    params = [{"w": np.full((2,), x, np.float32)} for x in (4.0, 8.0, 2.0)]
    state = tx.init(_opt(params[0]))
    ema = np.zeros(2)
    for t, p in enumerate(params, start=1):
        _, state = tx.update({"w": np.zeros(2, np.float32)}, state, _opt(p))
        decay = t / (1 + t)
        ema = (1 - decay) * p["w"] + decay * ema
        np.testing.assert_allclose(state.ema["w"], ema, rtol=1e-6)
    assert int(state.count) == 3


def test_param_ema_copies_non_float_params():
    tx = optimizers.param_ema(decay=0.5)
    params = {"step": np.asarray(7, np.int32), "w": np.ones((2,), np.float32)}
    state = tx.init(_opt(params))
    _, state = tx.update(jax.tree.map(np.zeros_like, params), state, _opt(params))
    assert int(state.ema["step"]) == 7
    np.testing.assert_allclose(state.ema["w"], [0.5, 0.5])


def test_ema_debiased_with_constant_decay_and_state_fields():
    tx = optimizers.ema(0.9, debias=True)
    params = {"w": np.zeros((3, 2), np.float32), "s": np.zeros((), np.float32)}
    state = tx.init(_opt(params))
    assert state._fields == ("count", "ema", "scale")
    assert state.scale["w"].shape == (1,) and state.ema["w"].dtype == jnp.float32
    g1 = {"w": np.full((3, 2), 2.0, np.float32), "s": np.float32(1.0)}
    u, state = tx.update(g1, state, None)
    # Debiased at t=1: ema_1 / (1 - 0.9) = g.
    np.testing.assert_allclose(u["w"], g1["w"], rtol=1e-6)
    spec = tx.partition(
        {"w": OptStateSpec(shape=[3, 2], dtype=jnp.float32, mesh_axes=("data", None))}
    )
    assert tuple(spec.scale["w"].shape) == (1,)


def test_ema_int8_accumulator_quantizes_per_slice():
    tx = optimizers.ema(0.5, debias=False, accumulator_dtype=jnp.int8)
    params = {"w": np.zeros((2, 3), np.float32)}
    state = tx.init(_opt(params))
    assert state.ema["w"].dtype == jnp.int8 and state.scale["w"].shape == (3,)
    g = np.asarray([[1.0, -4.0, 0.0], [-2.0, 2.0, 0.0]], np.float32)
    u, state = tx.update({"w": g}, state, None)
    np.testing.assert_allclose(u["w"], 0.5 * g)
    qstep = np.abs(0.5 * g).max(axis=0) / 127
    np.testing.assert_allclose(state.scale["w"], qstep, rtol=1e-6)
    dequantized = np.asarray(state.ema["w"], np.float32) * qstep
    np.testing.assert_allclose(dequantized, 0.5 * g, atol=qstep.max() / 2 + 1e-7)
    with pytest.raises(ValueError, match="accumulator_dtype must be one of"):
        optimizers.ema(0.5, accumulator_dtype=jnp.float16)


def test_skip_clip_state_tracks_mean_square_of_norms():
    tx = optimizers.skip_and_clip_by_global_norm(
        inner=optimizers.sgd_optimizer(0.1, decouple_weight_decay=True),
        drop_norm=config_for_function(optimizers.drop_norm_by_grad_norm_stddev).set(
            min_count=100, multipliers=(3,)
        ),
        grad_norm_ema_decay=0.9,
    )
    params = {"a": np.zeros((1,), np.float32)}
    norms = [2.0, 4.0, 3.0]
    outs, state = _run(tx, params, [{"a": np.asarray([n], np.float32)} for n in norms])
    assert "grad_norm_square_ema" in state._fields and "grad_norm_var_ema" not in state._fields
    # Bias-corrected EMAs of the norm and its square (the first update replaces the initial 1s).
    weights = [0.9**2, 0.9, 1.0]
    mean = sum(w * n for w, n in zip(weights, norms)) / sum(weights)
    square = sum(w * n * n for w, n in zip(weights, norms)) / sum(weights)
    assert float(state.grad_norm_ema) == pytest.approx(mean, rel=1e-5)
    assert float(state.grad_norm_square_ema) == pytest.approx(square, rel=1e-5)
    assert int(state.count) == 3


def test_adaptive_drop_norm_requires_grad_norm_ema_decay():
    with pytest.raises(ValueError, match=r"grad_norm_ema_decay must be set \(e.g. 0.99\)"):
        optimizers.skip_and_clip_by_global_norm(
            inner=optimizers.sgd_optimizer(0.1, decouple_weight_decay=True),
            drop_norm=config_for_function(optimizers.drop_norm_by_grad_norm_ema),
        )


def test_adafactor_decay_matches_optax_with_1_based_steps():
    """scale_by_factored_rms with adafactor_decay_rate equals optax's default decay."""
    params = {"w": np.ones((4, 3), np.float32)}
    grads = [{"w": np.full((4, 3), float(i + 1), np.float32)} for i in range(3)]
    ours = optimizers.scale_by_factored_rms(
        decay_rate=config_for_function(schedule.adafactor_decay_rate)
    )
    ref = optax.scale_by_factored_rms()
    opt = _opt(params)
    s1, s2 = ours.init(opt), ref.init(params)
    for g in grads:
        u1, s1 = ours.update(g, s1, opt)
        u2, s2 = ref.update(g, s2, params)
        np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-6)


def test_scale_by_trust_ratio_matches_optax_and_adafactor_flag():
    params = {"w": np.asarray([3.0, 4.0], np.float32), "z": np.zeros((2,), np.float32)}
    g = {"w": np.asarray([0.6, 0.8], np.float32), "z": np.asarray([1.0, 0.0], np.float32)}
    ours = optimizers.scale_by_trust_ratio(eps=1e-6)
    u, _ = ours.update(g, ours.init(_opt(params)), _opt(params))
    ref = optax.scale_by_trust_ratio(eps=1e-6)
    want, _ = ref.update(g, ref.init(params), params)
    np.testing.assert_allclose(u["w"], want["w"], rtol=1e-6)  # |p| / |g| = 5.
    np.testing.assert_allclose(u["z"], g["z"])  # Zero param norm: ratio 1.
    tx = optimizers.adafactor_optimizer(
        0.1,
        b1=None,
        b2=0.99,
        multiply_by_parameter_scale=False,
        clipping_threshold=None,
        apply_scale_by_trust_ratio=True,
    )
    u, _ = tx.update({"w": g["w"]}, tx.init(_opt({"w": params["w"]})), _opt({"w": params["w"]}))
    # The trust ratio rescales the update to the parameter norm: |u| = |p| = 5.
    assert float(np.linalg.norm(u["w"])) == pytest.approx(5.0, rel=1e-4)


def test_per_param_scale_by_rms():
    fn = optimizers.per_param_scale_by_rms(min_scale=0.5)
    scales = fn(_opt({"a": np.full((4,), 2.0, np.float32), "b": np.zeros((2,), np.float32)}))
    assert float(scales["a"]) == pytest.approx(2.0) and float(scales["b"]) == pytest.approx(0.5)


def test_offload_optimizer_matches_wrapped_and_places_states_on_host():
    import re

    from jax.sharding import PartitionSpec

    from axlearn.common.trainer_utils import shardings_of_specs

    params = {"w": np.ones((4, 2), np.float32), "b": np.zeros((2,), np.float32)}
    base = optimizers.adamw_optimizer(0.1, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.01)
    off = optimizers.offload_optimizer(base, pattern=".*/mu/.*")
    specs = {
        "w": OptStateSpec(shape=[4, 2], dtype=jnp.float32, mesh_axes=PartitionSpec(None, None)),
        "b": OptStateSpec(shape=[2], dtype=jnp.float32, mesh_axes=PartitionSpec(None)),
    }
    part = off.partition(specs)
    adam_spec = part[0]
    assert adam_spec.mu["w"].memory_kind == "pinned_host"
    assert adam_spec.nu["w"].memory_kind is None and adam_spec.count.memory_kind is None
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    shardings = shardings_of_specs(mesh, part)
    opt = _opt(params)
    state = jax.jit(lambda: off.init(opt), out_shardings=shardings)()
    assert state[0].mu["w"].sharding.memory_kind == "pinned_host"
    ref_state = base.init(opt)
    step = jax.jit(lambda g, s: off.update(g, s, opt), out_shardings=(None, shardings))
    g = {"w": np.full((4, 2), 0.5, np.float32), "b": np.ones((2,), np.float32)}
    for _ in range(2):
        u, state = step(g, state)
        ref_u, ref_state = base.update(g, ref_state, opt)
        for k in g:
            np.testing.assert_allclose(u[k], ref_u[k], rtol=1e-6)
    assert state[0].mu["w"].sharding.memory_kind == "pinned_host"
    np.testing.assert_allclose(state[0].mu["w"], ref_state[0].mu["w"], rtol=1e-6)
    assert re.fullmatch(".*/mu/.*", "0/mu/w")
    with pytest.raises(ValueError, match="cannot be None"):
        optimizers.offload_optimizer(base, offload_dst=None)


def test_weight_decay_learning_rate_exponent_sees_step_1():
    """add_decayed_weights scales the decay by learning_rate(k) ** exponent at the k-th update."""
    params = {"w": np.asarray([1.0, -2.0], np.float32)}
    zero = {"w": np.zeros((2,), np.float32)}
    tx = optimizers.add_decayed_weights(0.1, learning_rate_exponent=2.0, learning_rate=WARMUP_100)
    outs, state = _run(tx, params, [zero, zero, zero])
    # Update k is 0.1 * (k / 100) ** 2 * w: 1e-5, 4e-5 and 9e-5 times w (not 0 at the first).
    for k, u in enumerate(outs, start=1):
        np.testing.assert_allclose(
            u["w"], 0.1 * (k / 100) ** 2 * np.asarray([1.0, -2.0]), rtol=1e-6
        )
    assert int(state.count) == 3
    # In adafactor (exponent 1; the decay is added after the learning-rate scaling, which it does
    # not go through), the first update with zero gradients is -1e-3 * lr(1) * w, where
    # lr(0) = 0 would have given no decay at all.
    adafactor = optimizers.adafactor_optimizer(
        WARMUP_100,
        b1=None,
        b2=0.99,
        multiply_by_parameter_scale=False,
        clipping_threshold=None,
        weight_decay=1e-3,
        weight_decay_scale_by_learning_rate_exponent=1.0,
    )
    (u,), _ = _run(adafactor, params, [zero])
    np.testing.assert_allclose(u["w"], -1e-3 * 0.01 * np.asarray([1.0, -2.0]), rtol=1e-5)
