"""Tests of axlearn/common/learner.py: reference dump, forward_and_backward, update rules."""

from __future__ import annotations

import math
import pathlib

import jax
import numpy as np
import optax
import pytest
from jax import numpy as jnp

from axlearn.common import learner as learner_lib
from axlearn.common import optimizers, schedule
from axlearn.common.config import config_for_function
from axlearn.common.layers import Linear
from axlearn.common.module import OutputCollection, new_output_collection
from axlearn.common.module import functional as F
from axlearn.common.utils import TensorSpec
from tests.common.learner_test_utils import KEY, forward_and_backward_step, opt_params

TESTDATA = pathlib.Path(__file__).parent.parent / "testdata"


def honeycrisp_learner_config() -> learner_lib.Learner.Config:
    """The learner of the reference trainer dump, built from the real functions."""
    mup_rules = [
        (".*attention/o_proj/weight", 0.25),
        (".*attention/i_proj/i_proj/qkv_proj/weight", 0.25),
        (".*feed_forward/linear1_0/weight", 0.25),
        (".*feed_forward/linear1_1/weight", 0.25),
        (".*feed_forward/linear2/weight", 0.25),
        (".*feed_forward/wi_0_weight", 0.25),
        (".*feed_forward/wi_1_weight", 0.25),
        (".*feed_forward/wo_weight", 0.25),
    ]
    adastar = config_for_function(optimizers.adastar_optimizer).set(
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
        update_schedule=config_for_function(schedule.cosine_with_linear_warmup).set(
            peak_lr=1.0, max_step=750000, warmup_steps=5000, begin_value=0.0, alpha=0.005
        ),
        adam_update_transformation=config_for_function(optimizers.scale_update_per_param).set(
            per_param_scale=config_for_function(optimizers.per_param_scale_by_path).set(
                description="scale_by_mup_simple", scale_by_path=mup_rules, default_scale=1.0
            )
        ),
    )
    return learner_lib.Learner.default_config().set(
        optimizer=config_for_function(optimizers.skip_and_clip_by_global_norm).set(
            inner=adastar, drop_norm=100, max_norm=1
        )
    )


def test_reference_dump_learner_lines():
    expected = (TESTDATA / "learner_reference.txt").read_text()
    # The reference predates AXLearn's `ignore_undefined_loss` (golden_config's newer lines).
    lines = honeycrisp_learner_config().debug_string().splitlines()
    assert "ignore_undefined_loss: False" in lines
    lines = [line for line in lines if line != "ignore_undefined_loss: False"]
    assert "".join(f"learner.{line}\n" for line in lines) == expected


def _mlp_params(seed=0, d=6, h=8, c=3):
    rng = np.random.RandomState(seed)
    return {
        "w1": (rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32),
        "b1": np.zeros((h,), np.float32),
        "w2": (rng.standard_normal((h, c)) / np.sqrt(h)).astype(np.float32),
        "b2": np.zeros((c,), np.float32),
    }


def _mlp_loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], axis=1))


def mlp_fn(*, model_params, inputs):
    """A ForwardFn: mean cross-entropy of a 2-layer MLP."""
    loss = _mlp_loss(model_params, inputs["input_batch"])
    return learner_lib.ForwardOutputs(
        loss=loss, aux=dict(loss_x2=2 * loss), output_collection=new_output_collection()
    )


def _batch(seed=1, n=16, d=6, c=3):
    rng = np.random.RandomState(seed)
    return dict(
        x=rng.standard_normal((n, d)).astype(np.float32),
        y=rng.randint(0, c, size=(n,)).astype(np.int32),
    )


def make_step(learner, fn=mlp_fn):
    """A jitted train step through functional(learner, "forward_and_backward")."""
    return forward_and_backward_step(learner, fn)


ADAMW = config_for_function(optimizers.adamw_optimizer).set(
    learning_rate=0.05, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.01
)


def test_forward_and_backward_matches_manual_adamw():
    learner = (
        learner_lib.Learner.default_config()
        .set(name="learner", optimizer=ADAMW)
        .instantiate(parent=None)
    )
    params, batch = _mlp_params(), _batch()
    state = learner.init(opt_params(params))
    step = make_step(learner)
    ref_tx = optax.adamw(0.05, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.01)
    ref_params, ref_state = params, ref_tx.init(params)
    for _ in range(3):
        out, collection = step(params, state, batch)
        loss, grads = jax.value_and_grad(_mlp_loss)(ref_params, batch)
        updates, ref_state = ref_tx.update(grads, ref_state, ref_params)
        assert float(out.forward_outputs.loss) == pytest.approx(float(loss), abs=1e-6)
        assert float(out.forward_outputs.aux["loss_x2"]) == pytest.approx(2 * float(loss), abs=1e-6)
        ref_params = optax.apply_updates(ref_params, updates)
        params = out.backward_outputs.updated_params
        state = collection.state_updates
        for k in params:
            np.testing.assert_allclose(params[k], ref_params[k], atol=1e-6)
    # The new state is exactly the state tree; summaries come out of the collection.
    assert jax.tree.structure(state) == jax.tree.structure(learner.init(opt_params(params)))
    assert float(collection.summaries["optimizer"]["learning_rate"]) == pytest.approx(0.05)


