"""Host/global data helpers of `axlearn.common.utils` (AXLearn's names).

Batch partitioning (`DataPartitionType`, `input_partition_spec`, `host_to_global_device_array`,
`replicate_to_local_data`), stacked PRNG keys, per-parameter dtypes and runtime checks. Import
them from `axlearn.common.utils`; this module only keeps `utils.py` short.
"""

from __future__ import annotations

import contextlib
import enum
import math
from typing import Any, NamedTuple, Optional, Union

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.utils_tree import complete_partition_spec_tree

Tensor = jax.Array


class DataPartitionType(enum.Enum):
    """How a host's input batch is laid out over the devices."""

    # The batch (leading) axis is split over every mesh axis (`input_partition_spec()`).
    FULL = "full"
    # Every device holds the whole batch.
    REPLICATED = "replicated"
    # The batch axis is split over the mesh's batch axes ("data", "fsdp"), the second (sequence)
    # axis over its "seq" axis; other mesh axes replicate.
    BATCH = "batch"


# The mesh axes `DataPartitionType.BATCH` splits the batch and the sequence axes over.
_BATCH_AXES = ("data", "fsdp")
_SEQ_AXES = ("seq",)


def current_mesh() -> Optional[jax.sharding.Mesh]:
    """Returns the concrete mesh of the enclosing `with mesh:` / `jax.set_mesh(mesh)`, or None."""
    from jax._src import mesh as mesh_lib  # pylint: disable=import-outside-toplevel

    physical = mesh_lib.thread_resources.env.physical_mesh
    if not physical.empty:
        return physical
    get_concrete = getattr(jax.sharding, "get_concrete_mesh", None) or getattr(
        mesh_lib, "get_concrete_mesh", None
    )
    if get_concrete is not None:
        concrete = get_concrete()
        if concrete is not None and not getattr(concrete, "empty", True):
            return concrete
    return None


def input_partition_spec() -> PartitionSpec:
    """The spec splitting a batch's leading axis over all axes of the current mesh.

    Returns:
        `PartitionSpec(mesh.axis_names)` of the enclosing `with mesh:`.

    Raises:
        ValueError: Outside a mesh context.
    """
    mesh = current_mesh()
    if mesh is None:
        raise ValueError("input_partition_spec() needs a mesh: call it inside `with mesh:`.")
    return PartitionSpec(tuple(mesh.axis_names))


def data_partition_type_to_spec(partition: Any) -> Any:
    """Resolves a `DataPartitionType` (or spec, or tree of specs) to partition spec(s).

    Args:
        partition: `DataPartitionType.FULL` (the batch axis over every mesh axis),
            `DataPartitionType.REPLICATED`, `DataPartitionType.BATCH` (batch axis over the
            "data"/"fsdp" mesh axes, second axis over "seq"), a PartitionSpec, or a dict tree of
            PartitionSpecs.

    Returns:
        The PartitionSpec (or the tree of them, unchanged).

    Raises:
        NotImplementedError: For any other value.
    """
    if partition == DataPartitionType.FULL:
        return input_partition_spec()
    if partition == DataPartitionType.REPLICATED:
        return PartitionSpec(None)
    if partition == DataPartitionType.BATCH:
        mesh = current_mesh()
        if mesh is None:
            raise ValueError(
                "DataPartitionType.BATCH needs a mesh: resolve it inside `with mesh:`."
            )
        batch = tuple(name for name in mesh.axis_names if name in _BATCH_AXES)
        seq = tuple(name for name in mesh.axis_names if name in _SEQ_AXES)
        return PartitionSpec(batch, seq)
    if isinstance(partition, (PartitionSpec, dict)):
        return partition
    raise NotImplementedError(f"Unsupported partition: {partition}")


def _specs_for(host_arrays: Any, partition: Any) -> Any:
    """A tree of PartitionSpecs with `host_arrays`' structure."""
    spec = data_partition_type_to_spec(partition)
    if isinstance(spec, PartitionSpec):
        # A spec longer than an array's rank (BATCH's [batch, seq] on a 1-D leaf) is cut.
        return jax.tree.map(
            lambda x: PartitionSpec(*spec[: np.ndim(x)]) if len(spec) > np.ndim(x) else spec,
            host_arrays,
        )
    specs = complete_partition_spec_tree(jax.tree_util.tree_structure(host_arrays), spec)
    # None (replicated) becomes PartitionSpec().
    return jax.tree.map(
        lambda s: PartitionSpec() if s is None else s, specs, is_leaf=lambda s: s is None
    )


def _mesh_or_raise() -> jax.sharding.Mesh:
    mesh = current_mesh()
    if mesh is None:
        raise ValueError("host_to_global_device_array needs a mesh: call it inside `with mesh:`.")
    return mesh


def host_to_global_device_array(
    host_arrays: Any, *, partition: Any = DataPartitionType.FULL
) -> Any:
    """Assembles each process's part of a batch into global arrays sharded over the mesh.

    Each process passes the rows it feeds; the global array concatenates the processes' rows
    along the partitioned leading axis (a replicated array must be equal on every process).

    Args:
        host_arrays: A tree of per-process NumPy/JAX arrays.
        partition: A `DataPartitionType`, a PartitionSpec, or a tree of PartitionSpecs.

    Returns:
        The tree of global `jax.Array`s, with the requested shardings on the current mesh.
    """
    mesh = _mesh_or_raise()
    specs = _specs_for(host_arrays, partition)
    return jax.tree.map(
        lambda x, spec: jax.make_array_from_process_local_data(
            NamedSharding(mesh, spec), np.asarray(x)
        ),
        host_arrays,
        specs,
    )


