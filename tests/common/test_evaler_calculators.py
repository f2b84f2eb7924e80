"""Tests CompositeMetricCalculator, GlobalMetricCalculator and inference_output (vs NumPy)."""

import graphlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from jax.sharding import Mesh, PartitionSpec

from axlearn.common.evaler import (
    BaseMetricCalculator,
    CompositeMetricCalculator,
    GlobalMetricCalculator,
    ModelSummaryAccumulator,
    SpmdEvaler,
)
from axlearn.common.inference_output import (
    JsonlExampleRecordSink,
    OutputRecordWriter,
    TfExampleRecordSink,
)
from axlearn.common.summary_writer import JsonlWriter
from axlearn.common.utils import DataPartitionType, host_to_global_device_array
from tests.common.test_evaler import DIM, ListInput, Regression, _batches, _expected_loss


class Predictor(Regression):
    """Regression with a `predict` method."""

    def predict(self, *, input_batch):
        return dict(pred=input_batch["x"] @ self.state["w"])


def _mesh():
    return Mesh(np.array(jax.devices()).reshape(8), ("data",))


def _run_evaler(tmp_path, calculator_cfg, w):
    model = Predictor.default_config().set(name="model").instantiate(parent=None)
    cfg = SpmdEvaler.default_config().set(
        name="evaler",
        input=ListInput.default_config(),
        metric_calculator=calculator_cfg,
        summary_writer=JsonlWriter.default_config().set(dir=str(tmp_path)),
    )
    with jax.set_mesh(_mesh()):
        evaler = cfg.instantiate(
            parent=None, model=model, model_param_partition_specs=dict(w=PartitionSpec())
        )
        _, summaries, _ = evaler.eval_step(
            1, prng_key=jax.random.PRNGKey(0), model_params=dict(w=w), force_run=True
        )
    return summaries


def test_composite_prefixes_each_calculators_summaries(tmp_path):
    w = np.linspace(-1, 1, DIM).astype(np.float32)
    calc = CompositeMetricCalculator.default_config().set(
        metric_calculators=dict(
            first=ModelSummaryAccumulator.default_config(),
            second=ModelSummaryAccumulator.default_config(),
        )
    )
    summaries = _run_evaler(tmp_path, calc, jnp.asarray(w))
    for name in ("first", "second"):
        np.testing.assert_allclose(summaries[f"{name}/loss"].mean, _expected_loss(w), rtol=1e-5)


class _Recorder(BaseMetricCalculator):
    """Outputs its name; records the extra keys of each input batch."""

    seen: dict = {}

    def init_state(self, *, prng_key, model_params):
        return {}

    def forward(self, input_batch, *, model_params, state):
        _Recorder.seen[self.name] = {k: v for k, v in input_batch.items() if k != "x"}
        return dict(output=f"out_{self.name}", state={})

    def get_summaries(self, *, model_params, state, all_forward_outputs):
        return {"n": len(all_forward_outputs)}


def _composite(dependencies):
    names = ("a", "b", "c")
    cfg = CompositeMetricCalculator.default_config().set(
        name="calc",
        metric_calculators={n: _Recorder.default_config() for n in names},
        dependencies=dependencies,
    )
    model = Predictor.default_config().set(name="model").instantiate(parent=None)
    return cfg.instantiate(parent=None, model=model, model_param_partition_specs={})


def test_composite_dependencies():
    dep = CompositeMetricCalculator.Dependency
    calc = _composite([dep(src="c", dst="[ab]"), dep(src="b", dst="a", dst_key="from_b")])
    _Recorder.seen = {}
    out = calc.forward(
        dict(x=1), model_params={}, state=calc.init_state(prng_key=None, model_params={})
    )
    assert out["output"] == {"a": "out_a", "b": "out_b", "c": "out_c"}
    assert _Recorder.seen == {"c": {}, "b": {"c": "out_c"}, "a": {"c": "out_c", "from_b": "out_b"}}
    summaries = calc.get_summaries(
        model_params={}, state=out["state"], all_forward_outputs=[out["output"]] * 2
    )
    assert summaries == {"a/n": 2, "b/n": 2, "c/n": 2}
    with pytest.raises(graphlib.CycleError):
        _composite([dep(src="a", dst="b"), dep(src="b", dst="a")])
    with pytest.raises(ValueError, match=r"duplicate edge \(a, b\)"):
        _composite([dep(src="a", dst="b"), dep(src="a", dst="[b]")])
    with pytest.raises(ValueError, match="a and c produce key k"):
        _composite([dep(src="a", dst="b", dst_key="k"), dep(src="c", dst="b", dst_key="k")])
    calc = _composite([dep(src="a", dst="b", dst_key="x")])
    with pytest.raises(ValueError, match="b already has key x"):
        calc.forward(dict(x=1), model_params={}, state=dict(a={}, b={}, c={}))


class _MeanPrediction(GlobalMetricCalculator):
    def _calculate_metrics(self, outputs):
        weight = outputs.input_batch["weight"]
        pred = outputs.predict_outputs["pred"]
        return {"mean_pred": float(np.sum(pred * weight) / np.sum(weight)), "n": len(pred)}


def test_global_metric_calculator_sees_all_examples(tmp_path):
    w = np.linspace(-1, 1, DIM).astype(np.float32)
    summaries = _run_evaler(tmp_path, _MeanPrediction.default_config(), jnp.asarray(w))
    batches = _batches()
    pred = np.concatenate([b["x"] @ w for b in batches])
    weight = np.concatenate([b["weight"] for b in batches])
    assert summaries["n"] == len(pred)
    np.testing.assert_allclose(
        summaries["mean_pred"], np.sum(pred * weight) / np.sum(weight), rtol=1e-5
    )


@pytest.mark.parametrize("sink", [JsonlExampleRecordSink, TfExampleRecordSink])
def test_output_record_writer(tmp_path, sink):
    path = os.path.join(str(tmp_path), "out-{process_index:05d}-of-{process_count:05d}")
    writer = (
        OutputRecordWriter.default_config()
        .set(
            name="writer",
            batch_partition_spec=DataPartitionType.FULL,
            sink=sink.default_config().set(output_path=path),
        )
        .instantiate(parent=None)
    )
    logits = np.arange(24, dtype=np.float32).reshape(8, 3)
    ids = np.arange(8, dtype=np.int32)
    with jax.set_mesh(_mesh()):
        batch = host_to_global_device_array(dict(logits=logits, ids=ids))
        writer.write(input_batch={}, output_batch=batch)
    writer.flush()
    out_path = path.format(process_index=0, process_count=1)
    if sink is JsonlExampleRecordSink:
        with open(out_path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        got_logits = [r["logits"] for r in records]
        got_ids = [r["ids"] for r in records]
    else:
        spec = {
            "logits": tf.io.FixedLenFeature([3], tf.float32),
            "ids": tf.io.FixedLenFeature([1], tf.int64),
        }
        records = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(out_path)]
        got_logits = [r["logits"].numpy().tolist() for r in records]
        got_ids = [int(r["ids"].numpy()[0]) for r in records]
    assert got_logits == logits.tolist()
    assert got_ids == ids.tolist()