def test_state_specs_match_init_and_frozen_params_have_no_state():
    cfg = learner_lib.Learner.default_config().set(
        name="learner",
        optimizer=ADAMW,
        update_rules=[("b.*", learner_lib.UpdateType.NO_UPDATE)],
        ema=config_for_function(optimizers.param_ema).set(decay=0.9),
    )
    learner = cfg.instantiate(parent=None)
    params = _mlp_params()
    state = learner.init(opt_params(params))
    specs = jax.tree.map(lambda p: TensorSpec(shape=p.shape, dtype=p.dtype), params)
    state_specs = learner.create_state_partition_specs(specs)
    is_spec = lambda x: isinstance(x, TensorSpec)
    assert jax.tree.structure(state) == jax.tree.structure(state_specs, is_leaf=is_spec)
    adam_state = state["optimizer"][0]
    assert adam_state.mu["b1"] is None and adam_state.mu["w1"].shape == (6, 8)
    assert set(state) == {"optimizer", "ema"}

    out, collection = make_step(learner)(params, state, _batch())
    new = out.backward_outputs.updated_params
    np.testing.assert_array_equal(new["b1"], params["b1"])  # Frozen.
    assert np.abs(new["w1"] - params["w1"]).max() > 1e-3
    ema = collection.state_updates["ema"].ema
    np.testing.assert_allclose(ema["w1"], 0.1 * new["w1"], rtol=1e-6)  # (1 - 0.9) * p + 0.9 * 0.


def test_update_rule_matching_nothing_is_an_error():
    cfg = learner_lib.Learner.default_config().set(
        name="learner", optimizer=ADAMW, update_rules=[("w.*", "all_updates"), ("decoder/.*", None)]
    )
    learner = cfg.instantiate(parent=None)
    with pytest.raises(ValueError, match=r"learner.update_rules\[1\] 'decoder/\.\*' matches no"):
        learner.init(opt_params(_mlp_params()))


def test_state_updates_follow_update_rules():
    def fn_with_state_update(*, model_params, inputs):
        out = mlp_fn(model_params=model_params, inputs=inputs)
        collection = new_output_collection()
        collection.state_updates.update(b1=jnp.full((8,), 7.0), b2=jnp.full((3,), 5.0))
        return out._replace(output_collection=collection)

    cfg = learner_lib.Learner.default_config().set(
        name="learner",
        optimizer=config_for_function(optimizers.sgd_optimizer).set(
            learning_rate=0.0, decouple_weight_decay=True
        ),
        update_rules=[("b2", "optimizers")],  # b2 takes no state updates.
    )
    learner = cfg.instantiate(parent=None)
    params = _mlp_params()
    out, _ = make_step(learner, fn_with_state_update)(
        params, learner.init(opt_params(params)), _batch()
    )
    new = out.backward_outputs.updated_params
    np.testing.assert_array_equal(new["b1"], 7.0)
    np.testing.assert_array_equal(new["b2"], params["b2"])


def test_per_variable_summaries():
    cfg = learner_lib.Learner.default_config().set(
        name="learner", optimizer=ADAMW, enable_per_variable_summaries=True
    )
    learner = cfg.instantiate(parent=None)
    params = _mlp_params()
    _, collection = make_step(learner)(params, learner.init(opt_params(params)), _batch())
    rms = float(collection.summaries["param_rms/w1"])
    assert rms == pytest.approx(float(np.sqrt(np.mean(params["w1"] ** 2))), rel=1e-5)
    assert "grad_rms/b2" in collection.summaries


