"""Tests for axlearn/common/inference_pipeline.py: popping and merging string tensors."""

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.inference_pipeline import merge_with_string_tensors, pop_string_tensors


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
