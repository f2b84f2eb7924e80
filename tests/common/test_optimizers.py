"""Tests of axlearn/common/optimizers: parity with optax, adastar vs NumPy, skipping, sharding."""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
import pytest
from jax import numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common import optimizers, schedule
from axlearn.common.config import config_for_function
from axlearn.common.optimizer_base import OptParam, PartitionedGradientTransformation
from axlearn.common.per_param_settings import collect_per_param_settings
from axlearn.common.utils import TensorSpec, VDict, flatten_items


def _randn(rng: np.random.RandomState, *shape, scale=1.0):
    # NumPy inputs: eager jax.random/jnp ops would each compile a tiny XLA program.
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _params(seed=0, big=False):
    rng = np.random.RandomState(seed)
    params = {
        "w": _randn(rng, 8, 6),
        "b": _randn(rng, 6, scale=0.1),
        "nested": {"v": _randn(rng, 3, 4, 5)},
    }
    if big:  # Factored by Adafactor with min_dim_size_to_factor=12.
        params["big"] = _randn(rng, 16, 24, scale=0.05)
    return params


def _grads(params, i):
    # Deterministic, parameter-dependent gradients so trajectories (not just one step) matter.
    return jax.tree.map(lambda p: jnp.sin(p * (i + 1.0)) + 0.1 * p, params)


def _opt_params(params, wd_scales=None):
    wd_scales = wd_scales or {}
    return {
        k: (
            _opt_params(v, wd_scales.get(k))
            if isinstance(v, dict)
            else OptParam(v, None, wd_scales.get(k))
        )
        for k, v in params.items()
    }


def _trajectory(update_fn, init_state, params, steps=10):
    step = jax.jit(update_fn)
    state, out = init_state, []
    for i in range(steps):
        params, state = step(params, state, i)
        out.append(params)
    return out, state


def _run_ours(tx: PartitionedGradientTransformation, params, steps=10):
    def update(p, s, i):
        u, s = tx.update(_grads(p, i), s, _opt_params(p))
        return optax.apply_updates(p, u), s

    return _trajectory(update, tx.init(_opt_params(params)), params, steps)


def _run_optax(tx: optax.GradientTransformation, params, steps=10):
    def update(p, s, i):
        u, s = tx.update(_grads(p, i), s, p)
        return optax.apply_updates(p, u), s

    return _trajectory(update, tx.init(params), params, steps)


def _max_diff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


WARMUP_COSINE = config_for_function(schedule.cosine_with_linear_warmup).set(
    peak_lr=0.05, max_step=8, warmup_steps=3, alpha=0.1
)


