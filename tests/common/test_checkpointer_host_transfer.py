"""Tests of axlearn/common/checkpointer/host_transfer.py: the route a device snapshot takes to
host memory. (The storage's use of both routes, with bit-identical restores, is tested in
test_checkpointer_snapshot_choice.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.checkpointer import host_transfer


class _DeviceWithMemories:
    """Stands in for a jax.Device: only what `resolve_host_transfer` reads."""

    def __init__(self, platform, kinds):
        self.platform, self._kinds = platform, kinds

    def addressable_memories(self):
        return [type("Memory", (), {"kind": k})() for k in self._kinds]

    def __str__(self):
        return f"{self.platform}:0"


def test_host_transfer_route_per_device():
    resolve = host_transfer.resolve_host_transfer
    gpu = _DeviceWithMemories("gpu", ["device", "pinned_host"])
    assert resolve(None, gpu) == "pinned_host"
    assert resolve("numpy", gpu) == "numpy"
    # A CPU's "device" memory is host memory: np.asarray is a plain memcpy there.
    assert resolve(None, jax.devices()[0]) == "numpy"
    assert resolve("pinned_host", jax.devices()[0]) == "pinned_host"
    bare = _DeviceWithMemories("gpu", ["device"])
    assert resolve(None, bare) == "numpy"
    with pytest.raises(ValueError, match="device gpu:0 has no pinned_host memory"):
        resolve("pinned_host", bare)


class _Shard:
    def __init__(self, data):
        self.data, self.host_array = data, None


@pytest.mark.parametrize("route", ["pinned_host", "numpy"])
def test_copy_to_host_by_either_route(route):
    source = jnp.arange(1024, dtype=jnp.float32).reshape(32, 32) * 0.5
    shard = _Shard(source)
    host_transfer.start_host_copy(shard, route)
    assert (shard.host_array is not None) == (route == "pinned_host")
    host_transfer.finish_host_copy(shard)
    assert isinstance(shard.data, np.ndarray)
    np.testing.assert_array_equal(
        shard.data, np.arange(1024, dtype=np.float32).reshape(32, 32) * 0.5
    )
    # On a CPU the result is a copy the caller owns: the source may be donated and reused.
    assert shard.host_array is None
    assert not np.shares_memory(shard.data, np.asarray(source))


def test_reserve_pinned_host_stays_within_budget_and_frees_its_copies():
    mesh = jax.make_mesh((8,), ("x",))
    # 1 KB per shard, and a replicated 512 B.
    sharded = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, PartitionSpec("x")))
    replicated = jax.device_put(jnp.ones((128,)), NamedSharding(mesh, PartitionSpec()))
    arrays = [sharded, replicated]
    # Everything: 8 shards of 1 KB, and the replicated array's replica 0 only.
    assert (
        host_transfer.reserve_pinned_host(arrays, host_transfer="pinned_host", budget_bytes=1 << 20)
        == 8 * 1024 + 512
    )
    assert (
        host_transfer.reserve_pinned_host(arrays, host_transfer="pinned_host", budget_bytes=3000)
        <= 3000
    )
    # CPU's default route is numpy: nothing to set up.
    assert host_transfer.reserve_pinned_host(arrays, host_transfer=None, budget_bytes=1 << 20) == 0
    assert not [a for a in jax.live_arrays() if a.sharding.memory_kind == "pinned_host"]
