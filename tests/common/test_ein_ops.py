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
    with pytest.raises(ValueError, match="Incompatible shape reshape"):
        rearrange(x, "a b c -> a b c")
    with pytest.raises(ValueError, match=r"Multiple unknown axes \(b, c\)"):
        rearrange(x, "a (b c) -> a b c")
    with pytest.raises(ValueError, match="Mismatch between LHS axes and RHS axes"):
        rearrange(x, "a b -> a")
    with pytest.raises(ValueError, match="Missing axis c in input"):
        rearrange(x, "a b -> a c")
    with pytest.raises(ValueError, match="Unexpected characters in pattern: '2'"):
        rearrange(x, "a b -> a b 2")
    with pytest.raises(ValueError, match="asymmetrically"):
        rearrange(x, "a ... -> a")


def test_ellipsis_matches_numpy():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(rearrange(x, "a ... b -> ... b a"), x.transpose(1, 2, 3, 0))
    np.testing.assert_array_equal(rearrange(x, "a ... -> a (...)"), x.reshape(2, 60))
    np.testing.assert_array_equal(
        rearrange(x.reshape(2, 3, 20), "... (g h) -> ... h g", g=4), x.transpose(0, 1, 3, 2)
    )
    np.testing.assert_array_equal(repeat(x, "... c -> ... (c k)", k=2), np.repeat(x, 2, axis=-1))
    with pytest.raises(ValueError, match="reordering"):
        repeat(x, "a ... -> ... a")


def test_repeat_matches_numpy():
    x = np.arange(6).reshape(2, 3, 1)
    np.testing.assert_array_equal(repeat(x, "b t 1 -> b t n", n=4), np.repeat(x, 4, axis=2))
    np.testing.assert_array_equal(repeat(np.arange(3), "t -> (n t)", n=2), np.tile(np.arange(3), 2))
    np.testing.assert_array_equal(
        repeat(np.arange(3), "t -> t n", n=2), np.repeat(np.arange(3)[:, None], 2, axis=1)
    )
    with pytest.raises(ValueError, match=r"give the sizes of new axes \['n'\]"):
        repeat(x, "b t 1 -> b t n")