@pytest.mark.parametrize(
    "name,ours,theirs",
    [
        (
            "adam",
            lambda: optimizers.adam_optimizer(0.01, b1=0.9, b2=0.999, eps=1e-8),
            lambda: optax.adam(0.01, b1=0.9, b2=0.999, eps=1e-8),
        ),
        (
            "adam_l2",
            lambda: optimizers.adam_optimizer(
                0.01, b1=0.9, b2=0.99, eps=1e-6, l2_regularizer_weight=0.05
            ),
            lambda: optax.chain(
                optax.add_decayed_weights(0.05), optax.adam(0.01, b1=0.9, b2=0.99, eps=1e-6)
            ),
        ),
        (
            "adamw_schedule",
            lambda: optimizers.adamw_optimizer(
                WARMUP_COSINE, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1
            ),
            # optax's schedules see the 0-based count; ours see the 1-based step.
            lambda: optax.adamw(
                lambda count: schedule.as_schedule_fn(WARMUP_COSINE)(count + 1),
                b1=0.9,
                b2=0.95,
                eps=1e-8,
                weight_decay=0.1,
            ),
        ),
        (
            "adamw_decoupled",
            lambda: optimizers.adamw_decoupled_optimizer(
                0.02, b1=0.9, b2=0.99, eps=1e-8, update_schedule=0.5, weight_decay=0.004
            ),
            # -eta * (alpha * adam + lambda * p) == adamw(lr=alpha * eta, wd=lambda / alpha).
            lambda: optax.adamw(0.01, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.2),
        ),
        (
            "sgd_momentum_coupled_wd",
            lambda: optimizers.sgd_optimizer(
                0.1, decouple_weight_decay=False, momentum=0.9, weight_decay=0.01
            ),
            lambda: optax.chain(optax.add_decayed_weights(0.01), optax.sgd(0.1, momentum=0.9)),
        ),
        (
            "sgd_decoupled_wd",
            lambda: optimizers.sgd_optimizer(
                0.1, decouple_weight_decay=True, momentum=0.5, weight_decay=0.01
            ),
            lambda: optax.chain(
                optax.trace(decay=0.5), optax.add_decayed_weights(0.01), optax.scale(-0.1)
            ),
        ),
        (
            "lion",
            lambda: optimizers.lion_optimizer(0.003, b1=0.9, b2=0.99, weight_decay=0.1),
            lambda: optax.lion(0.003, b1=0.9, b2=0.99, weight_decay=0.1),
        ),
        (
            "adafactor",
            lambda: optimizers.adafactor_optimizer(
                0.01,
                b1=0.9,
                b2=config_for_function(schedule.adafactor_decay_rate).set(c=0.8),
                multiply_by_parameter_scale=True,
                clipping_threshold=1.0,
                weight_decay=0.001,
                weight_decay_scale_by_learning_rate_exponent=0.0,
                min_dim_size_to_factor=12,
            ),
            lambda: optax.adafactor(
                0.01,
                decay_rate=0.8,
                multiply_by_parameter_scale=True,
                clipping_threshold=1.0,
                momentum=0.9,
                weight_decay_rate=0.001,
                min_dim_size_to_factor=12,
            ),
        ),
    ],
)
def test_parity_with_optax(name, ours, theirs):
    params = _params(big=name == "adafactor")
    ours_traj, _ = _run_ours(ours(), params)
    theirs_traj, _ = _run_optax(theirs(), params)
    for step, (a, b) in enumerate(zip(ours_traj, theirs_traj)):
        assert _max_diff(a, b) <= 1e-6, (name, step, _max_diff(a, b))
    # The parameters moved (the comparison is not vacuous).
    assert _max_diff(ours_traj[-1], params) > 1e-3


def test_adafactor_factors_and_partitions_like_optax():
    params = _params(big=True)
    tx = optimizers.adafactor_optimizer(
        0.01,
        b1=None,
        b2=config_for_function(schedule.adafactor_decay_rate),
        multiply_by_parameter_scale=False,
        clipping_threshold=None,
        min_dim_size_to_factor=12,
    )
    state = tx.init(_opt_params(params))
    specs = tx.partition(jax.tree.map(lambda p: TensorSpec(p.shape, p.dtype, None), params))
    factored = state[0]
    # Like optax: v_row drops the largest axis, v_col the second largest.
    assert factored.v_row["big"].shape == (16,) and factored.v_col["big"].shape == (24,)
    assert factored.v["big"].shape == (1,) and factored.v["w"].shape == (8, 6)
    leaves = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, TensorSpec))
    assert [tuple(s.shape) for s in leaves] == [x.shape for x in jax.tree.leaves(state)]


# ------------------------------------------------------------------------------------------
# Adastar vs a NumPy reference.
# ------------------------------------------------------------------------------------------


