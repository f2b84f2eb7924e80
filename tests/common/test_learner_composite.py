"""Tests of `axlearn.common.learner.CompositeLearner`."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from jax import numpy as jnp

from axlearn.common import learner as learner_lib
from axlearn.common import optimizers, schedule
from axlearn.common.config import config_for_function
from axlearn.common.module import new_output_collection
from axlearn.common.utils import TensorSpec
from tests.common.learner_test_utils import forward_and_backward_step, opt_params


def _params(seed=0):
    rng = np.random.RandomState(seed)
    return {
        "encoder": {
            "w": rng.standard_normal((4, 5)).astype(np.float32),
            "b": rng.standard_normal((5,)).astype(np.float32),
        },
        "decoder": {"w": rng.standard_normal((5, 3)).astype(np.float32)},
    }


def _loss_fn(*, model_params, inputs):
    batch = inputs["input_batch"]
    h = jnp.tanh(batch["x"] @ model_params["encoder"]["w"] + model_params["encoder"]["b"])
    loss = jnp.mean((h @ model_params["decoder"]["w"] - batch["y"]) ** 2)
    return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=new_output_collection())


def _batch():
    rng = np.random.RandomState(1)
    return {
        "x": rng.standard_normal((8, 4)).astype(np.float32),
        "y": rng.standard_normal((8, 3)).astype(np.float32),
    }


def _adamw(lr, b1, wd):
    return config_for_function(optimizers.adamw_optimizer).set(
        learning_rate=lr, b1=b1, b2=0.99, eps=1e-8, weight_decay=wd
    )


def _composite(**kwargs):
    return learner_lib.CompositeLearner.default_config().set(
        name="learner",
        learners={
            "enc": learner_lib.Learner.default_config().set(optimizer=_adamw(0.1, 0.9, 0.01)),
            "dec": learner_lib.Learner.default_config().set(optimizer=_adamw(0.02, 0.8, 0.0)),
        },
        rules=[("encoder/.*", "enc"), ("decoder/.*", "dec")],
        **kwargs,
    )


def _run(learner, params, steps):
    state = learner.init(opt_params(params))
    step = forward_and_backward_step(learner, _loss_fn)
    for _ in range(steps):
        out, coll = step(params, state, _batch())
        params, state, summaries = (
            out.backward_outputs.updated_params,
            coll.state_updates,
            coll.summaries,
        )
    return params, state, summaries


def test_two_adamw_sub_learners_equal_optax_multi_transform():
    learner = _composite().instantiate(parent=None)
    params, state, summaries = _run(learner, _params(), steps=4)

    labels = {"encoder": {"w": "enc", "b": "enc"}, "decoder": {"w": "dec"}}
    tx = optax.multi_transform(
        {
            "enc": optax.adamw(0.1, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.01),
            "dec": optax.adamw(0.02, b1=0.8, b2=0.99, eps=1e-8, weight_decay=0.0),
        },
        labels,
    )
    ref = _params()
    ref_state = tx.init(ref)
    grad_fn = jax.grad(lambda p: _loss_fn(model_params=p, inputs=dict(input_batch=_batch())).loss)
    for _ in range(4):
        updates, ref_state = tx.update(grad_fn(ref), ref_state, ref)
        ref = optax.apply_updates(ref, updates)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params, ref)

    # State layout: one entry per sub-learner, each with only its own parameters' moments.
    assert set(state) == {"enc", "dec"}
    enc_leaves = jax.tree.leaves(state["enc"])
    dec_leaves = jax.tree.leaves(state["dec"])
    assert sum(x.size for x in enc_leaves if x.ndim > 0) == 2 * (4 * 5 + 5)
    assert sum(x.size for x in dec_leaves if x.ndim > 0) == 2 * (5 * 3)
    # The reference's first moments for the decoder equal the "dec" sub-learner's.
    ref_dec_mu = ref_state.inner_states["dec"].inner_state[0].mu["decoder"]["w"]
    dec_mus = [x for x in dec_leaves if x.shape == (5, 3)]
    assert any(np.allclose(x, ref_dec_mu, rtol=1e-5, atol=1e-7) for x in dec_mus)
    # Summaries are per sub-learner.
    assert "enc" in summaries and "dec" in summaries

    # State specs have the structure of the state.
    specs = learner.create_state_partition_specs(
        jax.tree.map(lambda v: TensorSpec(shape=v.shape, dtype=v.dtype), _params())
    )
    is_spec = lambda x: isinstance(x, TensorSpec)  # noqa: E731
    assert jax.tree.structure(specs, is_leaf=is_spec) == jax.tree.structure(state)


def test_composite_with_one_sub_learner_and_ema_equals_plain_learner():
    ema = config_for_function(optimizers.param_ema).set(
        decay=config_for_function(schedule.decay_bias_correction).set(decay=0.9)
    )
    optimizer = _adamw(0.1, 0.9, 0.01)
    composite = (
        learner_lib.CompositeLearner.default_config()
        .set(
            name="learner",
            learners={"all": learner_lib.Learner.default_config().set(optimizer=optimizer)},
            rules=[(".*", "all")],
            ema=ema,
        )
        .instantiate(parent=None)
    )
    plain = (
        learner_lib.Learner.default_config()
        .set(name="learner", optimizer=optimizer, ema=ema)
        .instantiate(parent=None)
    )
    p1, s1, _ = _run(composite, _params(), steps=3)
    p2, s2, _ = _run(plain, _params(), steps=3)
    for a, b in zip(
        jax.tree.leaves((p1, s1["all"]["optimizer"], s1["ema"])),
        jax.tree.leaves((p2, s2["optimizer"], s2["ema"])),
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_frozen_parameter_inside_a_sub_learner():
    cfg = _composite()
    cfg.learners["enc"].update_rules = [("encoder/b", learner_lib.UpdateType.NO_UPDATE)]
    learner = cfg.instantiate(parent=None)
    should = learner.should_update_with_optimizers(opt_params(_params()))
    assert should == {"encoder": {"w": True, "b": False}, "decoder": {"w": True}}
    params, _, _ = _run(learner, _params(), steps=2)
    np.testing.assert_array_equal(params["encoder"]["b"], _params()["encoder"]["b"])
    assert not np.allclose(params["encoder"]["w"], _params()["encoder"]["w"])


def test_config_errors_name_the_path():
    with pytest.raises(
        ValueError,
        match=r"Composite learner rules do not update all model params: parameter 'decoder/w'",
    ):
        _composite().set(rules=[("encoder/.*", "enc")]).instantiate(parent=None).init(
            opt_params(_params())
        )
    with pytest.raises(
        ValueError, match=r"nope is not found in the known learners: learner.rules\[0\]"
    ):
        _composite().set(rules=[(".*", "nope")]).instantiate(parent=None)
    cfg = _composite()
    cfg.learners["enc"].ema.decay = 0.9
    with pytest.raises(
        ValueError,
        match=r"Sublearner enc ema decay is not None: learner.learners\['enc'\].ema.decay=0.9",
    ):
        cfg.instantiate(parent=None)
    cfg = _composite()
    cfg.learners["ema"] = cfg.learners.pop("enc")
    with pytest.raises(ValueError, match="Sublearner name cannot be ema."):
        cfg.instantiate(parent=None)
    cfg = _composite()
    cfg.learners["enc"].forward_fn_transformation = lambda fn: fn
    with pytest.raises(ValueError, match=r"forward_fn_transformation is not supported"):
        cfg.instantiate(parent=None)


@pytest.mark.slow
def test_trainer_with_composite_learner_resumes_bit_identically(tmp_path):
    """SpmdTrainer creates, checkpoints and restores a CompositeLearner's state (8 devices)."""
    from tests.common import resume_test_utils as rtu  # pylint: disable=import-outside-toplevel

    def config(name, max_step):
        cfg = rtu.resume_trainer_config(str(tmp_path / name), max_step=max_step, checkpoint_every=2)
        optimizer = cfg.learner.optimizer
        cfg.learner = learner_lib.CompositeLearner.default_config().set(
            learners={
                "emb": learner_lib.Learner.default_config().set(optimizer=optimizer.clone()),
                "proj": learner_lib.Learner.default_config().set(
                    optimizer=optimizer.clone(learning_rate=0.001)
                ),
            },
            rules=[("emb/.*", "emb"), ("proj/.*", "proj")],
        )
        return cfg

    full = config("full", 4).instantiate(parent=None)
    full.run(jax.random.PRNGKey(3))
    first = config("resumed", 2).instantiate(parent=None)
    first.run(jax.random.PRNGKey(3))
    del first
    resumed = config("resumed", 4).instantiate(parent=None)
    resumed.run(jax.random.PRNGKey(3))
    assert resumed.restored_steps == [2]
    state = full.trainer_state.learner
    assert set(state) == {"emb", "proj"}
    assert rtu.state_digest(resumed.trainer_state) == rtu.state_digest(full.trainer_state)