def test_honeycrisp_learner_on_a_module_with_nested_functional():
    """The reference learner trains a Linear layer called via functional() inside the learner."""
    model = (
        Linear.default_config()
        .set(name="model", input_dim=4, output_dim=2)
        .instantiate(parent=None)
    )
    params = model.initialize_parameters_recursively(KEY)
    cfg = honeycrisp_learner_config().set(name="learner")
    # Rules must match a parameter of this model: map the mup rules onto it.
    cfg.optimizer.inner.adam_update_transformation.per_param_scale.scale_by_path = [
        ("weight", 0.25)
    ]
    cfg.optimizer.inner.update_schedule.set(max_step=100, warmup_steps=2)
    learner = cfg.instantiate(parent=None)
    state = learner.init(opt_params(params))

    def fn(*, model_params, inputs):
        y, collection = F(
            model,
            prng_key=None,
            state=model_params,
            inputs=dict(x=inputs["input_batch"]["x"]),
            is_training=True,
        )
        loss = jnp.mean((y - inputs["input_batch"]["y"]) ** 2)
        return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=collection)

    batch = dict(x=np.ones((8, 4), np.float32), y=np.zeros((8, 2), np.float32))
    step = make_step(learner, fn)
    losses = []
    for _ in range(4):
        out, collection = step(params, state, batch)
        assert isinstance(collection, OutputCollection)
        params, state = out.backward_outputs.updated_params, collection.state_updates
        losses.append(float(out.forward_outputs.loss))
    assert losses[-1] < losses[0]
    summaries = collection.summaries["optimizer"]
    for name in (
        "gradient_norm",
        "nonvalid_count",
        "gradient_scale",
        "learning_rate",
        "schedule_scale",
        "weight_decay_rate",
    ):
        assert name in summaries, (name, sorted(summaries))
    # Verbosity 0 (the reference config's): no per-parameter norms, as in AXLearn.
    assert not [k for k in summaries if k.endswith("_norm") and "/" in k], sorted(summaries)
    assert int(summaries["nonvalid_count"]) == 0
    # The 4th update sees step 4 (steps count from 1): 2 steps past the 2-step warm-up.
    assert int(summaries["schedule_step"]) == 4
    want = (1 - 0.005) * 0.5 * (1 + math.cos(math.pi * 2 / 98)) + 0.005  # alpha=0.005.
    assert float(summaries["schedule_scale"]) == pytest.approx(want, rel=1e-5)
    assert float(summaries["learning_rate"]) == pytest.approx(0.01 * want, rel=1e-5)
    assert float(summaries["weight_decay_rate"]) == pytest.approx(0.000316 * want, rel=1e-5)


@pytest.mark.parametrize("verbosity", [0, 1])
def test_adastar_summaries_follow_verbosity_and_per_param_scale(verbosity):
    """weight_decay_rate carries the last parameter's per-param scale; norms need verbosity."""
    model = (
        Linear.default_config()
        .set(name="model", input_dim=4, output_dim=2)
        .instantiate(parent=None)
    )
    params = model.initialize_parameters_recursively(KEY)
    cfg = honeycrisp_learner_config().set(name="learner")
    cfg.optimizer.inner.adam_update_transformation = None
    # Parameters flatten as (bias, weight): the last one, weight, has scale 0.1.
    cfg.optimizer.inner.set(
        verbosity=verbosity,
        update_schedule=0.5,
        weight_decay_per_param_scale=config_for_function(optimizers.per_param_scale_by_path).set(
            description="weight_decay_scale", scale_by_path=[("weight", 0.1)]
        ),
    )
    learner = cfg.instantiate(parent=None)

    def fn(*, model_params, inputs):
        y, collection = F(
            model,
            prng_key=None,
            state=model_params,
            inputs=dict(x=inputs["input_batch"]["x"]),
            is_training=True,
        )
        loss = jnp.mean(y**2)
        return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=collection)

    batch = dict(x=np.ones((8, 4), np.float32))
    _, collection = make_step(learner, fn)(params, learner.init(opt_params(params)), batch)
    summaries = collection.summaries["optimizer"]
    # 0.000316 * schedule 0.5 * 0.1 (weight's scale): ten times below the unscaled rate.
    assert float(summaries["weight_decay_rate"]) == pytest.approx(0.000316 * 0.5 * 0.1)
    assert float(summaries["learning_rate"]) == pytest.approx(0.01 * 0.5)
    norms = sorted(k for k in summaries if "/" in k)
    if verbosity:
        for param in ("bias", "weight"):
            for stat in ("raw_grad_norm", "param_norm", "raw_update_norm", "smoothed_update_norm"):
                assert f"{param}/{stat}" in norms, norms
        w = np.asarray(params["weight"])
        want = np.sqrt(np.mean(w**2))
        assert float(summaries["weight/param_norm"]) == pytest.approx(want, rel=1e-5)
    else:
        assert norms == []


