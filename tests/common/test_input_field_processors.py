"""Tests axlearn/common/input_field_processors.py (input_tf_data names)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.input_tf_data import (
    extract_from_sequence,
    preserve_element_spec,
    ragged_to_tensor,
    squeeze_fields,
)


def _one(example, signature=None):
    if signature is None:
        return tf.data.Dataset.from_tensors(example)
    return tf.data.Dataset.from_generator(lambda: iter([example]), output_signature=signature)


def test_squeeze_fields():
    ds = _one({"a": np.zeros([1, 3, 1]), "b": np.zeros([1, 2]), "c": np.zeros([2, 1])})
    out = squeeze_fields(axis={"a": None, "b": 0})(ds)
    spec = out.element_spec
    assert spec["a"].shape == (3,) and spec["b"].shape == (2,) and spec["c"].shape == (2, 1)


def test_squeeze_fields_names_missing_field():
    with pytest.raises(KeyError, match=r"fields \['zz'\] are not in the examples"):
        squeeze_fields(axis={"zz": 0})(_one({"a": np.zeros([1])}))


def test_ragged_to_tensor_pads_and_truncates():
    ds = _one({"r": tf.ragged.constant([[1, 2, 3, 4], [5]]), "d": tf.constant([7])})
    out = next(iter(ragged_to_tensor({"r": [None, 3], "d": [4]}, default_value=-1)(ds)))
    np.testing.assert_array_equal(out["r"].numpy(), [[1, 2, 3], [5, -1, -1]])
    np.testing.assert_array_equal(out["d"].numpy(), [7])  # Dense fields are unchanged.


@pytest.mark.parametrize("idx,expected", [(2, b"c"), (-1, b"d"), (slice(1, 3), [b"b", b"c"])])
def test_extract_from_sequence(idx, expected):
    ds = _one({"seq": tf.constant(["a", "b", "c", "d"])})
    out = next(iter(extract_from_sequence(in_key="seq", out_key="pick", idx=idx)(ds)))
    assert out["seq"].numpy().tolist() == [b"a", b"b", b"c", b"d"]
    got = out["pick"].numpy()
    assert (got.tolist() if isinstance(expected, list) else got) == expected


def test_preserve_element_spec_restores_py_function_shapes():
    def mapper(ds):
        def fn(ex):
            text = tf.py_function(lambda x: x, [ex["text"]], Tout=tf.string)
            return {"text": text, "copy": text, "n": ex["n"]}

        return ds.map(fn)

    ds = _one({"text": tf.constant("hi"), "n": tf.constant([1, 2])})
    assert mapper(ds).element_spec["text"].shape.rank is None
    out = preserve_element_spec(mapper, key_map={"copy": "text"})(ds)
    assert out.element_spec["text"].shape == () and out.element_spec["copy"].shape == ()
    assert out.element_spec["n"].shape == (2,)
    assert next(iter(out))["copy"].numpy() == b"hi"
