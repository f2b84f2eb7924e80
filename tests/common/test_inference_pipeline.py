"""Tests for axlearn/common/inference_pipeline.py: string tensors, and InferencePipeline.

The pipeline's model is `tests/common/inference_helpers.LinearModel` (x @ weight + bias); the
records it writes are checked against that product computed with NumPy.
"""

import jax
import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.config import config_for_function
from axlearn.common.inference_output import InputOutputRecordWriter, OutputRecordWriter
from axlearn.common.inference_pipeline import (
    InferencePipeline,
    merge_with_string_tensors,
    pop_string_tensors,
)
from axlearn.common.input_tf_data import identity
from axlearn.common.summary_writer import BaseWriter
from axlearn.common.utils import DataPartitionType
from tests.common.inference_helpers import (
    IN_DIM,
    OUT_DIM,
    LinearModel,
    host_params,
    numpy_forward,
    save_trainer_checkpoint,
)


def test_pop_and_merge_string_tensors():
    batch = {
        "x": np.ones((2, 3)),
        "s": tf.constant(["a", "b"]),
        "n": tf.constant([1, 2]),
        "sub": {"y": np.zeros(2), "t": tf.constant(["c", "d"])},
        "only_str": {"u": tf.constant(["e", "f"])},
    }
    rest, strings = pop_string_tensors(batch)
    assert sorted(rest) == ["n", "sub", "x"] and sorted(rest["sub"]) == ["y"]
    assert sorted(strings) == ["only_str", "s", "sub"] and sorted(strings["sub"]) == ["t"]
    merged = merge_with_string_tensors(rest, strings)
    assert sorted(merged) == sorted(batch) and sorted(merged["sub"]) == ["t", "y"]
    assert merged["only_str"]["u"] is batch["only_str"]["u"]
    assert pop_string_tensors({"x": np.ones(2)})[1] == {}


def test_merge_refuses_a_leaf_clash():
    with pytest.raises(ValueError, match="Expect args to be non-leaf nodes"):
        merge_with_string_tensors({"k": np.ones(2)}, {"k": tf.constant(["a", "b"])})


# --- InferencePipeline: input -> runner method -> output records, summaries per batch. ---

_NUM_BATCHES = 3
_BATCH = 8


def _string_keyed_batches(batch_size: int):
    """An input source: batches {"x": floats, "id": TF strings "ex<i>"} (a generator function)."""

    def gen():
        rng = np.random.default_rng(11)
        for b in range(_NUM_BATCHES):
            x = rng.normal(size=(batch_size, IN_DIM)).astype(np.float32)
            ids = tf.constant([f"ex{b * batch_size + i}" for i in range(batch_size)])
            yield dict(x=x, id=ids)

    return gen


class _RecordingWriter(BaseWriter):
    """A summary writer keeping (step, values) of every call."""

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        self.calls = []

    def __call__(self, step, values):
        self.calls.append((step, jax.device_get(values)))


def _pipeline_cfg(tmp_path, ckpt_dir: str) -> InferencePipeline.Config:
    cfg = InferencePipeline.default_config().set(name="pipeline", model_method="predict_dict")
    cfg.input.set(
        is_training=False,
        source=config_for_function(_string_keyed_batches).set(batch_size=_BATCH),
        processor=config_for_function(identity),
        batcher=config_for_function(identity),
    )
    cfg.runner.set(
        model=LinearModel.default_config(), mesh_shape=(4, 2), mesh_axis_names=("data", "model")
    )
    cfg.runner.init_state_builder.set(dir=ckpt_dir)
    cfg.output_writer = InputOutputRecordWriter.default_config()
    cfg.output_writer.sink.output_path = str(tmp_path / "out-{process_index:05d}")
    cfg.summary_writer = _RecordingWriter.default_config().set(dir=str(tmp_path / "summaries"))
    return cfg


def _read_records(path: str) -> list[dict]:
    schema = {
        "input/id": tf.io.FixedLenFeature([], tf.string),
        "input/x": tf.io.FixedLenFeature([IN_DIM], tf.float32),
        "output/x": tf.io.FixedLenFeature([IN_DIM], tf.float32),
        "output/y": tf.io.FixedLenFeature([OUT_DIM], tf.float32),
    }
    return [
        {k: v.numpy() for k, v in tf.io.parse_single_example(r, schema).items()}
        for r in tf.data.TFRecordDataset([path])
    ]


def test_pipeline_writes_inputs_and_outputs_equal_to_numpy_forward(tmp_path):
    params = host_params(4)
    ckpt_dir = save_trainer_checkpoint(
        str(tmp_path / "ckpt"), params=params, prng_key=jax.random.PRNGKey(0)
    )
    pipeline = _pipeline_cfg(tmp_path, ckpt_dir).instantiate(parent=None)
    pipeline.run()

    expected_x = {}
    for batch in _string_keyed_batches(_BATCH)():
        for i, key in enumerate(batch["id"].numpy()):
            expected_x[key] = batch["x"][i]
    records = _read_records(str(tmp_path / "out-00000"))
    assert len(records) == _NUM_BATCHES * _BATCH
    assert {r["input/id"] for r in records} == set(expected_x)
    for record in records:
        x = expected_x[record["input/id"]]
        np.testing.assert_array_equal(record["input/x"], x)
        np.testing.assert_array_equal(record["output/x"], x)
        np.testing.assert_allclose(
            record["output/y"], numpy_forward(params, x[None])[0], rtol=1e-5, atol=1e-5
        )
    # One summary call per batch, at step = the batch index.
    assert [step for step, _ in pipeline.summary_writer.calls] == [0, 1, 2]


def test_pipeline_summaries_are_the_method_summaries(tmp_path):
    params = host_params(5)
    ckpt_dir = save_trainer_checkpoint(
        str(tmp_path / "ckpt"), params=params, prng_key=jax.random.PRNGKey(0)
    )
    cfg = _pipeline_cfg(tmp_path, ckpt_dir).set(model_method="predict")
    cfg.output_writer = OutputRecordWriter.default_config()
    cfg.output_writer.sink.output_path = str(tmp_path / "y-{process_index:05d}")
    pipeline = cfg.instantiate(parent=None)
    # The output writer follows the runner's input partition.
    assert pipeline.output_writer.config.batch_partition_spec == DataPartitionType.FULL
    pipeline.run()
    batches = list(_string_keyed_batches(_BATCH)())
    for (_, values), batch in zip(pipeline.summary_writer.calls, batches):
        np.testing.assert_allclose(
            float(values["y_max"]), numpy_forward(params, batch["x"]).max(), rtol=1e-5
        )
    assert len(pipeline.summary_writer.calls) == _NUM_BATCHES