def test_per_param_settings_text():
    specs = {
        "w": TensorSpec(shape=(4, 3), dtype=np.float32),
        "b": TensorSpec(shape=(3,), dtype=np.float32),
        "norm": {"scale": TensorSpec(shape=(3,), dtype=np.float32)},
    }
    cfg = learner_lib.Learner.default_config().set(
        name="learner",
        optimizer=ADAMW.clone(
            weight_decay_per_param_scale=config_for_function(
                optimizers.per_param_scale_by_path
            ).set(scale_by_path=[(".*norm/scale", 0.0)], description="weight_decay_scale")
        ),
        update_rules=[("b", learner_lib.UpdateType.NO_UPDATE)],
    )
    learner = cfg.instantiate(parent=None)
    # The _regularizer.txt text: frozen parameters have no optimizer, hence no weight decay.
    assert learner_lib.per_param_settings_text(learner, specs) == "norm/scale: 0.0\nw: 1.0"
    text = learner_lib.per_param_settings_text(
        learner, specs, descriptions=("learner_update_type",)
    )
    assert text.splitlines() == [
        "b: UpdateType.NO_UPDATE",
        "norm/scale: UpdateType.ALL_UPDATES",
        "w: UpdateType.ALL_UPDATES",
    ]


def test_decoupled_adamw_effective_learning_rate_is_alpha_times_schedule():
    """The log line's lr for a decoupled optimizer: alpha x schedule, 0 while warm-up is at 0."""
    alpha, peak_steps = 0.01, 4
    update_schedule = config_for_function(schedule.polynomial).set(
        begin_step=0, begin_value=0.0, end_step=peak_steps, end_value=1.0
    )
    cfg = learner_lib.Learner.default_config().set(
        name="learner",
        optimizer=config_for_function(optimizers.adamw_decoupled_optimizer).set(
            learning_rate=alpha, b1=0.9, b2=0.99, eps=1e-8, update_schedule=update_schedule
        ),
    )
    learner = cfg.instantiate(parent=None)
    params = _mlp_params()
    state = learner.init(opt_params(params))
    step = make_step(learner)
    schedule_fn = schedule.as_schedule_fn(update_schedule)
    for i in range(3):
        out, collection = step(params, state, _batch())
        params, state = out.backward_outputs.updated_params, collection.state_updates
        summaries = collection.summaries["optimizer"]
        assert float(summaries["learning_rate"]) == pytest.approx(alpha)
        # The optimizer's update count is i at the i-th update (0-based) or i + 1 (1-based); the
        # effective rate must be alpha times the schedule at whichever count the schedule saw.
        counted = int(summaries["schedule_step"])
        assert counted in (i, i + 1)
        expected = alpha * float(schedule_fn(counted))
        assert float(summaries["effective_learning_rate"]) == pytest.approx(expected, abs=1e-9)
        # Independently: linear warm-up from 0 to 1 over `peak_steps`.
        assert float(summaries["effective_learning_rate"]) == pytest.approx(
            alpha * counted / peak_steps, abs=1e-9
        )


def _scaled_mlp_fn(*, model_params, inputs):
    """mlp_fn times inputs["input_batch"]["scale"] (NaN there makes the loss undefined)."""
    batch = inputs["input_batch"]
    loss = _mlp_loss(model_params, batch) * batch["scale"]
    return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=new_output_collection())


@pytest.mark.parametrize("ignore", [False, True])
def test_ignore_undefined_loss(ignore):
    """ignore_undefined_loss=True skips a step whose loss is NaN (parameters and optimizer state
    unchanged) and applies a finite step exactly as False does; False applies the NaN step."""
    learner = (
        learner_lib.Learner.default_config()
        .set(name="learner", optimizer=ADAMW, ignore_undefined_loss=ignore)
        .instantiate(parent=None)
    )
    params = _mlp_params()
    state = learner.init(opt_params(params))
    step = make_step(learner, fn=_scaled_mlp_fn)
    nan_batch = dict(_batch(), scale=np.float32("nan"))
    out, collection = step(params, state, nan_batch)
    updated = out.backward_outputs.updated_params
    assert np.isnan(float(out.forward_outputs.loss))
    if ignore:
        for k in params:
            np.testing.assert_array_equal(updated[k], params[k])
        for new, old in zip(jax.tree.leaves(collection.state_updates), jax.tree.leaves(state)):
            np.testing.assert_array_equal(new, old)
    else:
        assert all(np.isnan(updated[k]).all() for k in params)
    # A finite step: the same update as plain AdamW (optax) from the unchanged start.
    out, _ = step(params, state, dict(_batch(), scale=np.float32(1.0)))
    ref_tx = optax.adamw(0.05, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.01)
    grads = jax.grad(_mlp_loss)(params, _batch())
    updates, _ = ref_tx.update(grads, ref_tx.init(params), params)
    ref = optax.apply_updates(params, updates)
    for k in params:
        np.testing.assert_allclose(out.backward_outputs.updated_params[k], ref[k], atol=1e-6)
