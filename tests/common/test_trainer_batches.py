"""Tests of axlearn/common/trainer_batches.py: host batches to global arrays on the mesh."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from axlearn.common.trainer_batches import BatchFeeder


class _ListInput:
    """An input whose dataset() is a list of host batches (iterated from its start)."""

    def __init__(self, batches):
        self._batches = batches

    def dataset(self):
        return list(self._batches)


def _batches(n, batch_size=8, seq=4):
    return [
        {
            "input_ids": np.arange(batch_size * seq, dtype=np.int32).reshape(batch_size, seq)
            + 100 * i
        }
        for i in range(n)
    ]


def test_to_global_shards_over_the_batch_axes_and_keeps_values():
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    mesh = jax.sharding.Mesh(devices, ("data", "model"))
    logs = []
    feeder = BatchFeeder(
        _ListInput(_batches(3)),
        mesh=mesh,
        batch_axis_names="data",
        log=lambda msg, *args: logs.append(msg % args),
    )
    assert feeder.global_batch_size is None
    host = list(feeder.new_iterator())
    assert len(host) == 3
    for i, batch in enumerate(host):
        out = feeder.to_global(batch)
        arr = out["input_ids"]
        assert isinstance(arr, jax.Array) and arr.shape == (8, 4)
        np.testing.assert_array_equal(np.asarray(arr), _batches(3)[i]["input_ids"])
        assert arr.sharding.spec == PartitionSpec("data")
        # Each of the 4 data shards holds 2 rows; the model axis replicates them.
        rows = sorted({(s.index[0].start, s.index[0].stop) for s in arr.addressable_shards})
        assert rows == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert feeder.global_batch_size == 8 * jax.process_count()
    assert len(logs) == 1 and "Global batch 8" in logs[0]  # Logged once per iterator.


def test_new_iterator_restarts_and_picks_the_spec_again():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    logs = []
    feeder = BatchFeeder(
        _ListInput(_batches(2, batch_size=8)),
        mesh=mesh,
        batch_axis_names="data",
        log=lambda msg, *args: logs.append(msg % args),
    )
    first = next(feeder.new_iterator())
    feeder.to_global(first)
    again = next(feeder.new_iterator())
    np.testing.assert_array_equal(again["input_ids"], first["input_ids"])
    feeder.to_global(again)
    assert len(logs) == 2


def test_a_batch_the_mesh_cannot_split_is_replicated_and_an_unknown_axis_refused():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
    feeder = BatchFeeder(
        _ListInput(_batches(1, batch_size=3)),
        mesh=mesh,
        batch_axis_names="data",
        log=lambda *a: None,
    )
    out = feeder.to_global(next(feeder.new_iterator()))["input_ids"]
    # 3 rows over 8 devices: no sub-mesh of "data" divides 3, so every device holds all rows.
    assert {s.data.shape for s in out.addressable_shards} == {(3, 4)}
    np.testing.assert_array_equal(np.asarray(out), _batches(1, batch_size=3)[0]["input_ids"])
    bad = BatchFeeder(
        _ListInput(_batches(1)), mesh=mesh, batch_axis_names="dat", log=lambda *a: None
    )
    with pytest.raises(ValueError, match="batch axis 'dat' is not a mesh axis"):
        bad.to_global(next(bad.new_iterator()))