def _adastar_numpy(
    params,
    grads_fn,
    *,
    steps,
    lr,
    ge,
    ge_debias,
    gs,
    gs_debias,
    eps,
    eps_sq,
    clip,
    ue,
    ue_debias,
    wd,
    sched,
    update_scales,
    stacked,
):
    """Hand-written adastar in float64 NumPy. `stacked`: params whose axis 0 is a layer axis."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    u = {k: np.zeros_like(x) for k, x in p.items()}
    out = []
    for i in range(steps):
        t = i + 1
        g = {k: np.asarray(x, np.float64) for k, x in grads_fn(p, i).items()}
        new_p = {}
        for k in p:
            if ge is None:
                g_hat = g[k]
            else:
                m[k] = ge * m[k] + (1 - ge) * g[k]
                g_hat = m[k] / (1 - ge**t) if ge_debias else m[k]
            v[k] = gs * v[k] + (1 - gs) * (g[k] ** 2 + eps_sq)
            v_hat = v[k] / (1 - gs**t) if gs_debias else v[k]
            raw = g_hat / (np.sqrt(v_hat) + eps)
            if clip is not None:
                if k in stacked:
                    rms = np.sqrt(np.mean(raw**2, axis=tuple(range(1, raw.ndim)), keepdims=True))
                else:
                    rms = np.sqrt(np.mean(raw**2))
                raw = raw / np.maximum(1.0, rms / clip)
            if ue is None:
                smoothed = raw
            else:
                u[k] = ue * u[k] + (1 - ue) * raw
                smoothed = u[k] / (1 - ue**t) if ue_debias else u[k]
            smoothed = smoothed * update_scales.get(k, 1.0)
            new_p[k] = p[k] - sched(t) * (lr * smoothed + wd * p[k])  # 1-based step t.
        p = new_p
        out.append(p)
    return out


@pytest.mark.parametrize("variant", ["honeycrisp", "adamw_like"])
def test_adastar_matches_numpy(variant):
    rng = np.random.RandomState(3)
    params = {
        "w": _randn(rng, 8, 6),
        "o_proj": _randn(rng, 6, 4, scale=0.5),
        "layers": _randn(rng, 3, 4, 5),
    }
    cosine = config_for_function(schedule.cosine_with_linear_warmup).set(
        peak_lr=1.0, max_step=12, warmup_steps=3, begin_value=0.0, alpha=0.005
    )
    if variant == "honeycrisp":
        kw = dict(
            learning_rate=0.01,
            gradient_ema_decay=None,
            gradient_ema_debias=None,
            gradient_square_ema_decay=0.95,
            gradient_square_ema_debias=True,
            eps=0,
            eps_square=1e-30,
            raw_update_clipping_threshold=1.0,
            update_ema_decay=0.95,
            update_ema_debias=False,
            weight_decay=0.000316,
            update_schedule=cosine,
        )
        tx_kw = dict(
            adam_update_transformation=config_for_function(optimizers.scale_update_per_param).set(
                per_param_scale=config_for_function(optimizers.per_param_scale_by_path).set(
                    description="scale_by_mup_simple", scale_by_path=[(".*o_proj", 0.25)]
                )
            )
        )
        update_scales = {"o_proj": 0.25}
        sched = schedule.as_schedule_fn(cosine)
    else:
        kw = dict(
            learning_rate=0.02,
            gradient_ema_decay=0.9,
            gradient_ema_debias=True,
            gradient_square_ema_decay=0.99,
            gradient_square_ema_debias=True,
            eps=1e-8,
            eps_square=0.0,
            raw_update_clipping_threshold=0.3,
            update_ema_decay=None,
            update_ema_debias=False,
            weight_decay=0.01,
            update_schedule=0.5,
        )
        tx_kw, update_scales, sched = {}, {}, lambda step: 0.5
    tx = optimizers.adastar_optimizer(**kw, **tx_kw)

    # The stacked "layers" parameter sits under a VDict: clipping is per layer.
    def to_tree(p):
        return {"w": p["w"], "o_proj": p["o_proj"], "rep": VDict(layers=p["layers"])}

    def from_tree(t):
        return {"w": t["w"], "o_proj": t["o_proj"], "layers": t["rep"]["layers"]}

    def grads_fn(p, i):
        return {
            name: np.sin(np.asarray(x) * (i + 1.0)) + 0.1 * np.asarray(x) for name, x in p.items()
        }

    def update(tree, state, i):
        g = to_tree(jax.tree.map(lambda x: jnp.sin(x * (i + 1.0)) + 0.1 * x, from_tree(tree)))
        opt = jax.tree.map(lambda x: OptParam(x, None, None), tree)
        u, state = tx.update(g, state, opt)
        return optax.apply_updates(tree, u), state

    tree = to_tree(params)
    traj, _ = _trajectory(
        update, tx.init(jax.tree.map(lambda x: OptParam(x, None, None), tree)), tree
    )
    ref = _adastar_numpy(
        {k: np.asarray(v) for k, v in params.items()},
        grads_fn,
        steps=10,
        sched=lambda step: float(sched(step)),
        update_scales=update_scales,
        stacked={"layers"},
        lr=kw["learning_rate"],
        ge=kw["gradient_ema_decay"],
        ge_debias=kw["gradient_ema_debias"],
        gs=kw["gradient_square_ema_decay"],
        gs_debias=kw["gradient_square_ema_debias"],
        eps=kw["eps"],
        eps_sq=kw["eps_square"],
        clip=kw["raw_update_clipping_threshold"],
        ue=kw["update_ema_decay"],
        ue_debias=kw["update_ema_debias"],
        wd=kw["weight_decay"],
    )
    for step, (ours, theirs) in enumerate(zip(traj, ref)):
        ours = from_tree(ours)
        for name in theirs:
            np.testing.assert_allclose(
                np.asarray(ours[name]), theirs[name], rtol=2e-5, atol=2e-6, err_msg=f"{name}@{step}"
            )
    assert np.abs(np.asarray(from_tree(traj[-1])["w"]) - np.asarray(params["w"])).max() > 1e-3


# ------------------------------------------------------------------------------------------
# Clipping and skipping.
# ------------------------------------------------------------------------------------------


def test_skip_and_clip_by_global_norm():
    params = {"a": np.ones((3,), np.float32), "b": np.ones((2, 2), np.float32)}
    tx = optimizers.skip_and_clip_by_global_norm(
        inner=config_for_function(optimizers.sgd_optimizer).set(
            learning_rate=1.0, decouple_weight_decay=True, momentum=0.9
        ),
        drop_norm=100,
        max_norm=1,
    )
    opt = _opt_params(params)
    update = jax.jit(lambda g, s: tx.update(g, s, opt))
    state = tx.init(opt)

    # A normal step: gradients of norm 5 are clipped to norm 1 before the inner optimizer.
    f32 = lambda x: np.asarray(x, np.float32)
    g = {"a": f32([3.0, 0.0, 0.0]), "b": f32([[4.0, 0.0], [0.0, 0.0]])}
    u, state = update(g, state)
    assert float(np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(u)))) == pytest.approx(
        1.0, abs=1e-6
    )
    np.testing.assert_allclose(u["a"], [-0.6, 0, 0], atol=1e-6)
    assert int(state.nonvalid_count) == 0

    # Huge and NaN gradients: zero updates, inner state unchanged, nonvalid_count counts them.
    for i, bad in enumerate(
        [
            {"a": f32([1000.0, 0, 0]), "b": f32(np.ones((2, 2)))},
            {"a": f32([np.nan, 0.0, 0.0]), "b": f32(np.ones((2, 2)))},
            {"a": f32([np.inf, 0.0, 0.0]), "b": f32(np.ones((2, 2)))},
        ]
    ):
        u_bad, new_state = update(bad, state)
        assert all(float(np.max(np.abs(x))) == 0 for x in jax.tree.leaves(u_bad))
        for x, y in zip(jax.tree.leaves(new_state.inner_state), jax.tree.leaves(state.inner_state)):
            np.testing.assert_array_equal(x, y)
        assert int(new_state.nonvalid_count) == i + 1
        state = new_state

    # A normal step afterwards moves the momentum again.
    u, new_state = update(g, state)
    assert int(new_state.nonvalid_count) == 3
    assert _max_diff(new_state.inner_state, state.inner_state) > 0.1


def test_skip_and_clip_adaptive_drop_norm():
    params = {"a": np.ones((4,), np.float32)}
    tx = optimizers.skip_and_clip_by_global_norm(
        inner=optimizers.sgd_optimizer(1.0, decouple_weight_decay=True),
        drop_norm=config_for_function(optimizers.drop_norm_by_grad_norm_ema).set(multipliers=(5,)),
        grad_norm_ema_decay=0.99,
    )
    opt = _opt_params(params)
    state = tx.init(opt)
    update = jax.jit(lambda g, s: tx.update(g, s, opt))
    for _ in range(5):
        _, state = update({"a": np.ones((4,), np.float32)}, state)  # norm 2
    assert float(state.grad_norm_ema) == pytest.approx(2.0, rel=1e-5)
    u, state = update({"a": np.full((4,), 10.0, np.float32)}, state)  # norm 20 > 5 * 2
    assert float(np.abs(u["a"]).max()) == 0.0
    assert int(state.nonvalid_count) == 1 and int(state.drop_stats["5x_mean"]) == 1


def test_clip_by_global_norm():
    tx = optimizers.clip_by_global_norm(2.0, drop_norm=50.0)
    update = jax.jit(lambda g: tx.update(g, tx.init(None), None)[0])
    u = update({"a": np.asarray([6.0, 8.0], np.float32)})
    np.testing.assert_allclose(u["a"], [1.2, 1.6], rtol=1e-6)
    u = update({"a": np.asarray([60.0, 80.0], np.float32)})
    np.testing.assert_array_equal(u["a"], [0.0, 0.0])


# ------------------------------------------------------------------------------------------
# Per-parameter scales and weight decay.
# ------------------------------------------------------------------------------------------


def test_per_param_scale_by_path_and_scale_update():
    params = _opt_params(_params())
    fn = optimizers.per_param_scale_by_path(
        scale_by_path=[("nested/.*", 0.5), (".*", 2.0), ("w", 9.0)][:2], description="test"
    )
    assert fn(params) == {"w": 2.0, "b": 2.0, "nested": {"v": 0.5}}
    tx = optimizers.scale_update_per_param(
        config_for_function(optimizers.per_param_scale_by_path).set(
            scale_by_path=[("w", 0.0), ("nested/v", 3.0)], description="d", default_scale=0.5
        )
    )
    g = jax.tree.map(np.ones_like, _params())
    with collect_per_param_settings() as records:
        u, _ = tx.update(g, tx.init(params), params)
    assert float(u["w"].max()) == 0.0 and float(u["b"].max()) == 0.5
    assert float(u["nested"]["v"].max()) == 3.0
    assert records[0]["description"] == "update_scale"
    assert records[0]["settings"] == {"w": 0.0, "b": 0.5, "nested": {"v": 3.0}}


def test_per_param_scale_by_path_unmatched_rule_is_an_error():
    fn = optimizers.per_param_scale_by_path(
        scale_by_path=[("w", 1.0), (".*feed_forward/wi_0_weight", 0.25)], description="mup"
    )
    with pytest.raises(ValueError, match=r"rule scale_by_path\[1\] '.\*feed_forward/wi_0_weight'"):
        fn(_opt_params(_params()))


def test_per_param_scale_by_path_alternative_layout_rule_is_skipped():
    # Rules for two layouts of one layer (as the reference 3B config has): the unmatched one is
    # skipped because a rule of the same layer matched; a rule of another layer still fails.
    params = {"ff": {"linear1_0": {"weight": np.ones((2, 2), np.float32)}}, "b": np.ones(2)}
    fn = optimizers.per_param_scale_by_path(
        scale_by_path=[(".*ff/linear1_0/weight", 0.25), (".*ff/wi_0_weight", 0.5)],
        description="mup",
    )
    scales = fn(_opt_params(params))
    assert scales == {"ff": {"linear1_0": {"weight": 0.25}}, "b": 1.0}
    # The other way round: an MoE layer's rule matched, the dense layout's nested rule is skipped.
    moe = {"ff": {"wi_0_weight": np.ones((2, 2, 2), np.float32)}, "b": np.ones(2)}
    assert fn(_opt_params(moe)) == {"ff": {"wi_0_weight": 0.5}, "b": 1.0}
    bad = optimizers.per_param_scale_by_path(
        scale_by_path=[(".*ff/linear1_0/weight", 0.25), (".*attn/wo_weight", 0.5)],
        description="mup",
    )
    with pytest.raises(ValueError, match=r"rule scale_by_path\[1\] '.\*attn/wo_weight'"):
        bad(_opt_params(params))


def test_add_decayed_weights_per_param_and_regularizer_text():
    params = _params()
    opt = _opt_params(params, wd_scales={"nested": {"v": 0.5}})
    per_param = config_for_function(optimizers.per_param_scale_by_path).set(
        scale_by_path=[("b", 0.0)], description="weight_decay_scale"
    )
    tx = optimizers.add_decayed_weights(0.1, per_param_scale=per_param)
    g = jax.tree.map(np.zeros_like, params)
    u, _ = tx.update(g, tx.init(opt), opt)
    np.testing.assert_allclose(u["w"], 0.1 * params["w"], rtol=1e-6)
    np.testing.assert_array_equal(u["b"], 0.0)
    # ParameterSpec.weight_decay_scale (OptParam.weight_decay_scale) takes precedence.
    np.testing.assert_allclose(u["nested"]["v"], 0.05 * params["nested"]["v"], rtol=1e-6)

    specs = jax.tree.map(lambda p: TensorSpec(p.shape, p.dtype, None), params)
    specs["nested"]["v"].weight_decay_scale = 0.5  # As a ParameterSpec would carry it.
    optimizer = config_for_function(optimizers.adamw_optimizer).set(
        learning_rate=0.1,
        b1=0.9,
        b2=0.99,
        eps=1e-8,
        weight_decay=0.01,
        weight_decay_per_param_scale=per_param,
    )
    assert optimizers.regularizer_text(optimizer, specs) == "b: 0.0\nnested/v: 0.5\nw: 1.0"


def test_param_ema():
    params = _params()
    tx = optimizers.param_ema(decay=0.9)
    opt = _opt_params(params)
    state = tx.init(opt)
    ema = jax.tree.map(np.zeros_like, params)
    update = jax.jit(lambda s, p: tx.update({}, s, _opt_params(p))[1])
    for i in range(3):
        p = jax.tree.map(lambda x, i=i: x * (i + 1), params)
        state = update(state, p)
        ema = jax.tree.map(lambda e, x: 0.1 * x + 0.9 * e, ema, p)
    assert _max_diff(state.ema, ema) < 1e-6 and int(state.count) == 3
    assert optimizers.param_ema(decay=None).init(opt) == optax.EmptyState()


def test_dumped_names_are_the_public_module():
    for fn in (
        optimizers.skip_and_clip_by_global_norm,
        optimizers.adastar_optimizer,
        optimizers.scale_update_per_param,
        optimizers.per_param_scale_by_path,
        optimizers.param_ema,
        optimizers.adamw_optimizer,
    ):
        cfg = config_for_function(fn)
        assert f"fn: 'axlearn.common.optimizers.{fn.__name__}'" in cfg.debug_string()


# ------------------------------------------------------------------------------------------
# Optimizer state sharded like the parameters (8 CPU devices).
# ------------------------------------------------------------------------------------------


def _sharding_params():
    rng = np.random.RandomState(0)
    values = {
        "emb": _randn(rng, 16, 8),
        "w": _randn(rng, 8, 16),
        "b": np.zeros((16,), np.float32),
        "big": _randn(rng, 16, 32, scale=0.02),
        "rep": VDict(layer=_randn(rng, 2, 8, 16)),
    }
    axes = {
        "emb": PartitionSpec("model", None),
        "w": PartitionSpec("data", "model"),
        "b": PartitionSpec("model"),
        "big": PartitionSpec("data", "model"),
        "rep": VDict(layer=PartitionSpec(None, "data", "model")),
    }
    specs = jax.tree.map(
        lambda v, a: TensorSpec(shape=v.shape, dtype=v.dtype, mesh_axes=a),
        values,
        axes,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )
    return values, specs


ADASTAR_IN_SKIP_CLIP = config_for_function(optimizers.skip_and_clip_by_global_norm).set(
    inner=config_for_function(optimizers.adastar_optimizer).set(
        learning_rate=0.01,
        gradient_ema_decay=0.9,
        gradient_ema_debias=True,
        gradient_square_ema_decay=0.95,
        gradient_square_ema_debias=True,
        eps=0,
        eps_square=1e-30,
        raw_update_clipping_threshold=1.0,
        update_ema_decay=0.95,
        update_ema_debias=False,
        weight_decay=3e-4,
        update_schedule=1.0,
    ),
    drop_norm=100,
    max_norm=1,
)


SHARDING_CASES = {
    "adamw_and_param_ema": lambda: optimizers.chain(
        optimizers.adamw_optimizer(0.1, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1),
        optimizers.param_ema(decay=0.99),
    ),
    "adastar_in_skip_and_clip": lambda: ADASTAR_IN_SKIP_CLIP.instantiate(),
    "adafactor_factored": lambda: optimizers.adafactor_optimizer(
        0.1,
        b1=0.9,
        b2=0.99,
        multiply_by_parameter_scale=False,
        clipping_threshold=None,
        weight_decay=1e-3,
        weight_decay_scale_by_learning_rate_exponent=1.0,
        min_dim_size_to_factor=12,
    ),
}


def _contains_path(state_path: str, param_path: str) -> bool:
    """Whether the components of `param_path` appear contiguously in `state_path`."""
    a, b = state_path.split("/"), param_path.split("/")
    return any(a[i : i + len(b)] == b for i in range(len(a) - len(b) + 1))


@pytest.mark.parametrize("name", sorted(SHARDING_CASES))
def test_state_sharded_like_params(name):
    assert len(jax.devices()) == 8
    tx = SHARDING_CASES[name]()
    values, specs = _sharding_params()
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    is_spec = lambda x: isinstance(x, TensorSpec)
    param_shardings = jax.tree.map(
        lambda s: NamedSharding(mesh, s.mesh_axes), specs, is_leaf=is_spec
    )
    state_specs = tx.partition(specs)
    state_shardings = jax.tree.map(
        lambda s: NamedSharding(mesh, PartitionSpec(*(s.mesh_axes or ()))),
        state_specs,
        is_leaf=is_spec,
    )
    values = jax.device_put(values, param_shardings)
    opt = lambda v: jax.tree.map(lambda x: OptParam(x, None, None), v)
    state = jax.jit(lambda v: tx.init(opt(v)), out_shardings=state_shardings)(values)
    # The specs describe the state exactly: same structure, shapes and dtypes.
    assert jax.tree.structure(state) == jax.tree.structure(state_specs, is_leaf=is_spec)
    for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(state_specs, is_leaf=is_spec)):
        assert tuple(x.shape) == tuple(s.shape) and x.dtype == jnp.dtype(s.dtype)
    # Every state leaf that mirrors a parameter (its path inside the state path, same shape) is
    # sharded like that parameter; every parameter has such leaves.
    param_items = flatten_items(values)
    mirrored = {path: 0 for path, _ in param_items}
    for state_path, x in flatten_items(state):
        for path, p in param_items:
            if _contains_path(state_path, path) and x.shape == p.shape:
                assert x.sharding.is_equivalent_to(p.sharding, p.ndim), (state_path, x.sharding)
                mirrored[path] += 1
    assert all(n > 0 for n in mirrored.values()), mirrored
    if name == "adastar_in_skip_and_clip":
        # A jitted update keeps the state's shardings.
        grads = jax.tree.map(lambda x: x * 0.01, values)
        step = jax.jit(lambda v, s, g: tx.update(g, s, opt(v))[1], out_shardings=state_shardings)
        new_state = step(values, state, grads)
        for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(state)):
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim)


def test_factored_state_drops_the_factored_axis_from_mesh_axes():
    _, specs = _sharding_params()
    tx = optimizers.scale_by_factored_rms(decay_rate=0.99, min_dim_size_to_factor=12)
    part = tx.partition(specs)
    # big: [16, 32]: v_row drops the largest axis (1), v_col the second largest (0).
    assert part.v_row["big"].mesh_axes == PartitionSpec("data")
    assert part.v_col["big"].mesh_axes == PartitionSpec("model")
    assert math.prod(part.v["big"].shape) == 1


def test_rms_norm_and_covariance_helpers():
    from axlearn.common.optimizers import _compute_covariance, _compute_rms_norms

    p = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    u = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    rms = _compute_rms_norms(dict(w=jnp.asarray(p)))
    cov = _compute_covariance(dict(w=jnp.asarray(p)), dict(w=jnp.asarray(u)))
    np.testing.assert_allclose(rms["w"], np.sqrt((p**2).mean(-1)), rtol=1e-6)
    np.testing.assert_allclose(cov["w"], (p * u).mean(-1), rtol=1e-5, atol=1e-7)
