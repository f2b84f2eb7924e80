"""Tests axlearn/common/evaler.py: whole-eval-set weighted metrics vs NumPy, on an 8-device mesh."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common.config import config_class
from axlearn.common.evaler import ModelSummaryAccumulator, SpmdEvaler, every_n_steps_policy
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import Module
from axlearn.common.summary_writer import JsonlWriter

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata", "evaler")
DIM = 4
BATCH = 16
NUM_BATCHES = 3


def _batches(seed: int = 0):
    """Three batches; the last has only 5 real examples (the rest is padding, weight 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(NUM_BATCHES):
        x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        y = rng.normal(size=(BATCH,)).astype(np.float32)
        w = np.ones((BATCH,), np.float32)
        if i == NUM_BATCHES - 1:
            w[5:] = 0.0
        out.append(dict(x=x, y=y, weight=w))
    return out


class ListInput(Module):
    """An eval input yielding `_batches(seed)`."""

    @config_class
    class Config(Module.Config):
        seed: int = 0  # Data seed.
        is_training: bool = True  # Set to False by the evaler.

    def dataset(self):
        assert not self.config.is_training
        return iter(_batches(self.config.seed))


class IterInput(ListInput):
    """Like axlearn inputs: iter(input) gives an iterator, input.batches(it) yields batches."""

    def __iter__(self):
        assert not self.config.is_training
        return iter(_batches(self.config.seed))

    def dataset(self):
        raise AssertionError("iterable inputs are read with batches(iter(input))")

    def batches(self, it):
        yield from it


class Regression(Module):
    """forward(input_batch) -> (loss, {}); summarizes the loss per real example."""

    seen_dtypes: list = []

    def forward(self, *, input_batch):
        w = self.state["w"]
        Regression.seen_dtypes.append(w.dtype)
        pred = input_batch["x"] @ w
        err = jnp.square(pred.astype(jnp.float32) - input_batch["y"])
        weight = input_batch["weight"].astype(jnp.float32)
        num = jnp.sum(weight)
        loss = jnp.sum(err * weight) / jnp.maximum(num, 1)
        self.add_summary("loss", WeightedScalar(loss, num))
        self.add_summary("sum_err", jnp.sum(err))  # A plain tensor: not accumulated.
        return loss, {}


def _make_evaler(tmp_path, mesh, *, eval_dtype=None, n=5, input_cls=ListInput):
    model = Regression.default_config().set(name="model").instantiate(parent=None)
    cfg = SpmdEvaler.default_config().set(
        name="evaler",
        input=input_cls.default_config(),
        eval_dtype=eval_dtype,
        summary_writer=JsonlWriter.default_config().set(dir=str(tmp_path)),
    )
    cfg.eval_policy.set(n=n, min_step=1, max_step=12)
    with jax.set_mesh(mesh):
        return cfg.instantiate(
            parent=None, model=model, model_param_partition_specs=dict(w=PartitionSpec())
        )


def _expected_loss(w: np.ndarray) -> float:
    batches = _batches()
    err = np.concatenate([np.square(b["x"] @ w - b["y"]) for b in batches])
    weight = np.concatenate([b["weight"] for b in batches])
    return float(np.sum(err * weight) / np.sum(weight))


@pytest.mark.parametrize("input_cls", [ListInput, IterInput])
def test_eval_step_weighted_mean_over_whole_set(tmp_path, input_cls):
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    evaler = _make_evaler(tmp_path, mesh, input_cls=input_cls)
    w = np.linspace(-1, 1, DIM).astype(np.float32)
    params = dict(w=jax.device_put(w, NamedSharding(mesh, PartitionSpec())))
    key = jax.random.PRNGKey(0)

    assert evaler.eval_step(3, prng_key=key, model_params=params) == (key, None, None)
    out_key, summaries, _ = evaler.eval_step(5, prng_key=key, model_params=params)
    assert out_key is key
    expected = _expected_loss(w)  # Mean over the 37 real examples, not a mean of batch means.
    assert float(summaries["loss"].mean) == pytest.approx(expected, rel=1e-5)
    assert float(summaries["loss"].weight) == 2 * BATCH + 5
    assert "sum_err" not in summaries
    batch_means = np.mean([_expected_loss_batch(b, w) for b in _batches()])
    assert abs(batch_means - expected) > 1e-3  # The test can tell the two apart.

    with open(os.path.join(str(tmp_path), "metrics.jsonl"), encoding="utf-8") as f:
        record = json.loads(f.read().splitlines()[-1])
    assert record["step"] == 5 and record["num_eval_batches"] == NUM_BATCHES
    assert record["loss"] == pytest.approx(expected, rel=1e-5)
    assert record["eval_time_secs"] > 0

    # force_run ignores the policy.
    _, forced, _ = evaler.eval_step(7, prng_key=key, model_params=params, force_run=True)
    assert float(forced["loss"].mean) == pytest.approx(expected, rel=1e-5)


def _expected_loss_batch(b, w):
    err = np.square(b["x"] @ w - b["y"])
    return float(np.sum(err * b["weight"]) / np.sum(b["weight"]))


def test_eval_dtype_casts_params_and_inputs(tmp_path):
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    evaler = _make_evaler(tmp_path, mesh, eval_dtype=jnp.bfloat16)
    Regression.seen_dtypes.clear()
    w = np.linspace(-1, 1, DIM).astype(np.float32)
    _, summaries, _ = evaler.eval_step(
        10, prng_key=jax.random.PRNGKey(0), model_params=dict(w=jnp.asarray(w))
    )
    assert Regression.seen_dtypes and all(d == jnp.bfloat16 for d in Regression.seen_dtypes)
    assert float(summaries["loss"].mean) == pytest.approx(_expected_loss(w), rel=3e-2)


@pytest.mark.parametrize(
    "step,due", [(0, False), (1, False), (5, True), (7, False), (10, True), (12, True), (13, True)]
)
def test_every_n_steps_policy(step, due):
    policy = every_n_steps_policy(5, min_step=1, max_step=12)
    assert policy(step=step, train_summaries={}) is due


def test_every_n_steps_policy_errors():
    with pytest.raises(ValueError, match="max_step"):
        every_n_steps_policy(5, min_step=10, max_step=3)
    with pytest.raises(ValueError, match="n must be"):
        every_n_steps_policy(0)


def test_reference_dump_lines():
    """Rebuilds the reference dump's evalers['openwebtext_2'] lines (except input.)."""
    cfg = SpmdEvaler.default_config().set(eval_dtype=jnp.bfloat16)
    cfg.eval_policy.set(n=25000, min_step=1, max_step=750000)
    cfg.summary_writer.set(write_every_n_steps=1)
    cfg.metric_calculator = ModelSummaryAccumulator.default_config()
    prefix = "evalers['openwebtext_2']."
    got = [prefix + line for line in cfg.debug_string().split("\n")]
    with open(os.path.join(TESTDATA, "reference_evaler_lines.txt"), encoding="utf-8") as f:
        assert got == f.read().splitlines()
