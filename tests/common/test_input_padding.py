"""Tests axlearn/common/input_padding.py and batch()'s logical feeds (input_tf_data names)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.input_tf_data import (
    _infer_cardinality,
    _pad_for_evaluation,
    _pad_logical_to_physical,
    batch,
    default_pad_example_fn,
)
from axlearn.common.utils import PHYSICAL_TO_LOGICAL_DISPATCH_KEY as DISPATCH


def _ds(n: int) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(
        {"x": tf.range(1, n + 1), "is_valid": tf.ones([n], tf.bool)}
    )


def test_infer_cardinality():
    assert _infer_cardinality(_ds(5)) == 5
    assert _infer_cardinality(_ds(5).filter(lambda ex: ex["x"] % 2 == 0)) == 2  # Counted.
    assert _infer_cardinality(_ds(5).repeat()) == tf.data.INFINITE_CARDINALITY


@pytest.mark.parametrize("n,batch_size,expected_pad", [(5, 2, 1), (6, 3, 0), (1, 4, 3)])
def test_pad_for_evaluation(n, batch_size, expected_pad):
    out = list(
        _pad_for_evaluation(
            _ds(n), per_feed_batch_size=batch_size, pad_example_fn=default_pad_example_fn
        ).as_numpy_iterator()
    )
    assert [ex["x"] for ex in out] == list(range(1, n + 1)) + [0] * expected_pad
    assert [bool(ex["is_valid"]) for ex in out] == [True] * n + [False] * expected_pad


def test_pad_for_evaluation_rejects_infinite():
    with pytest.raises(ValueError, match="must be finite"):
        _pad_for_evaluation(
            _ds(2).repeat(), per_feed_batch_size=2, pad_example_fn=default_pad_example_fn
        )


def test_pad_logical_to_physical_logical_feed():
    # Global logical batch 4 over 2 logical feeds (2 each), physical batch 6 over 2 feeds (3
    # each): feed 1 puts its 2 examples first, then one padding row; its rows dispatch to
    # logical positions 2 and 3.
    ds = _pad_logical_to_physical(
        _ds(5),
        global_batch_size=6,
        global_logical_batch_size=4,
        num_logical_feeds=2,
        logical_feed_index=1,
        pad_example_fn=default_pad_example_fn,
        num_physical_feeds=2,
    ).batch(3)
    batches = list(ds.as_numpy_iterator())
    assert len(batches) == 2  # 5 examples -> 2 groups of 2 (the last one dropped).
    np.testing.assert_array_equal(batches[0]["x"], [1, 2, 0])
    np.testing.assert_array_equal(batches[1]["x"], [3, 4, 0])
    np.testing.assert_array_equal(batches[1]["is_valid"], [True, True, False])
    expected = np.zeros([3, 4], bool)
    expected[0, 2] = expected[1, 3] = True
    np.testing.assert_array_equal(batches[0][DISPATCH], expected)


def test_pad_logical_to_physical_non_logical_feed_uses_process_count():
    with mock.patch("jax.process_count", return_value=4):
        ds = _pad_logical_to_physical(
            _ds(4),
            global_batch_size=8,
            global_logical_batch_size=2,
            num_logical_feeds=1,
            logical_feed_index=None,
            pad_example_fn=default_pad_example_fn,
        ).batch(2)
    batches = list(ds.as_numpy_iterator())
    assert len(batches) == 2
    for b in batches:
        np.testing.assert_array_equal(b["x"], [0, 0])
        np.testing.assert_array_equal(b[DISPATCH], np.zeros([2, 2], bool))


def test_pad_logical_to_physical_rejects_bad_sizes():
    kwargs = dict(num_logical_feeds=1, logical_feed_index=0, pad_example_fn=default_pad_example_fn)
    with pytest.raises(ValueError, match="exceeds its physical batch"):
        _pad_logical_to_physical(
            _ds(2), global_batch_size=2, global_logical_batch_size=4, num_physical_feeds=2, **kwargs
        )
    with pytest.raises(ValueError, match="divisible by the number of physical feeds"):
        _pad_logical_to_physical(
            _ds(2), global_batch_size=3, global_logical_batch_size=1, num_physical_feeds=2, **kwargs
        )


@pytest.mark.parametrize("is_training", [False, True])
def test_batch_logical_feeds(is_training):
    # 3 examples; logical batch 2 read by feed 0 only; physical batch 3 over one feed.
    fn = batch(
        3,
        is_training=is_training,
        pad_example_fn=default_pad_example_fn,
        global_logical_batch_size=2,
        logical_feed_indices=[0],
    )
    batches = list(fn(_ds(3)).take(3).as_numpy_iterator())
    np.testing.assert_array_equal(batches[0]["x"], [1, 2, 0])
    np.testing.assert_array_equal(batches[0][DISPATCH], [[1, 0], [0, 1], [0, 0]])
    if is_training:
        # The incomplete logical batch is dropped; the data repeat.
        np.testing.assert_array_equal(batches[1]["x"], [1, 2, 0])
    else:
        # Evaluation pads the last logical batch: example 3 and one padding example.
        assert len(batches) == 2
        np.testing.assert_array_equal(batches[1]["x"], [3, 0, 0])
        np.testing.assert_array_equal(batches[1]["is_valid"], [True, False, False])


def test_batch_non_logical_feed():
    fn = batch(
        4,
        is_training=False,
        pad_example_fn=default_pad_example_fn,
        global_logical_batch_size=2,
        logical_feed_indices=[0],
        num_physical_feeds=2,
        physical_feed_index=1,
    )
    batches = list(fn(_ds(4)).as_numpy_iterator())
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[0]["x"], [0, 0])
    np.testing.assert_array_equal(batches[0][DISPATCH], np.zeros([2, 2], bool))
