"""Tests axlearn/common/input_fake_sources.py (re-exported by input_fake)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.input_fake import fake_serialized_json_source, fake_source, fake_text_source


def test_fake_source_yields_examples_in_order_once_for_eval():
    examples = [{"x": np.array([1, 2, 3])}, {"x": np.array([4])}, {"x": np.array([5, 6])}]
    ds = fake_source(is_training=False, examples=examples)()
    got = [ex["x"].tolist() for ex in ds.as_numpy_iterator()]
    assert got == [[1, 2, 3], [4], [5, 6]]
    # Lengths differ, so the common spec leaves the length unknown.
    assert ds.element_spec["x"].shape.as_list() == [None]


def test_fake_source_spec_relaxes_static_shape_and_casts():
    spec = {"a": tf.TensorSpec([None, 2], tf.int64)}
    ds = fake_source(is_training=False, examples=[{"a": [[1, 2], [3, 4]]}], spec=spec)()
    assert ds.element_spec["a"].shape.as_list() == [None, 2]
    assert ds.element_spec["a"].dtype == tf.int64
    np.testing.assert_array_equal(next(iter(ds))["a"].numpy(), [[1, 2], [3, 4]])


def test_fake_source_training_repeats():
    ds = fake_source(is_training=True, examples=[{"t": "a"}, {"t": "b"}])()
    got = [ex["t"] for ex in ds.take(5).as_numpy_iterator()]
    assert got == [b"a", b"b", b"a", b"b", b"a"]


def test_fake_source_ragged_examples():
    examples = [{"r": tf.ragged.constant([[1, 2], [3]])}, {"r": tf.ragged.constant([[4]])}]
    got = [ex["r"].to_list() for ex in fake_source(is_training=False, examples=examples)()]
    assert got == [[[1, 2], [3]], [[4]]]


def test_fake_source_rejects_empty():
    with pytest.raises(ValueError, match="examples must not be empty"):
        fake_source(is_training=False, examples=[])


def test_fake_text_source():
    ds = fake_text_source(is_training=False, text_field_name="body", batch_size=3)()
    assert [ex["body"] for ex in ds.as_numpy_iterator()] == [
        b"eval text 0",
        b"eval text 1",
        b"eval text 2",
    ]
    train = fake_text_source(is_training=True)()
    assert [ex["text"] for ex in train.take(21).as_numpy_iterator()][19:] == [
        b"train text 19",
        b"train text 0",
    ]


def test_fake_serialized_json_source():
    examples = [{"a": 1}, {"b": [2, "x"]}]
    ds = fake_serialized_json_source(examples)()
    assert ds.element_spec == tf.TensorSpec([], tf.string)
    assert [json.loads(t) for t in ds.as_numpy_iterator()] == examples


def test_fake_source_rejects_mismatched_examples():
    with pytest.raises(ValueError, match="example 1 .* does not match the examples before it"):
        fake_source(is_training=False, examples=[{"a": 1}, {"b": 2}])()
