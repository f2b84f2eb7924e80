"""Tests of axlearn/common/gradient_accumulation.py: N microbatches == one full-batch step."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import learner as learner_lib
from axlearn.common import optimizers
from axlearn.common.config import config_for_function
from axlearn.common.gradient_accumulation import with_minibatch_steps
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import functional as F
from axlearn.common.module import new_output_collection
from axlearn.common.optimizer_base import OptParam


def _params():
    rng = np.random.RandomState(0)
    return {
        "w1": (rng.standard_normal((5, 7)) / 2).astype(np.float32),
        "b1": (rng.standard_normal((7,)) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((7, 3)) / 3).astype(np.float32),
    }


def _batch(n=16):
    rng = np.random.RandomState(1)
    return dict(
        x=rng.standard_normal((n, 5)).astype(np.float32),
        y=rng.randint(0, 3, size=(n,)).astype(np.int32),
        # A per-example weight, to check the weighted summary combination.
        w=rng.randint(1, 4, size=(n,)).astype(np.float32),
    )


def fn(*, model_params, inputs):
    batch = inputs["input_batch"]
    h = jnp.tanh(batch["x"] @ model_params["w1"] + model_params["b1"])
    logp = jax.nn.log_softmax(h @ model_params["w2"])
    nll = -jnp.take_along_axis(logp, batch["y"][:, None], axis=1)[:, 0]
    collection = new_output_collection()
    weighted = WeightedScalar(jnp.sum(nll * batch["w"]) / jnp.sum(batch["w"]), jnp.sum(batch["w"]))
    collection.summaries["weighted_nll"] = weighted
    collection.summaries["max_logit"] = jnp.max(logp)
    return learner_lib.ForwardOutputs(
        loss=jnp.mean(nll), aux=dict(per_example=jnp.mean(nll)), output_collection=collection
    )


def _run(steps):
    cfg = learner_lib.Learner.default_config().set(
        name="learner",
        optimizer=config_for_function(optimizers.sgd_optimizer).set(
            learning_rate=0.5, decouple_weight_decay=True, momentum=0.9
        ),
    )
    if steps:
        cfg.forward_fn_transformation = config_for_function(with_minibatch_steps).set(steps=steps)
    learner = cfg.instantiate(parent=None)
    params = _params()
    opt = lambda p: jax.tree.map(lambda v: OptParam(v, None, None), p)
    state = learner.init(opt(params))

    @jax.jit
    def step(params, state, batch, key):
        out, collection = F(
            learner,
            method="forward_and_backward",
            prng_key=key,
            state=state,
            inputs=dict(
                fn=fn, opt_params=opt(params), inputs=dict(input_batch=batch, forward_key=key)
            ),
            is_training=True,
        )
        return out, collection.state_updates

    outs = []
    for i in range(2):
        out, state = step(params, state, _batch(), jax.random.PRNGKey(i))
        params = out.backward_outputs.updated_params
        outs.append(out)
    return outs


def test_four_microbatches_equal_one_full_batch_step():
    full, accumulated = _run(steps=0), _run(steps=4)
    for a, b in zip(full, accumulated):
        fa, fb = a.forward_outputs, b.forward_outputs
        assert float(fb.loss) == pytest.approx(float(fa.loss), abs=1e-6)
        assert float(fb.aux["per_example"]) == pytest.approx(float(fa.aux["per_example"]), abs=1e-6)
        # WeightedScalar summaries are combined by weight: equal to the full-batch value.
        wa, wb = (
            fa.output_collection.summaries["weighted_nll"],
            fb.output_collection.summaries["weighted_nll"],
        )
        assert float(wb.mean) == pytest.approx(float(wa.mean), abs=1e-6)
        assert float(wb.weight) == pytest.approx(float(wa.weight))
        for k, v in a.backward_outputs.updated_params.items():
            np.testing.assert_allclose(b.backward_outputs.updated_params[k], v, atol=1e-6)
    # The second step (momentum applied) moved the parameters by a visible amount.
    moved = np.abs(full[1].backward_outputs.updated_params["w1"] - _params()["w1"]).max()
    assert moved > 1e-2


def test_errors():
    wrapped = with_minibatch_steps(steps=3)(fn)
    with pytest.raises(ValueError, match="batch size 16 must be divisible by steps=3"):
        jax.grad(lambda p: wrapped(model_params=p, inputs=dict(input_batch=_batch())).loss)(
            _params()
        )
    with pytest.raises(ValueError, match="input_batch leaf 'w' has no batch axis"):
        jax.grad(
            lambda p: (
                wrapped(
                    model_params=p, inputs=dict(input_batch=dict(_batch(), w=np.float32(1)))
                ).loss
            )
        )(_params())
    with pytest.raises(ValueError, match="steps must be >= 1"):
        with_minibatch_steps(steps=0)


def test_summary_summaries_are_combined_by_the_metric_accumulator():
    from axlearn.common.metrics import MaxSummary, MetricAccumulator, MinSummary, WeightedSummary

    def per_batch_fn(*, model_params, inputs):
        x = inputs["input_batch"]["x"]  # [b, 5]
        loss = jnp.mean((x @ model_params["w1"]) ** 2)
        collection = new_output_collection()
        collection.summaries["min"] = MinSummary(jnp.min(x, axis=0))
        collection.summaries["nested"] = dict(max=MaxSummary(jnp.max(x, axis=0)))
        collection.summaries["count"] = WeightedSummary(jnp.mean(x[:, 0]), jnp.float32(x.shape[0]))
        collection.summaries["plain"] = jnp.mean(x)
        return learner_lib.ForwardOutputs(loss=loss, aux={}, output_collection=collection)

    x = _batch()["x"]
    for accumulator in (None, MetricAccumulator.default_config()):
        wrapped = with_minibatch_steps(steps=4, metric_accumulator=accumulator)(per_batch_fn)
        # Positional call (as pjit makes it) and keyword call give the same outputs.
        out = jax.jit(wrapped)(_params(), dict(input_batch=dict(x=x)))
        summaries = out.output_collection.summaries
        # Min/max over all microbatches = over the whole batch (NumPy reference).
        np.testing.assert_allclose(summaries["min"].value(), x.min(axis=0), rtol=1e-6)
        np.testing.assert_allclose(summaries["nested"]["max"].value(), x.max(axis=0), rtol=1e-6)
        # Equal-weight microbatch means combine to the full-batch mean; weights add up.
        assert float(summaries["count"].mean) == pytest.approx(float(x[:, 0].mean()), abs=1e-6)
        assert float(summaries["count"].weight) == 16.0
        # Plain summaries are averaged over the microbatches.
        assert float(summaries["plain"]) == pytest.approx(float(x.mean()), abs=1e-6)
        kw_out = wrapped(model_params=_params(), inputs=dict(input_batch=dict(x=x)))
        assert float(kw_out.loss) == pytest.approx(float(out.loss), abs=1e-6)
