"""SPMD utilities: JAX distributed setup, device meshes, and sharding of input batches.

Three jobs, all about laying a computation out over devices:

- `setup()`: the process-level JAX setup, including `jax.distributed.initialize` for multi-process
  CPU/GPU runs (TPU detects its peers itself). It must run before anything touches devices.
- Mesh shapes: `infer_mesh_shape` fills in a single -1 from the device count;
  `create_device_mesh` turns a `MeshShape` or a `HybridMeshShape` (ICI x DCN, for multi-slice
  TPU or multi-node GPU) into a device array for `jax.sharding.Mesh`.
- Batches: `batch_partition_spec` decides how a global batch is split over the batch axes, and
  `host_to_global_array` assembles each process's host-local slice into global `jax.Array`s.

Per-device batch below one. When the global batch size is not a multiple of the product of the
batch axes' sizes (e.g. a global batch of 4 on an 8-device `fsdp` axis), the batch is sharded
over the largest sub-mesh of batch axes whose size divides it, and replicated over the other batch
axes: with batch axes (data=2, fsdp=4) and a global batch of 2, examples are split over `data`
and each of the 4 `fsdp` devices in a `data` group computes the same examples. The math is exactly
that of the unsharded batch (no padding examples, so no change to loss weights or metrics); the
price is redundant compute on the replicated axes, which padding would pay too. The chosen spec
is logged by the trainer.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any, Union

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import PartitionSpec

# A mesh shape: one int per mesh axis; at most one entry may be -1 (inferred).
MeshShape = Sequence[int]

_jax_distributed_initialized = False


@dataclasses.dataclass(frozen=True)
class HybridMeshShape:
    """A mesh shape split into a fast-interconnect (ICI) part and a data-center (DCN) part.

    The full mesh shape is the elementwise product `ici_mesh_shape[i] * dcn_mesh_shape[i]`.
    A granule (a TPU slice, or a process on GPU/CPU) holds the devices of one ICI mesh; the DCN
    mesh lays the granules out.

    Attributes:
        ici_mesh_shape: Per-axis sizes within a granule. At most one -1.
        dcn_mesh_shape: Per-axis sizes across granules. At most one -1.
    """

    ici_mesh_shape: MeshShape
    dcn_mesh_shape: MeshShape

    def __post_init__(self):
        if len(self.ici_mesh_shape) != len(self.dcn_mesh_shape):
            raise ValueError(
                f"HybridMeshShape: ici_mesh_shape {tuple(self.ici_mesh_shape)} and "
                f"dcn_mesh_shape {tuple(self.dcn_mesh_shape)} must have the same length."
            )

    def __len__(self) -> int:
        return len(self.ici_mesh_shape)


def setup(
    *,
    jax_backend: str,
    distributed_coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    initialization_timeout: int | None = None,
) -> None:
    """Sets up JAX for SPMD, initializing `jax.distributed` for multi-process runs.

    Selects JAX's "rbg" PRNG implementation (as AXLearn's launcher does).

    Must be called before any JAX call touches devices. On TPU, peers are discovered
    automatically and the three distributed arguments must be None. On CPU/GPU, either all three
    are None (one process) or `num_processes` and `process_id` are given, plus
    `distributed_coordinator` when `num_processes > 1`.

    Args:
        jax_backend: "cpu", "gpu" or "tpu".
        distributed_coordinator: "host:port" of process 0's coordinator service.
        num_processes: Total number of processes.
        process_id: This process's rank in [0, num_processes).
        initialization_timeout: Seconds to wait for all processes to connect (None: JAX default).

    Raises:
        ValueError: On an inconsistent combination of arguments.
    """
    # JAX's "rbg" PRNG, as AXLearn's launcher selects it for every backend (GSPMD-friendly key
    # splitting): a run's `prng_key` is uint32[4] and its draws are those of an AXLearn run.
    jax.config.update("jax_default_prng_impl", "rbg")
    global _jax_distributed_initialized  # pylint: disable=global-statement
    if jax_backend == "cpu" and num_processes is not None and num_processes > 1:
        # Cross-process collectives on CPU need an explicit implementation.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if _jax_distributed_initialized:
        return
    kwargs: dict[str, Any] = {}
    if initialization_timeout is not None:
        kwargs["initialization_timeout"] = initialization_timeout
    if jax_backend == "tpu":
        if any(v is not None for v in (distributed_coordinator, num_processes, process_id)):
            raise ValueError(
                "distributed_coordinator, num_processes and process_id must all be None on "
                "the tpu backend (TPU discovers its peers itself); got "
                f"{distributed_coordinator=}, {num_processes=}, {process_id=}."
            )
    else:
        if distributed_coordinator is None and num_processes is None and process_id is None:
            logging.info("Single-process %s run: skipping jax.distributed.initialize.", jax_backend)
            return
        if num_processes is None or process_id is None:
            raise ValueError(
                f"num_processes and process_id must be given together for backend {jax_backend}; "
                f"got {num_processes=}, {process_id=}."
            )
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id={process_id} must be in [0, {num_processes}).")
        if not distributed_coordinator:
            if num_processes > 1:
                raise ValueError(
                    "distributed_coordinator (host:port of process 0) is required when "
                    f"num_processes={num_processes} > 1."
                )
            distributed_coordinator = "127.0.0.1:0"
        if num_processes == 1:
            logging.info("num_processes=1: skipping jax.distributed.initialize.")
            return
        kwargs.update(
            coordinator_address=distributed_coordinator,
            num_processes=num_processes,
            process_id=process_id,
        )
    logging.info("jax.distributed.initialize(%s)", kwargs)
    jax.distributed.initialize(**kwargs)
    _jax_distributed_initialized = True


def infer_mesh_shape(mesh_shape: MeshShape, *, num_devices: int | None = None) -> tuple:
    """Returns `mesh_shape` with its single -1 (if any) replaced to use all devices.

    Args:
        mesh_shape: Sizes per mesh axis; at most one may be -1.
        num_devices: Devices the mesh must cover (None: `jax.device_count()`).

    Returns:
        The mesh shape as a tuple of positive ints.

    Raises:
        ValueError: If more than one axis is -1, a size is not positive, or the other axes'
            product does not divide `num_devices`.
    """
    shape = tuple(mesh_shape)
    if num_devices is None:
        num_devices = jax.device_count()
    if shape.count(-1) > 1:
        raise ValueError(f"Only one axis of mesh shape {shape} may be -1.")
    if any(d != -1 and (not isinstance(d, (int, np.integer)) or d < 1) for d in shape):
        raise ValueError(f"Mesh shape {shape} sizes must be positive ints or a single -1.")
    if -1 not in shape:
        return shape
    known = math.prod(d for d in shape if d != -1)
    if num_devices % known != 0:
        raise ValueError(
            f"Cannot infer the -1 in mesh shape {shape}: the number of devices {num_devices} is "
            f"not a multiple of the product {known} of the other axes."
        )
    return tuple(num_devices // known if d == -1 else d for d in shape)


def _granule_attr(devices: Sequence[Any]) -> str | None:
    """Returns the device attribute that identifies granules, or None for a single granule."""
    if hasattr(devices[0], "slice_index"):
        if len({d.slice_index for d in devices}) > 1:
            return "slice_index"
        return None
    if devices[0].platform == "gpu" and len({d.process_index for d in devices}) > 1:
        return "process_index"
    return None


def _default_hybrid_shape(mesh_shape: tuple, num_granules: int) -> HybridMeshShape:
    """Splits the first non-singleton axis of `mesh_shape` across granules (over DCN)."""
    dcn = [1] * len(mesh_shape)
    ici = list(mesh_shape)
    for i, size in enumerate(mesh_shape):
        if size > 1:
            if size % num_granules != 0:
                raise ValueError(
                    f"Mesh shape {mesh_shape}: axis {i} of size {size} (the first axis larger "
                    f"than 1) must be a multiple of the number of granules {num_granules} to be "
                    "split over DCN; use a HybridMeshShape to choose the split."
                )
            dcn[i] = num_granules
            ici[i] = size // num_granules
            break
    return HybridMeshShape(ici_mesh_shape=tuple(ici), dcn_mesh_shape=tuple(dcn))


def create_device_mesh(
    mesh_shape: Union[MeshShape, HybridMeshShape], *, devices: Sequence[Any] | None = None
) -> np.ndarray:
    """Lays devices out as an array of `mesh_shape` for `jax.sharding.Mesh`.

    A plain `MeshShape` on a multi-granule system (several TPU slices, or several GPU processes)
    is split over DCN along its first axis larger than 1; a `HybridMeshShape` states the split.

    Args:
        mesh_shape: A mesh shape (one -1 allowed) or a hybrid ICI x DCN shape.
        devices: The devices to use (None: `jax.devices()`).

    Returns:
        An object array of devices with the full mesh shape.

    Raises:
        ValueError: If the shape does not match the number of devices or granules.
    """
    devices = list(jax.devices() if devices is None else devices)
    num_devices = len(devices)
    attr = _granule_attr(devices)
    if isinstance(mesh_shape, HybridMeshShape):
        if attr is None:
            attr = "process_index"
        granules = sorted({getattr(d, attr) for d in devices})
        dcn = infer_mesh_shape(mesh_shape.dcn_mesh_shape, num_devices=len(granules))
        ici = infer_mesh_shape(mesh_shape.ici_mesh_shape, num_devices=num_devices // len(granules))
        if len(granules) == 1:
            # One granule (e.g. one process): the hybrid shape is multiplied out.
            if math.prod(dcn) * math.prod(ici) != num_devices:
                raise ValueError(
                    f"HybridMeshShape ici={ici} x dcn={dcn} covers "
                    f"{math.prod(dcn) * math.prod(ici)} devices but there are {num_devices}."
                )
            return _standard_mesh(tuple(i * d for i, d in zip(ici, dcn)), devices)
        if math.prod(dcn) != len(granules):
            raise ValueError(
                f"Product of DCN mesh {dcn} must equal the number of granules {len(granules)} "
                f"(devices grouped by {attr})."
            )
        if math.prod(ici) * len(granules) != num_devices:
            raise ValueError(
                f"Product of ICI mesh {ici} must equal the number of devices per granule "
                f"{num_devices // len(granules)} ({num_devices} devices, {len(granules)} "
                f"granules by {attr})."
            )
        if devices[0].platform != "tpu":
            return _hybrid_mesh_by_granule(ici, dcn, devices, attr=attr, granules=granules)
        # As for one slice (`_standard_mesh`), a logical ICI axis may split physical axes
        # (e.g. 8 over a 4x4x4 slice).
        return mesh_utils.create_hybrid_device_mesh(
            ici,
            dcn,
            devices,
            process_is_granule=attr == "process_index",
            allow_split_physical_axes=True,
        )
    shape = infer_mesh_shape(mesh_shape, num_devices=num_devices)
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"Mesh shape {shape} needs {math.prod(shape)} devices but there are {num_devices}."
        )
    if attr is not None:
        num_granules = len({getattr(d, attr) for d in devices})
        return create_device_mesh(_default_hybrid_shape(shape, num_granules), devices=devices)
    return _standard_mesh(shape, devices)


def _hybrid_mesh_by_granule(
    ici: tuple, dcn: tuple, devices: list, *, attr: str, granules: list
) -> np.ndarray:
    """A hybrid mesh of non-TPU devices: each granule's devices (in the given order) form an
    `ici` block; the blocks are laid out by `dcn` (granules in sorted order)."""
    blocks = np.empty((len(granules), *ici), dtype=object)
    for g, granule in enumerate(granules):
        members = [d for d in devices if getattr(d, attr) == granule]
        blocks[g] = np.asarray(members, dtype=object).reshape(ici)
    blocks = blocks.reshape(*dcn, *ici)
    n = len(ici)
    # Interleave (dcn_0, ici_0, dcn_1, ici_1, ...) so each axis is dcn-major.
    order = [axis for i in range(n) for axis in (i, n + i)]
    return blocks.transpose(order).reshape([d * i for d, i in zip(dcn, ici)])


def _standard_mesh(shape: tuple, devices: list) -> np.ndarray:
    if devices[0].platform in ("cpu", "gpu"):
        # Keep devices in process order so each process's devices form contiguous blocks.
        return np.asarray(devices, dtype=object).reshape(shape)
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)


def _axis_size(mesh: jax.sharding.Mesh, name: str) -> int:
    return int(mesh.shape[name])


def canonical_batch_axis_names(batch_axis_names: Union[None, str, Sequence[str]]) -> tuple:
    """Returns the batch axis names as a tuple (None -> empty tuple)."""
    if batch_axis_names is None:
        return ()
    if isinstance(batch_axis_names, str):
        return (batch_axis_names,)
    return tuple(batch_axis_names)


def batch_partition_spec(
    global_batch_size: int,
    *,
    mesh: jax.sharding.Mesh,
    batch_axis_names: Union[None, str, Sequence[str]],
) -> PartitionSpec:
    """Returns the partition spec of a batch's leading dimension over the mesh.

    The batch is sharded over the largest sub-mesh of `batch_axis_names` (keeping their order)
    whose size divides `global_batch_size`, and replicated over the remaining axes. When the batch
    size is a multiple of all batch axes this is simply `PartitionSpec(batch_axis_names)`.
    See the module docstring for the per-device-batch-below-one case.

    Args:
        global_batch_size: The leading dimension of every batch leaf.
        mesh: The device mesh.
        batch_axis_names: Mesh axes to shard the batch over.

    Returns:
        A PartitionSpec for arrays of shape [global_batch_size, ...].

    Raises:
        ValueError: If a batch axis is not a mesh axis.
    """
    names = canonical_batch_axis_names(batch_axis_names)
    for name in names:
        if name not in mesh.shape:
            raise ValueError(f"batch axis '{name}' is not a mesh axis {tuple(mesh.axis_names)}.")
    if not names:
        return PartitionSpec(None)
    if global_batch_size % math.prod(_axis_size(mesh, n) for n in names) == 0:
        return PartitionSpec(names)
    best: tuple = ()
    best_size = 1
    for r in range(len(names), 0, -1):
        for subset in itertools.combinations(names, r):
            size = math.prod(_axis_size(mesh, n) for n in subset)
            if global_batch_size % size == 0 and size > best_size:
                best, best_size = subset, size
    return PartitionSpec(best if best else None)


def _leading_dim(tree: Any) -> int:
    sizes = {np.shape(x)[0] for x in jax.tree.leaves(tree) if np.ndim(x) > 0}
    if len(sizes) != 1:
        raise ValueError(f"Batch leaves must share one leading (batch) dimension; got {sizes}.")
    return sizes.pop()


def host_to_global_array(
    host_arrays: Any,
    *,
    mesh: jax.sharding.Mesh,
    partition: PartitionSpec,
) -> Any:
    """Assembles each process's host-local batch slice into global `jax.Array`s.

    Each process passes its own slice of the global batch (process i holds rows
    [i * B / P, (i + 1) * B / P) of the global batch of B rows over P processes); with one
    process the host batch is the global batch.

    Args:
        host_arrays: A tree of NumPy arrays with leading dimension B / P.
        mesh: The device mesh.
        partition: The partition spec of the leading dimension (see `batch_partition_spec`).

    Returns:
        A tree of global `jax.Array`s with leading dimension B, sharded by `partition`.
    """
    sharding = jax.sharding.NamedSharding(mesh, partition)
    num_processes = jax.process_count()
    if num_processes == 1:
        return jax.tree.map(lambda x: jax.device_put(np.asarray(x), sharding), host_arrays)

    def put(x):
        x = np.asarray(x)
        global_shape = (x.shape[0] * num_processes,) + x.shape[1:]
        return jax.make_array_from_process_local_data(sharding, x, global_shape)

    return jax.tree.map(put, host_arrays)


def global_batch_size_of(host_batch: Any) -> int:
    """Returns the global batch size implied by a host-local batch (leading dim x processes)."""
    return _leading_dim(host_batch) * jax.process_count()