def _nan_loss_fn(*, model_params, inputs):
    out = _loss_fn(model_params=model_params, inputs=inputs)
    return out._replace(loss=out.loss * inputs["input_batch"]["scale"])


@pytest.mark.parametrize("ignore", [(True, True), (True, False), (False, False)])
def test_undefined_loss_is_skipped_only_when_every_sub_learner_ignores_it(ignore):
    """AXLearn's semantics: the composite handles an undefined loss if every sub-learner does;
    then a NaN step changes no parameter, sub-learner state or EMA; otherwise NaN is applied."""
    cfg = _composite()
    cfg.ema.decay = 0.9
    cfg.learners["enc"].ignore_undefined_loss, cfg.learners["dec"].ignore_undefined_loss = ignore
    learner = cfg.instantiate(parent=None)
    assert learner.handles_undefined_loss() is all(ignore)
    params = _params()
    state = learner.init(opt_params(params))
    step = forward_and_backward_step(learner, _nan_loss_fn)
    out, coll = step(params, state, dict(_batch(), scale=np.float32("nan")))
    updated = out.backward_outputs.updated_params
    new_leaves = jax.tree.leaves(coll.state_updates)
    if all(ignore):
        jax.tree.map(np.testing.assert_array_equal, updated, params)
        for new, old in zip(new_leaves, jax.tree.leaves(state)):
            np.testing.assert_array_equal(new, old)
    else:
        assert all(np.isnan(x).all() for x in jax.tree.leaves(updated))