def _num_feeds(sharding: NamedSharding, ndim: int) -> int:
    """How many processes feed distinct slices of dim 0 under `sharding`."""
    # pylint: disable-next=import-outside-toplevel
    from jax._src.sharding_impls import get_process_index_and_count

    return get_process_index_and_count(sharding, 0, ndim)[1]


def host_to_global_specs(host_arrays: Any, *, partition: Any = DataPartitionType.FULL) -> Any:
    """The global `jax.ShapeDtypeStruct`s `host_to_global_device_array` would produce.

    Args:
        host_arrays: A tree of per-process arrays or `jax.ShapeDtypeStruct`s.
        partition: As in `host_to_global_device_array`.

    Returns:
        A tree of `jax.ShapeDtypeStruct` with the global shapes and shardings.
    """
    mesh = _mesh_or_raise()
    specs = _specs_for(host_arrays, partition)

    def spec_of(x: Any, spec: PartitionSpec) -> jax.ShapeDtypeStruct:
        sharding = NamedSharding(mesh, spec)
        shape = tuple(x.shape)
        if shape:
            shape = (shape[0] * _num_feeds(sharding, len(shape)), *shape[1:])
        return jax.ShapeDtypeStruct(shape, dtype=x.dtype, sharding=sharding)

    return jax.tree.map(spec_of, host_arrays, specs)


def replicate_to_local_data(x: Any) -> Any:
    """Gathers each global array of a tree into a full NumPy copy on this process.

    Args:
        x: A tree of `jax.Array`s (possibly spanning processes) or host arrays.

    Returns:
        The tree of `np.ndarray`s holding the whole (global) values.
    """
    # pylint: disable-next=import-outside-toplevel
    from jax.experimental import multihost_utils

    def gather(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(leaf)

    return jax.tree.map(gather, x)


class StackedKeyArray(NamedTuple):
    """PRNG keys stacked along leading axes (one per layer of a stack, per microbatch, ...).

    `keys` is an array of keys with the stacked axes first, or, for several stacked axes,
    another `StackedKeyArray` (so that `jax.vmap` peels one axis at a time).
    """

    keys: Union[Tensor, StackedKeyArray]


def _stacked_shape(keys: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(keys, StackedKeyArray):
        shape.append(jax.tree.leaves(keys)[0].shape[len(shape)])
        keys = keys.keys
    return tuple(shape)


def split_prng_key(prng_key: Union[Tensor, StackedKeyArray], num_keys: Any) -> StackedKeyArray:
    """Splits a key into `num_keys` keys, as `num_keys` successive `jax.random.split` calls.

    Key i is the child of the i-th split in `key, child = jax.random.split(key)`, so a vmapped
    loop over the keys gives the same randomness as the sequential loop (threefry keys).
    Already stacked keys are returned unchanged (after checking that their stacked shape starts
    with `num_keys`).

    Args:
        prng_key: A key, or a `StackedKeyArray` from an earlier split.
        num_keys: The number of keys, or a tuple of stacked dims (e.g. (2, 5)).

    Returns:
        A `StackedKeyArray` (nested once per extra dim of a tuple `num_keys`).

    Raises:
        AssertionError: If `prng_key` is stacked with another shape than `num_keys`.
    """
    dims = tuple(num_keys) if isinstance(num_keys, (tuple, list)) else (num_keys,)
    if isinstance(prng_key, StackedKeyArray):
        shape = _stacked_shape(prng_key)
        # A prefix check, as AXLearn's: keys pre-split as (stages, layers) pass for (stages,).
        assert shape[: len(dims)] == dims, f"Stacked keys have shape {shape}, expected {dims}"
        return prng_key

    def step(key, _):
        key, child = jax.random.split(key)
        return key, child

    _, children = jax.lax.scan(step, prng_key, None, length=math.prod(dims))
    children = children.reshape(dims + children.shape[1:])
    stacked: Any = children
    for _ in dims:
        stacked = StackedKeyArray(keys=stacked)
    return stacked


def cast_floats_per_param(in_tree: Any, per_param_dtype: Any) -> Any:
    """Casts each floating-point leaf to its own dtype (None: unchanged).

    Args:
        in_tree: A tree of arrays.
        per_param_dtype: The same tree of dtypes or None.

    Returns:
        The cast tree.
    """

    def cast(dtype: Any, x: Any) -> Any:
        if (
            dtype is None
            or not hasattr(x, "dtype")
            or not jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
        ):
            return x
        return x.astype(dtype)

    return jax.tree.map(cast, per_param_dtype, in_tree, is_leaf=lambda d: d is None)


@contextlib.contextmanager
def runtime_checks(enabled: bool = True):
    """Within the context, `checkify.check`s in jitted code raise at run time without checkify.

    Sets JAX's `jax_experimental_unsafe_xla_runtime_errors` (a failing check becomes an XLA
    runtime error naming the check's message) and restores it on exit.

    Args:
        enabled: Whether to turn the checks on (False leaves them as JAX's default).
    """
    old = jax.config.jax_experimental_unsafe_xla_runtime_errors
    jax.config.update("jax_experimental_unsafe_xla_runtime_errors", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_experimental_unsafe_xla_runtime_errors", old)
