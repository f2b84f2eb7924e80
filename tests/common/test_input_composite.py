"""Tests axlearn/common/input_composite.py."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common import input_tf_data
from axlearn.common.config import config_for_function
from axlearn.common.input_composite import ConcatenatedInput, ZipInput


def _numbers(is_training: bool, numbers: list, key: str = "number"):
    del is_training
    return lambda: tf.data.Dataset.from_tensor_slices({key: tf.constant(numbers, tf.int32)})


def _input(numbers, *, batch_size, key="number", repeat=1):
    return input_tf_data.Input.default_config().set(
        source=config_for_function(_numbers).set(numbers=numbers, key=key),
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=batch_size,
            pad_example_fn=input_tf_data.default_pad_example_fn,
            repeat=repeat,
        ),
    )


def test_concatenated_input_reads_inputs_in_order():
    cfg = ConcatenatedInput.default_config().set(
        name="input",
        is_training=False,
        inputs=[_input([1, 2, 3], batch_size=2), _input([7, 8], batch_size=2)],
    )
    batches = [b["number"].tolist() for b in cfg.instantiate(parent=None)]
    assert batches == [[1, 2], [3, 0], [7, 8]]
    with pytest.raises(ValueError, match="inputs"):
        ConcatenatedInput.default_config().set(name="x", is_training=False).instantiate(parent=None)


def test_zip_input_stops_at_the_shortest():
    cfg = ZipInput.default_config().set(
        name="input",
        is_training=False,
        inputs={
            "a": _input([1, 2, 3, 4], batch_size=2, key="x"),
            "b": _input([5, 6, 7, 8, 9, 10], batch_size=3, key="y"),
        },
    )
    zipped = cfg.instantiate(parent=None)
    batches = list(zipped)
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[1]["a"]["x"], [3, 4])
    np.testing.assert_array_equal(batches[1]["b"]["y"], [8, 9, 10])
    spec = zipped.element_spec()
    assert spec["a"]["x"].shape == (2,) and spec["b"]["y"].shape == (3,)
