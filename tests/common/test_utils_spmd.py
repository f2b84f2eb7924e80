"""Tests for axlearn/common/utils_spmd.py: mesh shapes, device meshes, batch sharding, setup."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from axlearn.common import utils_spmd
from axlearn.common.utils_spmd import (
    HybridMeshShape,
    batch_partition_spec,
    create_device_mesh,
    host_to_global_array,
    infer_mesh_shape,
)


def test_infer_mesh_shape():
    assert infer_mesh_shape((1, -1, 1, 4), num_devices=8) == (1, 2, 1, 4)
    assert infer_mesh_shape((2, 4), num_devices=8) == (2, 4)
    assert infer_mesh_shape([-1], num_devices=8) == (8,)
    assert infer_mesh_shape((1, -1)) == (1, jax.device_count())


@pytest.mark.parametrize(
    "shape,match",
    [
        ((-1, -1), "Only one axis"),
        ((3, -1), "not a multiple of the product 3"),
        ((0, -1), "positive ints"),
    ],
)
def test_infer_mesh_shape_errors(shape, match):
    with pytest.raises(ValueError, match=match):
        infer_mesh_shape(shape, num_devices=8)


def test_create_device_mesh():
    devices = create_device_mesh((1, -1, 4))
    assert devices.shape == (1, 2, 4)
    # Devices keep their order (each process's devices stay contiguous).
    assert [d.id for d in devices.flatten()] == [d.id for d in jax.devices()]
    with pytest.raises(ValueError, match="needs 16 devices but there are 8"):
        create_device_mesh((4, 4))


def test_create_hybrid_device_mesh_single_granule():
    # One process is one granule: the hybrid shape is multiplied out.
    devices = create_device_mesh(HybridMeshShape(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1)))
    assert devices.shape == (2, 4)
    with pytest.raises(ValueError, match="same length"):
        HybridMeshShape(ici_mesh_shape=(1, 4), dcn_mesh_shape=(1,))
    with pytest.raises(ValueError, match="covers 4 devices but there are 8"):
        create_device_mesh(HybridMeshShape(ici_mesh_shape=(2, 2), dcn_mesh_shape=(1, 1)))


def test_default_hybrid_split():
    # pylint: disable-next=protected-access
    hybrid = utils_spmd._default_hybrid_shape((1, 4, 8), num_granules=2)
    assert hybrid == HybridMeshShape(ici_mesh_shape=(1, 2, 8), dcn_mesh_shape=(1, 2, 1))
    with pytest.raises(ValueError, match="multiple of the number of granules 4"):
        utils_spmd._default_hybrid_shape((1, 2, 8), num_granules=4)  # pylint: disable=W0212


def _mesh(shape, names):
    return Mesh(create_device_mesh(shape), names)


@pytest.mark.parametrize(
    "shape,names,batch_axes,batch,expected",
    [
        ((8,), ("fsdp",), ("fsdp",), 16, PartitionSpec(("fsdp",))),
        ((2, 4), ("data", "fsdp"), ("data", "fsdp"), 8, PartitionSpec(("data", "fsdp"))),
        # Per-device batch below one: largest dividing sub-mesh.
        ((2, 4), ("data", "fsdp"), ("data", "fsdp"), 4, PartitionSpec(("fsdp",))),
        ((2, 4), ("data", "fsdp"), ("data", "fsdp"), 2, PartitionSpec(("data",))),
        ((8,), ("fsdp",), ("fsdp",), 4, PartitionSpec(None)),
        ((2, 4), ("data", "model"), "data", 2, PartitionSpec(("data",))),
        ((2, 4), ("data", "model"), None, 2, PartitionSpec(None)),
    ],
)
def test_batch_partition_spec(shape, names, batch_axes, batch, expected):
    mesh = _mesh(shape, names)
    assert batch_partition_spec(batch, mesh=mesh, batch_axis_names=batch_axes) == expected


def test_batch_partition_spec_unknown_axis():
    with pytest.raises(ValueError, match="batch axis 'expert' is not a mesh axis"):
        batch_partition_spec(8, mesh=_mesh((8,), ("data",)), batch_axis_names=("expert",))


@pytest.mark.parametrize("batch", [16, 4, 2])
def test_host_to_global_array(batch):
    mesh = _mesh((2, 4), ("data", "fsdp"))
    host = {"input_ids": np.arange(batch * 3, dtype=np.int32).reshape(batch, 3)}
    spec = batch_partition_spec(batch, mesh=mesh, batch_axis_names=("data", "fsdp"))
    out = host_to_global_array(host, mesh=mesh, partition=spec)
    np.testing.assert_array_equal(np.asarray(out["input_ids"]), host["input_ids"])
    assert out["input_ids"].sharding.spec == spec
    # Each device holds batch / (product of the sharded axes) rows.
    shards = out["input_ids"].addressable_shards
    axes = spec[0] or ()
    axes = (axes,) if isinstance(axes, str) else axes
    sharded = np.prod([mesh.shape[n] for n in axes])
    assert all(s.data.shape[0] == batch // sharded for s in shards)


def test_setup_validation():
    saved = jax.config.jax_default_prng_impl
    try:
        _check_setup_validation()
        # As AXLearn's launcher: setup selects the rbg PRNG (keys are uint32[4]).
        assert jax.config.jax_default_prng_impl == "rbg"
        assert jax.random.PRNGKey(0).shape == (4,)
    finally:
        jax.config.update("jax_default_prng_impl", saved)


def _check_setup_validation():
    with pytest.raises(ValueError, match="must all be None on the tpu backend"):
        utils_spmd.setup(jax_backend="tpu", num_processes=2)
    with pytest.raises(ValueError, match="must be given together"):
        utils_spmd.setup(jax_backend="cpu", num_processes=2)
    with pytest.raises(ValueError, match="distributed_coordinator"):
        utils_spmd.setup(jax_backend="cpu", num_processes=2, process_id=0)
    with pytest.raises(ValueError, match=r"process_id=3 must be in \[0, 2\)"):
        utils_spmd.setup(jax_backend="cpu", num_processes=2, process_id=3)
    # Single process: nothing to initialize.
    utils_spmd.setup(jax_backend="cpu")
    utils_spmd.setup(jax_backend="cpu", num_processes=1, process_id=0)


@dataclasses.dataclass(frozen=True)
class _FakeGpu:
    """A device without `id` (as AXLearn's tests build them): platform and process only."""

    platform: str
    device_kind: str
    process_index: int
    index: int


def test_gpu_multi_process_mesh_groups_processes():
    # 4 processes x 2 GPUs, listed interleaved; each process's GPUs form an ICI block.
    devices = [_FakeGpu("gpu", "gpu", p, i) for i in range(2) for p in range(4)]
    mesh = create_device_mesh(HybridMeshShape(ici_mesh_shape=(1, 2), dcn_mesh_shape=(4, 1)))
    assert mesh.shape == (4, 2)
    mesh = create_device_mesh(
        HybridMeshShape(ici_mesh_shape=(1, 2), dcn_mesh_shape=(4, 1)), devices=devices
    )
    assert [[d.process_index for d in row] for row in mesh] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    # A plain shape is split over processes along its first axis larger than 1.
    mesh = create_device_mesh((4, 2), devices=devices)
    assert [[(d.process_index, d.index) for d in row] for row in mesh] == [
        [(p, 0), (p, 1)] for p in range(4)
    ]
    with pytest.raises(ValueError, match="Product of DCN mesh"):
        create_device_mesh(HybridMeshShape((2, 2), (2, 1)), devices=devices)
    with pytest.raises(ValueError, match="Product of ICI mesh"):
        create_device_mesh(HybridMeshShape((2, 2), (4, 1)), devices=devices)
