"""Tests of axlearn.common.input_grain_transforms (shard_dataset_with_proportion) vs NumPy."""

import grain
import numpy as np
import pytest

from axlearn.common.input_grain import shard_dataset_with_proportion


def test_shard_dataset_with_proportion_matches_numpy():
    for n, (start, end, period) in [
        (20, (0, 1, 1)),
        (20, (1, 2, 2)),
        (20, (0, 3, 8)),
        (23, (5, 8, 8)),
        (20, (0, 2, 13)),
        (3, (4, 6, 8)),
    ]:
        base = grain.MapDataset.range(n).map(lambda x: x * 10)
        shard = shard_dataset_with_proportion(base, range_start=start, range_end=end, period=period)
        positions = np.arange(n)
        expected = positions[(positions % period >= start) & (positions % period < end)] * 10
        assert len(shard) == len(expected)
        assert [shard[i] for i in range(len(shard))] == expected.tolist()
        assert list(shard.repeat(2)) == expected.tolist() * 2
    # Shares 30/70 of period 100 partition the dataset.
    base = grain.MapDataset.range(250)
    parts = [
        list(shard_dataset_with_proportion(base, range_start=a, range_end=b, period=100))
        for a, b in [(0, 30), (30, 100)]
    ]
    assert sorted(parts[0] + parts[1]) == list(range(250)) and len(parts[0]) == 90
    for bad in [(2, 2, 4), (0, 5, 4), (-1, 1, 4)]:
        with pytest.raises(ValueError, match="are invalid"):
            shard_dataset_with_proportion(base, range_start=bad[0], range_end=bad[1], period=bad[2])
    with pytest.raises(ValueError, match="shard a MapDataset"):
        shard_dataset_with_proportion(base.to_iter_dataset(), range_start=0, range_end=1, period=2)


def test_unbatch_ragged_tensor_rows_come_out_as_they_are():
    from axlearn.common.input_grain import RaggedTensor, maybe_to_iter_dataset, unbatch

    rows = [np.arange(2), np.arange(5), np.zeros((2, 3))]  # Three shapes: no stacking possible.
    batches = [{"x": np.array([7, 8, 9]), "z": RaggedTensor(rows)}]
    out = list(unbatch(maybe_to_iter_dataset(grain.MapDataset.source(batches))))
    assert [int(e["x"]) for e in out] == [7, 8, 9]
    for example, row in zip(out, rows):
        np.testing.assert_array_equal(example["z"], row)
    bad = [{"x": np.array([1, 2]), "z": RaggedTensor(rows)}]  # 2 rows vs 3.
    with pytest.raises(ValueError, match=r"different batch sizes \[2, 3\]"):
        list(unbatch(grain.MapDataset.source(bad)))


def test_unbatch_empty_batches_raise_unless_skipped():
    from axlearn.common.input_grain import EmptyBatchError, unbatch

    batches = [
        {"x": np.zeros([0])},
        {},  # No leaves: always yields nothing.
        {"x": np.array([4, 5])},
        {"x": np.zeros([0])},
        {"x": np.array([6])},
    ]
    ds = grain.MapDataset.source(batches)
    assert [int(e["x"]) for e in unbatch(ds, skip_empty_batch=True)] == [4, 5, 6]
    it = iter(unbatch(ds, skip_empty_batch=True))
    next(it)
    state = it.get_state()
    it2 = iter(unbatch(ds, skip_empty_batch=True))
    it2.set_state(state)
    assert [int(e["x"]) for e in it2] == [5, 6]
    with pytest.raises(EmptyBatchError, match="skip_empty_batch=True"):
        list(unbatch(ds))
    assert issubclass(EmptyBatchError, ValueError)
    with pytest.raises(ValueError, match="no batch axis"):
        list(unbatch(grain.MapDataset.source([{"x": np.int32(3)}])))
