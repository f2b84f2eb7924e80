"""Tests for axlearn/common/inference_output.py: _json_feature, InputOutputRecordWriter."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.inference_output import (
    BaseOutputWriter,
    InputOutputRecordWriter,
    JsonlExampleRecordSink,
    OutputRecordWriter,
    TfExampleRecordSink,
    _json_feature,
)
from axlearn.common.utils import DataPartitionType


@pytest.mark.parametrize(
    "value,expected",
    [
        (tf.constant("é"), "é"),
        (tf.constant(["a", "bc"]), ["a", "bc"]),
        (tf.constant([[1, 2]]), [[1, 2]]),
        (np.float32(0.5), 0.5),
        (np.asarray([True, False]), [True, False]),
        (b"raw", "raw"),
    ],
)
def test_json_feature(value, expected):
    got = _json_feature(value)
    assert got == expected
    json.dumps(got)


def test_output_writer_default_sink_and_base():
    cfg = OutputRecordWriter.default_config()
    assert cfg.sink.klass is TfExampleRecordSink
    assert issubclass(OutputRecordWriter, BaseOutputWriter)
    base = BaseOutputWriter.default_config().set(name="w", batch_partition_spec="x")
    with pytest.raises(NotImplementedError):
        base.instantiate(parent=None).write(input_batch={}, output_batch={})


def test_input_output_record_writer(tmp_path):
    path = os.path.join(str(tmp_path), "out-{process_index}")
    writer = (
        InputOutputRecordWriter.default_config()
        .set(
            name="writer",
            batch_partition_spec=DataPartitionType.FULL,
            sink=JsonlExampleRecordSink.default_config().set(output_path=path),
        )
        .instantiate(parent=None)
    )
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    writer.write(
        input_batch=dict(x=x, q=tf.constant(["a", "b", "c"])),
        output_batch=dict(y=x.sum(axis=1)),
    )
    writer.flush()
    with open(path.format(process_index=0), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert records == [
        {"input/x": [0.0, 1.0], "input/q": "a", "output/y": 1.0},
        {"input/x": [2.0, 3.0], "input/q": "b", "output/y": 5.0},
        {"input/x": [4.0, 5.0], "input/q": "c", "output/y": 9.0},
    ]
