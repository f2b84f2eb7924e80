"""Tests axlearn/common/segment_tree.py against brute-force NumPy scans."""

import numpy as np
import pytest

from axlearn.common.segment_tree import BestFitSegmentTree, SegmentTree

OPS = {
    "sum": (lambda a, b: a + b, 0, np.sum),
    "max": (max, float("-inf"), np.max),
    "min": (min, float("inf"), np.min),
}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("max_index", [0, 1, 6, 7, 8, 20])
def test_random_updates_and_ranges_match_numpy(name, max_index):
    op, default, reduce = OPS[name]
    rng = np.random.default_rng(max_index)
    tree = SegmentTree(max_index=max_index, operation=op, default_value=default)
    values = np.full(max_index + 1, default, dtype=np.float64)
    for _ in range(40):
        i = int(rng.integers(0, max_index + 1))
        v = float(rng.integers(-50, 50))
        tree.update(i, v)
        values[i] = v
        lo, hi = sorted(int(x) for x in rng.integers(0, max_index + 1, size=2))
        assert tree.query_range(lo, hi) == reduce(values[lo : hi + 1])
        assert tree.get_value(i) == v


@pytest.mark.parametrize("seed", range(5))
def test_find_first_matches_a_linear_scan(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    tree = SegmentTree(max_index=n - 1, operation=max, default_value=0)
    values = rng.integers(0, 20, size=n)
    for i, v in enumerate(values):
        tree.update(i, int(v))
    for threshold in range(0, 22, 3):
        for start in range(0, n + 2, 2):
            hits = [i for i in range(start, n) if values[i] >= threshold]
            expected = hits[0] if hits else -1
            assert tree.find_first(lambda x, t=threshold: x >= t, start_index=start) == expected


def test_find_first_never_returns_padding_leaves():
    # 6 indices in 8 leaves: the padding leaves hold the default, which satisfies x >= 0.
    tree = SegmentTree(max_index=5, operation=max, default_value=0)
    tree.update(5, 3)
    assert tree.find_first(lambda x: x >= 4) == -1
    assert tree.find_first(lambda x: x >= 0, start_index=5) == 5


def test_out_of_range_queries_give_the_default_and_updates_raise():
    tree = SegmentTree(max_index=5, operation=max, default_value=0)
    with pytest.raises(IndexError, match="out of bounds"):
        tree.update(6, 1)
    with pytest.raises(IndexError):
        tree.update(-1, 1)
    assert tree.query_range(-1, 2) == 0
    assert tree.query_range(3, 2) == 0
    assert tree.get_value(9) == 0


def test_negative_values_in_a_max_tree_with_zero_default_are_rejected():
    tree = SegmentTree(max_index=3, operation=max, default_value=0)
    with pytest.raises(ValueError, match=r"Negative value -2 .*float\('-inf'\)"):
        tree.update(0, -2)
    SegmentTree(max_index=3, operation=min, default_value=0).update(0, -2)  # Not a max tree.


def test_dtype_inference():
    assert SegmentTree(3, max, 0).tree.dtype == np.int32
    assert SegmentTree(3, max, 0.0).tree.dtype == np.float64
    assert SegmentTree(3, max, False).tree.dtype == np.bool_
    assert SegmentTree(3, max, 0, dtype=np.int64).tree.dtype == np.int64
    with pytest.raises(ValueError, match="max_index"):
        SegmentTree(-1, max, 0)


def _best_fit_reference(bins, weight):
    fits = [c for c in bins if c >= weight]
    return min(fits) if fits else -1


@pytest.mark.parametrize("seed", range(4))
def test_best_fit_packing_matches_a_list_of_bins(seed):
    rng = np.random.default_rng(seed)
    capacity = 16
    tree = BestFitSegmentTree(capacity)
    bins = [capacity]  # Remaining capacities.
    for weight in rng.integers(1, capacity + 1, size=60):
        weight = int(weight)
        best = tree.find_best_fit(weight)
        assert best == _best_fit_reference(bins, weight)
        if best == -1:
            tree.add_new_bin(capacity)
            bins.append(capacity)
            best = capacity
        bins.remove(best)
        bins.append(best - weight)
        tree.update_capacity(best, best - weight)
        counts = np.bincount(bins, minlength=capacity + 1)
        np.testing.assert_array_equal(tree.get_bin_by_capacity(), counts)
        assert tree.get_max_available_capacity() == max(bins)
        for c in range(1, capacity + 1):
            assert tree.get_tree_value_at_capacity(c) == (c if counts[c] else 0)
            assert tree.get_bin_count_at_capacity(c) == counts[c]
    assert tree.find_best_fit(0) == -1
    assert tree.find_best_fit(capacity + 1) == -1


def test_best_fit_rejects_non_positive_capacity():
    with pytest.raises(ValueError, match="max_capacity must be positive"):
        BestFitSegmentTree(0)
