"""Tests BoundedDataShardedAsyncCheckpointManager: bounded groups write the same arrays."""

import asyncio
import os

import jax
import numpy as np
import pytest
from jax.experimental.array_serialization import serialization
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common.array_serialization import BoundedDataShardedAsyncCheckpointManager


def test_bounded_manager_round_trip(tmp_path):
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    arrays = [jax.device_put(np.arange(64, dtype=np.float32) * (i + 1), sharding) for i in range(3)]
    specs = [
        serialization.get_tensorstore_spec(os.path.join(str(tmp_path), f"a{i}")) for i in range(3)
    ]
    # 256 bytes per array: a 300-byte bound writes them in three groups.
    manager = BoundedDataShardedAsyncCheckpointManager(max_concurrent_gb=300 / 2**30)
    assert len(manager._groups(arrays, specs)) == 3
    manager.serialize(arrays, specs, on_commit_callback=lambda: None)
    manager.wait_until_finished()

    async def read_all():
        return await asyncio.gather(
            *(serialization.async_deserialize(sharding, spec) for spec in specs)
        )

    restored = asyncio.run(read_all())
    for original, value in zip(arrays, restored):
        np.testing.assert_array_equal(np.asarray(value), np.asarray(original))


def test_bounded_manager_validation():
    with pytest.raises(ValueError, match="strictly positive"):
        BoundedDataShardedAsyncCheckpointManager(max_concurrent_gb=0)
    with pytest.raises(ValueError, match="-1 or >= 1"):
        BoundedDataShardedAsyncCheckpointManager(max_data_shard_degree=0)
