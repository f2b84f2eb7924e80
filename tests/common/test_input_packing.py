"""Tests axlearn/common/input_packing.py (input_lm._trim_and_pack_with_segments)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.input_lm import _trim_and_pack_with_segments


def _source(examples):
    def gen():
        for ex in examples:
            yield {k: np.array(v, np.int32) for k, v in ex.items()}

    sig = {k: tf.TensorSpec([None], tf.int32) for k in examples[0]}
    return tf.data.Dataset.from_generator(gen, output_signature=sig)


def test_trim_and_pack_next_fit():
    # Lengths a: 5, b: 3. Hand-packed:
    # row 1: ex1 (a [7, 8], b [1]) + ex2 (a [9], b [2, 3]) -> a 3/5, b 3/3 full.
    # ex3 (a [4, 4, 4, 4, 4, 4] trimmed to 5, b []) does not fit b? b 3 + 0 <= 3 fits, but
    # a 3 + 5 > 5 -> row 2 starts with ex3; ex4 (a [], b [6]) fits a 5 + 0, b 0 + 1.
    examples = [
        {"a": [7, 8], "b": [1]},
        {"a": [9], "b": [2, 3]},
        {"a": [4, 4, 4, 4, 4, 4], "b": []},
        {"a": [], "b": [6]},
    ]
    rows = list(_trim_and_pack_with_segments({"a": 5, "b": 3})(_source(examples)))
    expected = [
        {
            "a": [7, 8, 9, 0, 0],
            "a_positions": [0, 1, 0, 0, 0],
            "a_segment_ids": [1, 1, 2, 0, 0],
            "b": [1, 2, 3],
            "b_positions": [0, 0, 1],
            "b_segment_ids": [1, 2, 2],
        },
        {
            "a": [4, 4, 4, 4, 4],
            "a_positions": [0, 1, 2, 3, 4],
            "a_segment_ids": [1, 1, 1, 1, 1],
            "b": [6, 0, 0],
            "b_positions": [0, 0, 0],
            "b_segment_ids": [2, 0, 0],
        },
    ]
    assert len(rows) == len(expected)
    for row, exp in zip(rows, expected):
        assert set(row) == set(exp)
        for key, value in exp.items():
            np.testing.assert_array_equal(row[key].numpy(), value, err_msg=key)


def test_trim_and_pack_every_token_once():
    rng = np.random.default_rng(0)
    examples = [{"x": rng.integers(1, 100, size=rng.integers(0, 6)).tolist()} for _ in range(30)]
    rows = list(_trim_and_pack_with_segments({"x": 7})(_source(examples)))
    tokens = np.concatenate([r["x"].numpy()[r["x_segment_ids"].numpy() > 0] for r in rows])
    np.testing.assert_array_equal(tokens, np.concatenate([ex["x"] for ex in examples]))


def test_trim_and_pack_rejects_bad_lengths_and_ranks():
    with pytest.raises(ValueError, match="lengths must be positive"):
        _trim_and_pack_with_segments({"x": 0})
    ds = tf.data.Dataset.from_tensors({"x": tf.zeros([2, 2], tf.int32)})
    with pytest.raises(ValueError, match="'x' must be a rank-1 tensor"):
        _trim_and_pack_with_segments({"x": 3})(ds)
