"""Tests of the batch/length processors of axlearn.common.input_tf_data."""

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common import input_tf_data


def _ds(elements):
    def gen():
        yield from elements

    spec = {
        "a": tf.TensorSpec([None, 3], tf.int32),
        "b": tf.TensorSpec([None], tf.int32),
    }
    return tf.data.Dataset.from_generator(gen, output_signature=spec)


_ELEMENTS = [
    {"a": np.array([[1, 0, 0], [2, 3, 0], [4, 5, 6]]), "b": np.array([1, 2])},
    {"a": np.array([[1, 2, 0]]), "b": np.array([3])},
    {"a": np.array([[3, 0, 0]]), "b": np.array([4])},
    {"a": np.array([[1, 2, 3], [4, 0, 0]]), "b": np.array([5, 6, 7, 8])},
]


def _as_lists(ds):
    return [{k: v.tolist() for k, v in ex.items()} for ex in ds.as_numpy_iterator()]


def test_pack_to_batch():
    out = _as_lists(input_tf_data.pack_to_batch(5)(_ds(_ELEMENTS)))
    assert out == [
        {"a": [[1, 0, 0], [2, 3, 0], [4, 5, 6], [1, 2, 0], [3, 0, 0]], "b": [1, 2, 3, 4, 0]},
        {"a": [[1, 2, 3], [4, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]], "b": [5, 6, 7, 8, 0]},
    ]
    packed = input_tf_data.pack_to_batch(5, pad_value=-1)(_ds(_ELEMENTS))
    assert packed.element_spec["a"].shape.as_list() == [5, 3]
    assert _as_lists(packed)[1]["b"] == [5, 6, 7, 8, -1]
    # An element that cannot fit any batch is an error.
    with pytest.raises(tf.errors.InvalidArgumentError, match="exceeds batch_size"):
        _as_lists(input_tf_data.pack_to_batch(2)(_ds(_ELEMENTS)))
    assert _as_lists(input_tf_data.pack_to_batch(5)(_ds([]))) == []


def test_pack_to_batch_unknown_trailing_dims():
    # The same elements with trailing dimensions unknown statically pack the same way.
    def gen():
        yield from _ELEMENTS

    sig = {"a": tf.TensorSpec([None, None], tf.int64), "b": tf.TensorSpec([None], tf.int64)}
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig)
    static = _as_lists(input_tf_data.pack_to_batch(5, pad_value=-1)(_ds(_ELEMENTS)))
    assert _as_lists(input_tf_data.pack_to_batch(5, pad_value=-1)(ds)) == static
    with pytest.raises(tf.errors.InvalidArgumentError, match="exceeds batch_size"):
        _as_lists(input_tf_data.pack_to_batch(2)(ds))


def test_pad_and_trim_to_batch():
    padded = _as_lists(input_tf_data.pad_to_batch(4, pad_value=9)(_ds(_ELEMENTS[:2])))
    assert padded[0]["b"] == [1, 2, 9, 9] and padded[1]["a"][1:] == [[9, 9, 9]] * 3
    trimmed = _as_lists(input_tf_data.trim_to_batch(1)(_ds(_ELEMENTS[:1])))
    assert trimmed == [{"a": [[1, 0, 0]], "b": [1]}]


def test_trim_and_pad_tensor():
    t = tf.constant([[1, 2, 3, 4], [5, 6, 7, 8]])
    np.testing.assert_array_equal(input_tf_data.trim_and_pad_tensor(t, 2), [[1, 2], [5, 6]])
    np.testing.assert_array_equal(
        input_tf_data.trim_and_pad_tensor(t, 6, pad_id=-1),
        [[1, 2, 3, 4, -1, -1], [5, 6, 7, 8, -1, -1]],
    )
    ragged = tf.ragged.constant([[1], [2, 3, 4]])
    out = input_tf_data.trim_and_pad_tensor(ragged, 2)
    assert out.shape.as_list() == [2, 2]
    np.testing.assert_array_equal(out, [[1, 0], [2, 3]])


def test_add_static_fields_and_unpack():
    ds = tf.data.Dataset.from_tensors({"x": {"y": {"z": tf.constant(3)}}, "w": tf.constant(1)})
    ds = input_tf_data.add_static_fields({"s": "hi"})(ds)
    ds = input_tf_data.unpack({"z": ("x", "y", "z")})(ds)
    (ex,) = list(ds.as_numpy_iterator())
    assert ex["z"] == 3 and ex["w"] == 1 and ex["s"] == b"hi" and ex["x"]["y"]["z"] == 3
    with pytest.raises(KeyError, match="'x', 'q'"):
        input_tf_data.unpack({"z": ("x", "q")})(tf.data.Dataset.from_tensors({"x": {"y": 1}}))
