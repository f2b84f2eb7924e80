"""The save path of TensorStoreStateStorage: snapshot (blocking) and write (background).

A save has two halves:
1. `snapshot_state` runs in the caller's thread. It takes a consistent copy of the state that no
   later computation can change, so the caller may donate the state's buffers to the next step
   as soon as it returns. The copy is on the device (`snapshot="device"`: dispatch of an
   asynchronous device-side copy, the caller blocks only for the dispatch), on the host
   (`snapshot="host"`: the caller blocks for the device-to-host copy; no extra device memory),
   or split (`"partial"`: the leaves named by `device_paths` on the device, the others copied to
   the host before `snapshot_state` returns); `snapshot_choice` picks the mode from memory
   numbers. A caller that will never donate or modify the state's arrays (e.g. the trainer on
   CPU, which runs the step after a save without donation) may ask for no copy at all
   (`alias_arrays=True`, reported as snapshot "reference"): the plan then holds the arrays
   themselves and the writer copies them to the host as it writes.
2. `write_snapshot` runs in the background (or the caller's thread for synchronous saves). It
   first moves every device-snapshot leaf to host memory, as fast as the link allows, and
   releases each device copy as soon as its bytes are on the host: device memory is held for
   the transfer, not for the write. On accelerators the move is `jax.device_put` into the
   device's page-locked host memory ("pinned_host"): a DMA that XLA runs without Python's GIL,
   written from `np.asarray` of the pinned array. `np.asarray` of a device array instead holds the
   GIL for the whole copy into pageable memory: measured on an H100 for a 12.5 GB state, it
   stalled the training loop's thread for ~8 s per save (steps 0.27 s -> 2-6 s while it ran).
   Host memory is bounded by a budget (`budget_bytes`); a state larger than it is moved and
   written in pieces. Then each process writes only the shards it owns (replica 0 of each
   shard), one zarr chunk per shard, with a CRC-32 per chunk: process 0
   writes each array's zarr metadata (`.zarray`, the JSON TensorStore writes for the same spec),
   and the chunk bytes are written straight from the host buffer (`chunk_file`: O_DIRECT where
   the filesystem allows it). One filesystem sync makes all of it durable; process 0 writes the
   `index` last, after a barrier confirms every process has written its shards.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import sys
import time
from typing import Any, Callable, Collection, Optional

import jax
import numpy as np
from absl import logging

from axlearn.common import file_access
from axlearn.common.checkpointer import (
    chunk_file,
    faults,
    layout,
    multihost,
    snapshot_choice,
    state_tree,
    thread_priority,
)
from axlearn.common.checkpointer import host_transfer as host_transfer_lib
from axlearn.common.checkpointer.host_transfer import (  # noqa: F401 (public names)
    HOST_TRANSFERS,
    resolve_host_transfer,
)
from axlearn.common.checkpointer.step_files import (  # noqa: F401 (public names)
    read_manifest,
    remove_step_dir,
)

# Where the snapshot lives (see snapshot_choice): "partial" puts `device_paths` on the device.
SNAPSHOT_MODES = snapshot_choice.SNAPSHOT_MODES


@dataclasses.dataclass
class _Shard:
    """One chunk this process writes."""

    # ((start, stop), ...) of the shard in the global array.
    region: state_tree.Region
    # The zarr chunk key, e.g. "0.1".
    key: str
    # Host data (np.ndarray), or a single-device jax.Array to copy to host while writing.
    data: Any
    nbytes: int
    # The pinned-host jax.Array whose memory `data` views (kept alive until written).
    host_array: Any = None


@dataclasses.dataclass
class _ArrayLeaf:
    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    # Shards this process writes; filled lazily (from `snapshot`) in device-snapshot mode.
    shards: Optional[list[_Shard]] = None
    # The device-side copy of the array (device-snapshot mode), or the array itself (reference).
    snapshot: Optional[jax.Array] = None
    # Bytes of the shards this process writes.
    owned_bytes: int = 0

    @property
    def zarr_path(self) -> str:
        return f"{layout.ARRAYS_DIR}/{self.path}"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclasses.dataclass
class SavePlan:
    """Everything the background writer needs; built by `snapshot_state`."""

    step: int
    ckpt_dir: str
    # A prefix for barrier names, unique per save and identical on all processes.
    barrier_prefix: str
    # The previous save's prefix, whose last keys this save deletes; None for the first save.
    previous_barrier_prefix: Optional[str]
    # (path, kind) of every leaf in tree order.
    leaves: list[tuple[str, str]]
    arrays: list[_ArrayLeaf]
    values: dict[str, Any]
    byte_leaves: dict[str, bytes]
    snapshot_mode: str
    # Bytes of array data this process writes.
    num_bytes: int
    # Bytes of host memory held by the snapshot itself.
    snapshot_host_bytes: int
    # Bytes of the snapshot's device copies on the fullest device; the writer sets it to 0 once
    # they are all on the host and released.
    device_bytes_held: int = 0


@dataclasses.dataclass
class SaveResult:
    """The outcome of a completed save on this process.

    Attributes:
        step: The step.
        ckpt_dir: Its directory.
        write_s: Seconds from the start of the background write to the commit.
        num_bytes: Bytes of array data this process wrote.
        peak_host_bytes: Peak host memory held by the save on this process (snapshot and
            staging buffers).
        transfer_s: Seconds from the start of the background write until every device copy
            of the snapshot was on the host and released (0 without device copies).
        device_bytes: Bytes this process moved from device copies to the host.
    """

    step: int
    ckpt_dir: str
    write_s: float
    num_bytes: int
    peak_host_bytes: int
    transfer_s: float = 0.0
    device_bytes: int = 0

    @property
    def write_gb_per_s(self) -> float:
        """This process's bytes over the whole background write's time, in GB/s."""
        return self.num_bytes / 1e9 / self.write_s if self.write_s > 0 else math.inf


_chunk_shape_cache: dict = {}


def _chunk_shape(sharding: jax.sharding.Sharding, shape: tuple[int, ...], path: str) -> tuple:
    """Returns the chunk shape of a sharded array: the shard grid, checked to be regular."""
    cache_key = (sharding, shape)
    try:
        return _chunk_shape_cache[cache_key]
    except (KeyError, TypeError):
        pass
    regions = {
        state_tree.normalize_index(idx, shape)
        for idx in sharding.devices_indices_map(shape).values()
    }
    chunk = []
    for d, dim in enumerate(shape):
        starts = sorted({r[d][0] for r in regions})
        if len(starts) == 1:
            chunk.append(max(1, dim))
        else:
            chunk.append(min(b - a for a, b in zip(starts, starts[1:])))
    for region in regions:
        for d, (start, stop) in enumerate(region):
            if start % chunk[d] or stop != min(start + chunk[d], shape[d]):
                raise ValueError(
                    f"State leaf {path!r}: its sharding {sharding} splits shape {shape} into "
                    "irregular shards, which cannot be saved as zarr chunks"
                )
    result = tuple(chunk)
    if len(_chunk_shape_cache) > 4096:
        _chunk_shape_cache.clear()
    try:
        _chunk_shape_cache[cache_key] = result
    except TypeError:
        pass
    return result


def _region_bytes(region: state_tree.Region, dtype: np.dtype) -> int:
    return math.prod(state_tree.region_shape(region)) * dtype.itemsize


def _chunk_key(region: state_tree.Region, chunk_shape: tuple[int, ...]) -> str:
    return layout.chunk_key(tuple(a // max(1, c) for (a, _), c in zip(region, chunk_shape)))


def _owned_shards(arr: jax.Array, chunk_shape: tuple[int, ...]) -> list[_Shard]:
    shape = tuple(arr.shape)
    result = []
    for shard in arr.addressable_shards:
        if shard.replica_id != 0:
            continue
        region = state_tree.normalize_index(shard.index, shape)
        nbytes = _region_bytes(region, np.dtype(arr.dtype))
        if nbytes == 0:
            continue
        result.append(
            _Shard(
                region=region, key=_chunk_key(region, chunk_shape), data=shard.data, nbytes=nbytes
            )
        )
    return result


def write_chunk_file(
    path: str,
    data: np.ndarray,
    chunk_shape: tuple[int, ...],
    niceness: int = 0,
    root: Optional[file_access.Root] = None,
) -> str:
    """Writes one zarr v2 chunk file (uncompressed, C order) and returns the data's CRC-32.

    An uncompressed, unfiltered zarr v2 chunk is the chunk's bytes in C order, little-endian,
    with edge chunks padded to the full chunk shape; so the file is written straight from the
    host buffer, with O_DIRECT where the filesystem allows (see `chunk_file`): about 6x less CPU
    than TensorStore's buffered write path, which matters when training keeps every core busy.
    The zarr metadata is byte for byte TensorStore's, and `verify_checkpoint` reads every chunk
    back through TensorStore as an independent reader.

    Args:
        path: The chunk file, e.g. <step dir>/arrays/<leaf>/0.1 (relative to `root` if given).
        data: The chunk's region of the array (smaller than `chunk_shape` at the array's edge).
        chunk_shape: The array's zarr chunk shape (each dimension at least 1).
        niceness: Niceness for the calling (pool) thread; see thread_priority.
        root: The step directory (a `file_access.RunDir`): the file is opened below it with no
            link followed.

    Returns:
        The CRC-32 (8 hex digits) of `data`'s bytes, as the index records it.
    """
    thread_priority.lower_current_thread_priority(niceness)
    data = np.asarray(data)
    if data.dtype.byteorder == ">" or (data.dtype.byteorder == "=" and sys.byteorder == "big"):
        data = data.astype(data.dtype.newbyteorder("<"))
    chunk_shape = tuple(max(1, c) for c in chunk_shape)
    if data.shape == chunk_shape:
        # The CRC-32 comes from the write, computed as the bytes are staged (synced later).
        return chunk_file.write_file_durably(path, data, fsync=False, root=root).crc32
    # An edge chunk: zarr stores it padded with zeros; the index checksums the data alone.
    crc = state_tree.crc32_hex(data)
    padded = np.zeros(chunk_shape, data.dtype)
    padded[tuple(slice(0, n) for n in data.shape)] = data
    chunk_file.write_file_durably(path, padded, fsync=False, root=root)  # Synced later.
    return crc


def default_snapshot_mode() -> str:
    """'device' on CPU (a device copy is a host copy that does not block), else 'host'."""
    return "device" if jax.default_backend() == "cpu" else "host"


def snapshot_state(
    *,
    step: int,
    state: Any,
    ckpt_dir: str,
    barrier_prefix: str,
    snapshot_mode: str,
    previous_barrier_prefix: Optional[str] = None,
    alias_arrays: bool = False,
    device_paths: Optional[Collection[str]] = None,
    host_transfer: Optional[str] = None,
) -> SavePlan:
    """Builds the save plan of `state` and takes its consistent copy (see module docstring).

    Args:
        step: The step.
        state: A pytree of jax.Arrays, numpy arrays, Python scalars/strings and bytes.
        ckpt_dir: The step directory.
        barrier_prefix: Unique per save, identical on all processes.
        snapshot_mode: "device", "partial" or "host".
        previous_barrier_prefix: The previous save's barrier prefix (its keys are deleted).
        alias_arrays: If True, the plan references the state's jax.Arrays instead of copying
            them (snapshot "reference"); the caller must not donate or modify them afterwards.
        device_paths: With "partial", the paths of the leaves copied on the device (the others
            are copied to the host before this returns).
        host_transfer: How leaves copied to the host get there (`resolve_host_transfer`; None:
            per device).

    Returns:
        The plan.

    Raises:
        TypeError: For a leaf of an unsupported type (naming its path).
        ValueError: For leaf paths that cannot name files, or irregular shardings.
    """
    if snapshot_mode not in SNAPSHOT_MODES:
        raise ValueError(f"snapshot must be one of {SNAPSHOT_MODES}, got {snapshot_mode!r}")
    pairs, _ = state_tree.flatten_state(state)
    me = jax.process_index()
    leaves, arrays, values, byte_leaves = [], [], {}, {}
    device_arrays: list[jax.Array] = []
    device_leaves: list[_ArrayLeaf] = []
    host_bytes = 0
    num_bytes = 0
    on_device = frozenset(device_paths or ())
    for path, leaf in pairs:
        if isinstance(leaf, jax.Array):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
                raise TypeError(
                    f"State leaf {path!r} has extended dtype {leaf.dtype}; save "
                    "jax.random.key_data(key) instead of a typed key"
                )
            shape = tuple(leaf.shape)
            item = _ArrayLeaf(
                path=path,
                shape=shape,
                dtype=np.dtype(leaf.dtype),
                chunk_shape=_chunk_shape(leaf.sharding, shape, path),
            )
            if (
                alias_arrays
                or snapshot_mode == "device"
                or (snapshot_mode == "partial" and path in on_device)
            ):
                device_arrays.append(leaf)
                device_leaves.append(item)
                if leaf.is_fully_addressable:
                    item.owned_bytes = item.nbytes
                else:
                    item.owned_bytes = sum(
                        _region_bytes(state_tree.normalize_index(s.index, shape), item.dtype)
                        for s in leaf.addressable_shards
                        if s.replica_id == 0
                    )
            else:
                item.shards = _owned_shards(leaf, item.chunk_shape)
                for shard in item.shards:
                    host_transfer_lib.start_host_copy(shard, host_transfer)
            leaves.append((path, layout.KIND_ARRAY))
            arrays.append(item)
        elif isinstance(leaf, (np.ndarray, np.generic)):
            host = np.array(leaf, copy=True)
            shape = tuple(host.shape)
            item = _ArrayLeaf(path=path, shape=shape, dtype=host.dtype, chunk_shape=shape)
            full = tuple((0, d) for d in shape)
            item.shards = []
            if me == 0 and host.size:
                item.shards.append(
                    _Shard(region=full, key=_chunk_key(full, shape), data=host, nbytes=host.nbytes)
                )
                host_bytes += host.nbytes
            leaves.append((path, layout.KIND_ARRAY))
            arrays.append(item)
        elif isinstance(leaf, bytes):
            leaves.append((path, layout.KIND_BYTES))
            byte_leaves[path] = leaf
            host_bytes += len(leaf)
        elif leaf is None or isinstance(leaf, state_tree.VALUE_TYPES):
            leaves.append((path, layout.KIND_VALUE))
            values[path] = leaf
        else:
            raise TypeError(
                f"State leaf {path!r} has unsupported type {type(leaf).__name__}: checkpoints "
                "hold jax.Arrays, numpy arrays, bytes, and bool/int/float/str values"
            )
    if alias_arrays:
        copies = device_arrays  # The caller promised not to donate or modify them.
    elif device_arrays:
        # One batched, asynchronous device-side copy: returns after dispatch.
        copies = jax.device_put(device_arrays, [a.sharding for a in device_arrays], may_alias=False)
    else:
        copies = []
    device_bytes_held = 0
    if copies:
        held: dict[Any, int] = collections.defaultdict(int)
        for item, copy in zip(device_leaves, copies):
            item.snapshot = copy
            if not alias_arrays:
                for shard in copy.addressable_shards:
                    region = state_tree.normalize_index(shard.index, item.shape)
                    held[shard.device] += _region_bytes(region, item.dtype)
        device_bytes_held = max(held.values(), default=0)
    for item in arrays:
        if item.shards is not None and item.snapshot is None:
            for shard in item.shards:
                if isinstance(shard.data, jax.Array):
                    host_transfer_lib.finish_host_copy(shard)
                    host_bytes += shard.nbytes
        if item.snapshot is not None:
            num_bytes += item.owned_bytes
        else:
            num_bytes += sum(s.nbytes for s in item.shards)
    return SavePlan(
        step=step,
        ckpt_dir=ckpt_dir,
        barrier_prefix=barrier_prefix,
        previous_barrier_prefix=previous_barrier_prefix,
        leaves=leaves,
        arrays=arrays,
        values=values,
        byte_leaves=byte_leaves,
        snapshot_mode="reference" if alias_arrays else snapshot_mode,
        num_bytes=num_bytes,
        snapshot_host_bytes=host_bytes,
        device_bytes_held=device_bytes_held,
    )


class _Writer:
    """Writes one plan; see `write_snapshot`."""

    def __init__(
        self,
        plan: SavePlan,
        *,
        budget_bytes: int,
        timeout_s: float,
        niceness: int = 0,
        host_transfer: Optional[str] = None,
    ):
        self.plan = plan
        self.niceness = niceness
        self.host_transfer = host_transfer
        self.budget_bytes = budget_bytes
        self.timeout_s = timeout_s
        self.peak_host_bytes = plan.snapshot_host_bytes
        self.checksums: dict[str, dict[str, str]] = {a.path: {} for a in plan.arrays}
        # Device-snapshot shards of each leaf not yet on the host (by id of the leaf).
        self._device_shards: dict[int, int] = {}
        self._total_device_shards = 0
        self._moved_shards = 0
        self._mid_transfer_fired = False
        self.transfer_s = 0.0
        self.device_bytes = 0
        self._root: Optional[file_access.RunDir] = None

    @property
    def root(self) -> file_access.RunDir:
        """The step directory's descriptor (opened once it exists): every file goes below it."""
        if self._root is None:
            self._root = layout.open_step_dir(self.plan.ckpt_dir)
        return self._root

    def close(self) -> None:
        """Closes the step directory's descriptor."""
        if self._root is not None:
            self._root.close()
            self._root = None

    def prepare(self) -> None:
        """Process 0: replaces any earlier directory of this step, writes the zarr metadata.

        Each leaf's `.zarray` is the JSON TensorStore itself writes for the same spec (sorted
        keys, compact; tested byte for byte), written here directly: creating 65 arrays through
        TensorStore cost 7-13 ms of CPU per save, on a machine where a save's CPU comes out of
        the training steps. It becomes durable with the chunks (one filesystem sync per save).
        """
        ckpt_dir = self.plan.ckpt_dir
        parent, name = os.path.split(os.path.normpath(ckpt_dir))
        os.makedirs(parent or ".", exist_ok=True)  # The checkpointer dir, as the user named it.
        if file_access.exists(parent or ".", name):  # A link is removed, not written through.
            logging.warning("Removing existing directory %s before saving into it.", ckpt_dir)
            remove_step_dir(ckpt_dir)
        file_access.makedirs(parent or ".", f"{name}/{layout.ARRAYS_DIR}")
        root = self.root
        for item in self.plan.arrays:
            file_access.makedirs(root, item.zarr_path)
            metadata = state_tree.zarr_metadata_json(
                shape=item.shape, dtype=item.dtype, chunk_shape=item.chunk_shape
            )
            with file_access.open_write(root, f"{item.zarr_path}/.zarray") as f:
                f.write(metadata)

    def _pieces(self) -> list[list[tuple[_ArrayLeaf, _Shard]]]:
        """This process's shards in tree order, cut into pieces whose device-snapshot shards
        fit in `budget_bytes` of host memory (host-snapshot shards cost nothing more)."""
        pieces: list[list[tuple[_ArrayLeaf, _Shard]]] = [[]]
        piece_bytes = 0
        for item in self.plan.arrays:
            if item.shards is None:
                item.shards = _owned_shards(item.snapshot, item.chunk_shape)
                self._device_shards[id(item)] = len(item.shards)
                self._total_device_shards += len(item.shards)
            for shard in item.shards:
                cost = shard.nbytes if isinstance(shard.data, jax.Array) else 0
                if pieces[-1] and piece_bytes + cost > self.budget_bytes:
                    pieces.append([])
                    piece_bytes = 0
                pieces[-1].append((item, shard))
                piece_bytes += cost
        return pieces

    def _transfer(self, piece: list[tuple[_ArrayLeaf, _Shard]]) -> int:
        """Moves a piece's device-snapshot shards to host memory; releases each leaf's device
        copy as soon as all of its shards are on the host. Returns the bytes moved."""
        moving = [(item, shard) for item, shard in piece if isinstance(shard.data, jax.Array)]
        for _, shard in moving:  # All transfers in flight at once.
            host_transfer_lib.start_host_copy(shard, self.host_transfer)
        moved = 0
        for item, shard in moving:
            host_transfer_lib.finish_host_copy(shard)
            moved += shard.nbytes
            self._moved_shards += 1
            if not self._mid_transfer_fired and 2 * self._moved_shards >= self._total_device_shards:
                self._mid_transfer_fired = True
                faults.maybe_inject_fault("mid_transfer", step=self.plan.step)
            self._device_shards[id(item)] -= 1
            if self._device_shards[id(item)] == 0 and item.snapshot is not None:
                item.snapshot.delete()  # Our own copy: free its device memory now.
                item.snapshot = None
        return moved

    def write_arrays(self) -> None:
        """Writes this process's shards, keeping at most `budget_bytes` of them in host memory.

        A device snapshot is first moved to the host (in pieces of at most `budget_bytes`) and
        released; a reference snapshot (the caller's arrays) is read as it is written.
        """
        plan = self.plan
        fault = faults.configured_fault()
        mid_fault = fault is not None and fault[0] == "mid_arrays"
        total_shards = None
        if mid_fault:
            total_shards = sum(
                len(item.shards)
                if item.shards is not None
                else sum(1 for s in item.snapshot.addressable_shards if s.replica_id == 0)
                for item in plan.arrays
            )
        inflight: collections.deque = collections.deque()
        inflight_bytes = 0
        written = 0
        fired = False

        def retire_one():
            nonlocal inflight_bytes
            nbytes, future, path, key, _ = inflight.popleft()  # Drops the pinned buffer, if any.
            try:
                crc = future.result(timeout=self.timeout_s)
            except Exception as e:
                raise OSError(
                    f"Writing chunk {key} of leaf {path!r} to {plan.ckpt_dir} failed: {e}"
                ) from e
            self.checksums[path][key] = crc
            inflight_bytes -= nbytes

        if plan.snapshot_mode == "reference":
            pieces = [
                [
                    (item, shard)
                    for item in plan.arrays
                    for shard in (
                        item.shards
                        if item.shards is not None
                        else _owned_shards(item.snapshot, item.chunk_shape)
                    )
                ]
            ]
            for item in plan.arrays:
                item.snapshot = None  # The shards above hold what is still needed.
        else:
            pieces = self._pieces()
        start = time.perf_counter()
        remaining_pieces = sum(1 for piece in pieces if self._has_device_data(piece))
        for piece in pieces:
            if plan.snapshot_mode != "reference" and self._has_device_data(piece):
                moved = self._transfer(piece)
                self.device_bytes += moved
                self.peak_host_bytes = max(self.peak_host_bytes, plan.snapshot_host_bytes + moved)
                remaining_pieces -= 1
                if remaining_pieces == 0:
                    plan.device_bytes_held = 0
                    self.transfer_s = time.perf_counter() - start
                    faults.maybe_inject_fault("after_transfer", step=plan.step)
            for item, shard in piece:
                data = shard.data
                if isinstance(data, jax.Array):
                    # A reference the caller promised not to change: read it without a copy.
                    data = host_transfer_lib.to_host(data, copy=False)
                    staged = shard.nbytes
                else:
                    staged = 0
                future = state_tree.submit_write(
                    write_chunk_file,
                    f"{item.zarr_path}/{shard.key}",
                    data,
                    item.chunk_shape,
                    self.niceness,
                    self.root,
                )
                inflight.append((staged, future, item.path, shard.key, shard.host_array))
                shard.host_array = None
                inflight_bytes += staged
                self.peak_host_bytes = max(
                    self.peak_host_bytes, plan.snapshot_host_bytes + inflight_bytes
                )
                shard.data = None
                written += 1
                while inflight and inflight_bytes > self.budget_bytes:
                    retire_one()
                if mid_fault and not fired and written * 2 >= total_shards:
                    while inflight:
                        retire_one()
                    fired = True
                    faults.maybe_inject_fault("mid_arrays", step=plan.step)
            # The piece's host buffers are freed once written, before the next piece moves.
            while inflight:
                retire_one()
        for item in plan.arrays:
            item.shards = None
        if mid_fault and not fired:
            faults.maybe_inject_fault("mid_arrays", step=plan.step)

    @staticmethod
    def _has_device_data(piece: list[tuple[_ArrayLeaf, _Shard]]) -> bool:
        return any(isinstance(shard.data, jax.Array) for _, shard in piece)

    def write_byte_leaves(self) -> dict[str, dict]:
        """Writes this process's bytes leaves; returns {path: {file, size, checksum}}."""
        result = {}
        me = jax.process_index()
        for path, value in self.plan.byte_leaves.items():
            rel = f"{layout.HOST_DIR}/process_{me}/{path}"
            file_access.makedirs(self.root, os.path.dirname(rel))
            with file_access.open_write(self.root, rel) as f:  # Synced with the chunks.
                f.write(value)
            result[path] = dict(file=rel, size=len(value), checksum=state_tree.crc32_hex(value))
        return result

    def build_index(self, manifests: dict[int, dict]) -> dict:
        """Process 0: merges every process's checksums into the index; checks completeness."""
        plan = self.plan
        arrays = {a.path: a for a in plan.arrays}
        chunks: dict[str, dict[str, str]] = {a.path: {} for a in plan.arrays}
        per_process: dict[str, dict[str, dict]] = {p: {} for p in plan.byte_leaves}
        for proc, manifest in sorted(manifests.items()):
            for path, sums in manifest["chunks"].items():
                chunks[path].update(sums)
            for path, entry in manifest["bytes"].items():
                per_process[path][str(proc)] = entry
        leaves = []
        for path, kind in plan.leaves:
            if kind == layout.KIND_ARRAY:
                item = arrays[path]
                grid = [
                    -(-d // max(1, c)) if d else 0 for d, c in zip(item.shape, item.chunk_shape)
                ]
                expected = int(np.prod(grid, dtype=np.int64))
                if len(chunks[path]) != expected:
                    raise RuntimeError(
                        f"Leaf {path!r} of step {plan.step}: {len(chunks[path])} of {expected} "
                        "chunks were reported written; not committing"
                    )
                leaves.append(
                    dict(
                        path=path,
                        kind=kind,
                        dtype=state_tree.dtype_name(item.dtype),
                        shape=list(item.shape),
                        chunk_shape=list(item.chunk_shape),
                        file=item.zarr_path,
                        nbytes=item.nbytes,
                        checksum={"crc32": dict(sorted(chunks[path].items()))},
                    )
                )
            elif kind == layout.KIND_BYTES:
                leaves.append(dict(path=path, kind=kind, per_process=per_process[path]))
            else:
                leaves.append(dict(path=path, kind=kind, value=plan.values[path]))
        return layout.make_index(step=plan.step, process_count=jax.process_count(), leaves=leaves)


def write_snapshot(
    plan: SavePlan,
    *,
    budget_bytes: int,
    timeout_s: float,
    on_commit: Optional[Callable[[int, str], None]] = None,
    niceness: int = 0,
    host_transfer: Optional[str] = None,
) -> SaveResult:
    """Writes a snapshot and commits it (see module docstring).

    Args:
        plan: From `snapshot_state`.
        budget_bytes: Maximum bytes of host staging buffers in flight.
        timeout_s: Time-out of each barrier and each chunk write.
        on_commit: Called as `on_commit(step, ckpt_dir)` on process 0 after the commit.
        niceness: Niceness of the threads writing chunk files (0: unchanged).
        host_transfer: How device-snapshot shards reach host memory (`resolve_host_transfer`;
            None: per device).

    Returns:
        The result.

    Raises:
        multihost.BarrierTimeoutError: Naming processes that did not arrive at a barrier.
    """
    start = time.perf_counter()
    writer = _Writer(
        plan,
        budget_bytes=budget_bytes,
        timeout_s=timeout_s,
        niceness=niceness,
        host_transfer=host_transfer,
    )
    try:
        return _write_snapshot(writer, plan, start=start, on_commit=on_commit)
    finally:
        writer.close()


def _write_snapshot(
    writer: _Writer,
    plan: SavePlan,
    *,
    start: float,
    on_commit: Optional[Callable[[int, str], None]],
) -> SaveResult:
    me, count = jax.process_index(), jax.process_count()
    timeout_s = writer.timeout_s
    step = plan.step
    if me == 0:
        writer.prepare()
    multihost.barrier(
        f"{plan.barrier_prefix}/prepared", timeout_s=timeout_s, what=f"directory ready, step {step}"
    )
    if plan.previous_barrier_prefix is not None:
        # Every process is past the previous save's last barrier: drop its keys.
        multihost.delete_keys(plan.previous_barrier_prefix)
    faults.maybe_inject_fault("before_arrays", step=step)
    writer.write_arrays()
    manifest = dict(chunks=writer.checksums, bytes=writer.write_byte_leaves())
    # Every chunk file, its directory entry and the zarr metadata become durable here, once,
    # before this process reports its shards written (and so before the index can exist).
    layout.sync_filesystem(plan.ckpt_dir)
    manifests_dir = os.path.join(plan.ckpt_dir, layout.MANIFESTS_DIR)
    if count > 1:
        file_access.makedirs(writer.root, layout.MANIFESTS_DIR)
        layout.write_json_atomically(
            os.path.join(manifests_dir, f"process_{me}.json"),
            manifest,
            root=os.path.dirname(os.path.normpath(plan.ckpt_dir)) or ".",
        )
    faults.maybe_inject_fault("after_arrays", step=step)
    multihost.barrier(
        f"{plan.barrier_prefix}/written", timeout_s=timeout_s, what=f"shards written, step {step}"
    )
    if me == 0:
        manifests = {0: manifest}
        for p in range(1, count):
            manifests[p] = read_manifest(plan.ckpt_dir, p)
        index = writer.build_index(manifests)
        layout.write_index_file(plan.ckpt_dir, index)
        if count > 1:
            try:
                file_access.rmtree(writer.root, layout.MANIFESTS_DIR, missing_ok=True)
            except OSError as e:
                logging.warning("Could not remove %s: %s", manifests_dir, e)
        logging.info(
            "Committed checkpoint %s (%.3f GB from this process in %.2fs).",
            plan.ckpt_dir,
            plan.num_bytes / 1e9,
            time.perf_counter() - start,
        )
        faults.maybe_inject_fault("after_index", step=step)
    multihost.barrier(
        f"{plan.barrier_prefix}/committed", timeout_s=timeout_s, what=f"index written, step {step}"
    )
    multihost.delete_keys(f"{plan.barrier_prefix}/prepared")
    multihost.delete_keys(f"{plan.barrier_prefix}/written")
    if me != 0:
        faults.maybe_inject_fault("after_index", step=step)
    result = SaveResult(
        step=step,
        ckpt_dir=plan.ckpt_dir,
        write_s=time.perf_counter() - start,
        num_bytes=plan.num_bytes,
        peak_host_bytes=writer.peak_host_bytes,
        transfer_s=writer.transfer_s,
        device_bytes=writer.device_bytes,
    )
    if me == 0 and on_commit is not None:
        on_commit(step, plan.ckpt_dir)
    return result
