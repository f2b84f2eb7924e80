"""Tests axlearn/common/input_ranking.py against scipy-free NumPy rank references."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.input_ranking import rank_by_value


def _reference(values: np.ndarray, *, ascending: bool, allow_ties: bool) -> list[int]:
    keys = values if ascending else -values
    if allow_ties:  # Competition ranking: 1 + the number of strictly better values.
        return [int(1 + np.sum(keys < k)) for k in keys]
    order = np.argsort(keys, kind="stable")
    ranks = np.empty(len(keys), np.int64)
    ranks[order] = np.arange(1, len(keys) + 1)
    return ranks.tolist()


@pytest.mark.parametrize("ascending", [True, False])
@pytest.mark.parametrize("allow_ties", [True, False])
def test_rank_by_value_matches_reference(ascending, allow_ties):
    rng = np.random.default_rng(0)
    for size in (0, 1, 7, 30):
        values = rng.integers(0, 5, size=size).astype(np.float32)  # Many ties.
        ds = tf.data.Dataset.from_tensors({"label": tf.constant(values, shape=[size])})
        fn = rank_by_value(
            input_key="label", output_key="rank", ascending=ascending, allow_ties=allow_ties
        )
        ex = next(iter(fn(ds)))
        assert ex["rank"].numpy().tolist() == _reference(
            values, ascending=ascending, allow_ties=allow_ties
        )


def test_rank_by_value_rejects_rank_2():
    ds = tf.data.Dataset.from_tensors({"label": tf.zeros([2, 3])})
    with pytest.raises(NotImplementedError, match="rank-1"):
        rank_by_value(input_key="label", output_key="r", ascending=True, allow_ties=True)(ds)
