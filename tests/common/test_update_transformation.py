"""Tests of axlearn/common/update_transformation.py and `Learner.update` with `Updates`."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest
from jax import numpy as jnp

from axlearn.common import learner as learner_lib
from axlearn.common import optimizers
from axlearn.common.config import config_class, config_for_function
from axlearn.common.module import functional as F
from axlearn.common.module import new_output_collection
from axlearn.common.update_transformation import (
    ConditionalUpdateTransformation,
    ForwardPass,
    Updates,
    UpdateTransformation,
    WrappedPartitionedGradientTransformation,
)
from axlearn.common.utils import TensorSpec
from tests.common.learner_test_utils import forward_and_backward_step, opt_params


def _params(seed=0):
    rng = np.random.RandomState(seed)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal((3,)).astype(np.float32),
        "stats": {"mean": np.zeros((3,), np.float32)},
    }


def _batch():
    rng = np.random.RandomState(1)
    return {
        "x": rng.standard_normal((8, 4)).astype(np.float32),
        "y": rng.standard_normal((8, 3)).astype(np.float32),
    }


def _loss_fn(*, model_params, inputs):
    batch = inputs["input_batch"]
    pred = batch["x"] @ model_params["w"] + model_params["b"]
    collection = new_output_collection()
    # A forward-pass state update (like batch-norm moving statistics).
    collection.state_updates["stats"] = {"mean": jnp.mean(pred, axis=0)}
    loss = jnp.mean((pred - batch["y"]) ** 2)
    return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=collection)


def _adamw():
    return config_for_function(optimizers.adamw_optimizer).set(
        learning_rate=0.1, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.01
    )


def _run(learner, params, steps=3):
    state = learner.init(opt_params(params))
    step = forward_and_backward_step(learner, _loss_fn)
    history = []
    for _ in range(steps):
        out, coll = step(params, state, _batch())
        new_params, state, summaries = (
            out.backward_outputs.updated_params,
            coll.state_updates,
            coll.summaries,
        )
        history.append((params, new_params))
        params = new_params
    return params, state, summaries, history


def _learner(optimizer):
    return learner_lib.Learner.default_config().set(name="learner", optimizer=optimizer)


def test_wrapped_transformation_equals_plain_learner_bit_for_bit():
    plain = _learner(_adamw()).instantiate(parent=None)
    wrapped = _learner(
        WrappedPartitionedGradientTransformation.default_config().set(transformation=_adamw())
    ).instantiate(parent=None)
    p1, s1, sum1, _ = _run(plain, _params())
    p2, s2, sum2, _ = _run(wrapped, _params())
    assert jax.tree.structure(s1) == jax.tree.structure(s2)  # Same checkpoint layout.
    for a, b in zip(jax.tree.leaves((p1, s1)), jax.tree.leaves((p2, s2))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(sum1["optimizer"]["learning_rate"]) == float(sum2["optimizer"]["learning_rate"])
    # The forward state update was applied (not the delta) on "stats".
    assert not np.allclose(p1["stats"]["mean"], 0.0)
    # State specs match the state's structure.
    is_spec = lambda x: isinstance(x, TensorSpec)  # noqa: E731
    specs = wrapped.create_state_partition_specs(
        jax.tree.map(lambda v: TensorSpec(shape=v.shape, dtype=v.dtype), _params())
    )
    assert jax.tree.structure(specs, is_leaf=is_spec) == jax.tree.structure(s2)


class ScaledUpdates(UpdateTransformation):
    """Runs `inner` (a wrapped optimizer), then multiplies the parameter deltas by `scale`."""

    @config_class
    class Config(UpdateTransformation.Config):
        """Configures ScaledUpdates."""

        # The inner transformation.
        inner: WrappedPartitionedGradientTransformation.Config = (
            WrappedPartitionedGradientTransformation.default_config()
        )
        # The multiplier.
        scale: float = 1.0

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        self._add_child("inner", self.config.inner)

    def create_state_partition_specs(self, model_param_specs):
        return dict(inner=self.inner.create_state_partition_specs(model_param_specs))

    def init(self, model_params):
        return dict(inner=self.inner.init(model_params))

    def transform_update(self, updates):
        updates = self.inner(updates)
        scaled = jax.tree.map(lambda u: self.config.scale * u, updates.delta_updates)
        return dataclasses.replace(updates, delta_updates=scaled)


def test_scaling_transformation_scales_applied_delta():
    plain = _learner(_adamw()).instantiate(parent=None)
    scaled = _learner(
        ScaledUpdates.default_config().set(
            inner=WrappedPartitionedGradientTransformation.default_config().set(
                transformation=_adamw()
            ),
            scale=0.5,
        )
    ).instantiate(parent=None)
    params = _params()
    _, plain_state, _, plain_hist = _run(plain, params, steps=1)
    _, scaled_state, _, scaled_hist = _run(scaled, params, steps=1)
    (old, new_plain), (_, new_scaled) = plain_hist[0], scaled_hist[0]
    for k in ("w", "b"):
        np.testing.assert_allclose(
            new_scaled[k] - old[k], 0.5 * (new_plain[k] - old[k]), rtol=1e-5, atol=1e-7
        )
    # The inner optimizer state equals the plain one (scaling happens after it).
    for a, b in zip(
        jax.tree.leaves(plain_state["optimizer"]),
        jax.tree.leaves(scaled_state["optimizer"]["inner"]),
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class OverrideBias(UpdateTransformation):
    """A stateless transformation that sets `b` in place (in-place updates beat deltas)."""

    def create_state_partition_specs(self, model_param_specs):
        return {}

    def init(self, model_params):
        return {}

    def transform_update(self, updates):
        inplace = dict(updates.inplace_updates or {})
        inplace["b"] = jnp.full((3,), 7.0, jnp.float32)
        return dataclasses.replace(updates, inplace_updates=inplace)


def test_inplace_updates_take_precedence_over_deltas():
    learner = _learner(OverrideBias.default_config()).instantiate(parent=None)
    params = _params()
    grads = jax.tree.map(np.ones_like, params)
    updates = Updates(opt_params=opt_params(params), delta_updates=grads, inplace_updates={})
    new_params, coll = F(
        learner,
        method="update",
        prng_key=None,
        state=learner.init(opt_params(params)),
        inputs=dict(updates=updates),
        is_training=True,
    )
    np.testing.assert_array_equal(new_params["b"], np.full((3,), 7.0))
    # "w" gets its (untransformed) delta: the gradient itself.
    np.testing.assert_allclose(new_params["w"], params["w"] + 1.0)
    assert coll.state_updates["optimizer"] == {}


def test_updates_is_a_pytree_and_masks():
    params = _params()
    updates = Updates(
        opt_params=opt_params(params),
        delta_updates=jax.tree.map(np.ones_like, params),
        forward_pass=dict(
            default=ForwardPass(forward_fn=_loss_fn, inputs={}, model_params=params, outputs=None)
        ),
    )
    jax.tree.map(np.testing.assert_array_equal, updates.param_values(), params)
    assert updates.param_specs()["w"].shape == (4, 3)
    doubled = jax.tree.map(lambda x: 2 * x, updates.delta_updates)
    np.testing.assert_array_equal(doubled["w"], 2 * np.ones((4, 3)))
    # jit through an Updates (forward_fn is static).
    out = jax.jit(lambda u: u.delta_updates["b"] * 3)(dataclasses.replace(updates, opt_params={}))
    np.testing.assert_array_equal(out, 3 * np.ones(3))
    masked = updates.mask(
        lambda tree: {"w": True, "b": False, "stats": {"mean": False}},
        fields=("delta_updates",),
    )
    assert masked.delta_updates["b"] == optax.MaskedNode()
    np.testing.assert_array_equal(masked.delta_updates["w"], np.ones((4, 3)))
    assert masked.opt_params is updates.opt_params
    with pytest.raises(NotImplementedError, match="forward_pass"):
        updates.mask(lambda t: True, fields=("forward_pass",))


def test_bad_optimizer_is_rejected():
    with pytest.raises(ValueError, match=r"learner.optimizer must instantiate"):
        _learner(config_for_function(lambda: 3)).instantiate(parent=None)
    with pytest.raises(ValueError, match=r"transformation must instantiate"):
        WrappedPartitionedGradientTransformation.default_config().set(
            name="w", transformation=config_for_function(lambda: 3)
        ).instantiate(parent=None)


def test_override_inplace_replaces_matching_params_by_their_gradients():
    """ "b" takes its gradient as its value; the others follow the wrapped optimizer exactly."""
    from axlearn.common.update_transformation import OverrideInplaceUpdateTransformation

    sgd = config_for_function(optimizers.sgd_optimizer).set(
        learning_rate=0.1, decouple_weight_decay=True
    )
    override = _learner(
        OverrideInplaceUpdateTransformation.default_config().set(transformation=sgd, rules=["b"])
    ).instantiate(parent=None)
    plain = _learner(sgd).instantiate(parent=None)
    params = _params()
    p_over, _, _, _ = _run(override, params, steps=1)
    p_plain, _, _, _ = _run(plain, params, steps=1)
    np.testing.assert_array_equal(np.asarray(p_over["w"]), np.asarray(p_plain["w"]))
    # The gradient of the mean squared error w.r.t. b.
    batch = _batch()
    pred = batch["x"] @ params["w"] + params["b"]
    grad_b = np.sum(2 * (pred - batch["y"]), axis=0) / pred.size
    np.testing.assert_allclose(np.asarray(p_over["b"]), grad_b, rtol=1e-5)
    # Forward state updates are still applied.
    np.testing.assert_allclose(
        np.asarray(p_over["stats"]["mean"]), np.asarray(p_plain["stats"]["mean"])
    )
    # No optimizer state for the overridden parameter.
    adam = _adamw()
    adam_override = (
        OverrideInplaceUpdateTransformation.default_config()
        .set(name="o", transformation=adam, rules=[".*b"])
        .instantiate(parent=None)
    )
    state = adam_override.init(opt_params(params))
    assert not any("b" == k for k in jax.tree_util.tree_flatten_with_path(state)[0][0][0])
    sizes = sum(np.size(x) for x in jax.tree.leaves(state))
    full = sum(
        np.size(x) for x in jax.tree.leaves(adam_override.transformation.init(opt_params(params)))
    )
    assert full - sizes == 2 * params["b"].size  # Adam's mu and nu of "b" are gone.


def test_override_inplace_bad_rule():
    from axlearn.common.update_transformation import OverrideInplaceUpdateTransformation

    cfg = OverrideInplaceUpdateTransformation.default_config().set(
        name="o", transformation=_adamw(), rules=["(unclosed"]
    )
    with pytest.raises(ValueError, match=r"o\.rules\[0\]: bad regex"):
        cfg.instantiate(parent=None)


def _quadratic_loss(*, model_params, inputs):
    del inputs
    # 0.5 * ||x - t||^2: the gradient is x - t.
    loss = 0.5 * jnp.sum((model_params["x"] - jnp.arange(3.0)) ** 2)
    return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=new_output_collection())


def test_param_specs_carry_factorization_and_weight_decay_scale():
    from axlearn.common.base_layer import ParameterSpec
    from axlearn.common.optimizer_base import OptParam

    updates = Updates(
        opt_params=dict(
            w=OptParam(
                value=np.ones((2, 3), np.float32), factorization_spec=None, weight_decay_scale=0.5
            ),
            masked=optax.MaskedNode(),
        )
    )
    spec = updates.param_specs()["w"]
    assert isinstance(spec, ParameterSpec)
    assert (tuple(spec.shape), spec.dtype, spec.weight_decay_scale) == ((2, 3), np.float32, 0.5)
    assert updates.param_specs()["masked"] == optax.MaskedNode()


@pytest.mark.parametrize("wrap_inner", [False, True])
def test_conditional_update_applies_only_on_scheduled_steps(wrap_inner):
    sgd = config_for_function(optimizers.sgd_optimizer).set(
        learning_rate=0.1, decouple_weight_decay=True, momentum=0.9
    )
    inner = (
        WrappedPartitionedGradientTransformation.default_config().set(transformation=sgd)
        if wrap_inner
        else sgd
    )
    learner = _learner(
        ConditionalUpdateTransformation.default_config().set(
            inner=inner, update_schedule=lambda step: step % 2 == 0
        )
    ).instantiate(parent=None)
    params = {"x": np.array([3.0, -1.0, 0.5], np.float32)}
    state = learner.init(opt_params(params))
    step = forward_and_backward_step(learner, _quadratic_loss)
    # Reference: optax SGD with momentum, applied at steps 0 and 2 only.
    ref_opt = optax.sgd(0.1, momentum=0.9)
    ref_x = params["x"].copy()
    ref_state = ref_opt.init(ref_x)
    for i in range(4):
        assert int(state["optimizer"]["should_update"].count) == i
        out, coll = step(params, state, {})
        new_x = np.asarray(out.backward_outputs.updated_params["x"])
        if i % 2 == 0:
            u, ref_state = ref_opt.update(ref_x - np.arange(3.0, dtype=np.float32), ref_state)
            ref_x = ref_x + np.asarray(u)
        else:
            # Skipped step: no change of the parameters nor of the inner optimizer state.
            np.testing.assert_array_equal(new_x, params["x"])
            for a, b in zip(
                jax.tree.leaves(coll.state_updates["optimizer"]["inner"]),
                jax.tree.leaves(state["optimizer"]["inner"]),
            ):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(new_x, ref_x, rtol=1e-6)
        params, state = {"x": new_x}, coll.state_updates
    # The state specs match the state.
    specs = learner.create_state_partition_specs({"x": TensorSpec(shape=(3,), dtype=jnp.float32)})
    is_spec = lambda x: isinstance(x, TensorSpec)  # noqa: E731
    assert jax.tree.structure(specs, is_leaf=is_spec) == jax.tree.structure(state)


def test_conditional_update_rejects_inplace_updates():
    learner = _learner(ConditionalUpdateTransformation.default_config().set(inner=_adamw()))
    learner = learner.instantiate(parent=None)
    state = learner.init(opt_params(_params()))
    with pytest.raises(NotImplementedError, match="learner.optimizer: inplace_updates"):
        forward_and_backward_step(learner, _loss_fn)(_params(), state, _batch())
