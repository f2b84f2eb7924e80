"""Tests of axlearn.common.ein_ops.rearrange against NumPy reshape/transpose."""

import numpy as np
import pytest

from axlearn.common.ein_ops import rearrange, repeat


def test_rearrange_matches_numpy():
    x = np.arange(2 * 3 * 12).reshape(2, 3, 12)
    out = rearrange(x, "b t (h d) -> b h t d", h=4)
    np.testing.assert_array_equal(out, x.reshape(2, 3, 4, 3).transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(rearrange(out, "b h t d -> b t (h d)"), x)
    w = np.arange(3 * 4 * 5).reshape(3, 1, 4, 5)
    np.testing.assert_array_equal(rearrange(w, "t 1 i o -> t i o"), w[:, 0])
    np.testing.assert_array_equal(rearrange(w[:, 0], "t i o -> t 1 i o"), w)


def test_rearrange_errors():
    x = np.zeros((2, 6))
    with pytest.raises(ValueError, match="has 3 input axes"):
        rearrange(x, "a b c -> a b c")
    with pytest.raises(ValueError, match=r"give the sizes of \['c'\]"):
        rearrange(x, "a (b c) -> a b c")
    with pytest.raises(ValueError, match="both sides must name the same axes"):
        rearrange(x, "a b -> a")


def test_repeat_matches_numpy():
    x = np.arange(6).reshape(2, 3, 1)
    np.testing.assert_array_equal(repeat(x, "b t 1 -> b t n", n=4), np.repeat(x, 4, axis=2))
    np.testing.assert_array_equal(repeat(np.arange(3), "t -> (n t)", n=2), np.tile(np.arange(3), 2))
    np.testing.assert_array_equal(
        repeat(np.arange(3), "t -> t n", n=2), np.repeat(np.arange(3)[:, None], 2, axis=1)
    )
    with pytest.raises(ValueError, match=r"give the sizes of new axes \['n'\]"):
        repeat(x, "b t 1 -> b t n")
