"""The restore path of TensorStoreStateStorage: straight into the target shardings.

For every array leaf, each process reads only the chunks that overlap the shards its devices
hold under the *target* sharding, which may come from a different mesh or device count than
the one saved (resharding). Every chunk read is checked against the CRC-32 in the index, so a
truncated, altered or missing chunk file fails the restore with an error that names the file and
the leaf. Reads are issued for a group of leaves at a time, at most `budget_bytes` of chunks.

The arrays are TensorStore zarr arrays that this package wrote uncompressed, so chunk files are
read directly into their destination buffers on a thread pool (several times faster than
decoding them through TensorStore, which `verify_checkpoint` still uses as an independent reader).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import os
import time
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common import file_access
from axlearn.common.checkpointer import axlearn_layout, chunk_file, layout, state_tree, tf_iterators
from axlearn.common.utils import TensorSpec


class CheckpointCorruptionError(ValueError):
    """A checkpoint file is missing, truncated or does not match its checksum."""


class StateMismatchError(ValueError):
    """The target state does not match the checkpoint's structure, shapes or dtypes.

    Attributes:
        paths: The leaf paths that differ (missing, unexpected or mismatched).
    """

    def __init__(self, message: str, *, paths: frozenset = frozenset()):
        super().__init__(message)
        self.paths = frozenset(paths)


@dataclasses.dataclass
class RestoreStats:
    """What a restore read on this process.

    Attributes:
        step: The step restored.
        num_bytes: Bytes of chunk data read.
        seconds: Wall time of the restore.
    """

    step: int
    num_bytes: int
    seconds: float


def _describe(dtype, shape) -> str:
    return f"{state_tree.dtype_name(dtype)}{list(shape)}"


def _target_kind(leaf: Any) -> str:
    if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, TensorSpec, np.ndarray, np.generic)):
        return layout.KIND_ARRAY
    if isinstance(leaf, bytes):
        return layout.KIND_BYTES
    return layout.KIND_VALUE


def _target_sharding(leaf: Any) -> Optional[jax.sharding.Sharding]:
    """The sharding to restore into; None means a host numpy array."""
    if isinstance(leaf, (np.ndarray, np.generic)):
        return None
    if isinstance(leaf, jax.Array):
        return leaf.sharding
    if isinstance(leaf, TensorSpec):
        return leaf.sharding
    if leaf.sharding is not None:
        return leaf.sharding
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


class CheckpointValidationType(str, enum.Enum):  # noqa: UP042 (AXLearn's str+Enum)
    """How strictly a restore target must match the checkpoint (AXLearn's names).

    EXACT: the same leaves, shapes and dtypes. EXACT_UP_TO_DTYPE: dtypes may differ (values are
    cast to the target's dtype). CONTAINS_STATE: the checkpoint may hold more leaves than the
    target (they are not read). CONTAINS_STATE_UP_TO_DTYPE: both.
    """

    EXACT = "EXACT"
    EXACT_UP_TO_DTYPE = "EXACT_UP_TO_DTYPE"
    CONTAINS_STATE = "CONTAINS_STATE"
    CONTAINS_STATE_UP_TO_DTYPE = "CONTAINS_STATE_UP_TO_DTYPE"


def check_target(
    ckpt_dir: str,
    index: dict,
    pairs: list[tuple[str, Any]],
    validation: CheckpointValidationType = CheckpointValidationType.EXACT,
) -> dict[str, dict]:
    """Checks the target leaves against the index; returns {path: index entry}.

    Raises:
        StateMismatchError: Naming every missing, unexpected or mismatched leaf.
    """
    validation = CheckpointValidationType(validation)
    allow_extra = validation.value.startswith("CONTAINS_STATE")
    allow_dtype = validation.value.endswith("UP_TO_DTYPE")
    entries = {leaf["path"]: leaf for leaf in index["leaves"]}
    target_paths = [p for p, _ in pairs]
    # Shape/dtype/kind differences of leaves on both sides are listed first: they are the likely
    # cause (e.g. a changed model); a missing `input_iter` is a secondary difference.
    problems = []
    structure = []
    missing = [p for p in target_paths if p not in entries]
    extra = sorted(set(entries) - set(target_paths))
    if missing:
        structure.append(f"not in the checkpoint: {missing}")
    if extra and not allow_extra:
        structure.append(f"in the checkpoint but not in the target state: {extra}")
    differing = set(missing) | (set(extra) if not allow_extra else set())
    for path, leaf in pairs:
        entry = entries.get(path)
        if entry is None:
            continue
        kind = _target_kind(leaf)
        if kind != entry["kind"]:
            problems.append(f"{path!r}: the checkpoint holds a {entry['kind']}, target a {kind}")
            differing.add(path)
            continue
        if kind != layout.KIND_ARRAY:
            continue
        saved_dtype = state_tree.parse_dtype(entry["dtype"])
        saved_shape = tuple(entry["shape"])
        dtype = getattr(leaf, "dtype", None)
        dtype = saved_dtype if dtype is None else np.dtype(dtype)
        shape = tuple(leaf.shape)
        if (dtype != saved_dtype and not allow_dtype) or shape != saved_shape:
            problems.append(
                f"{path!r}: the checkpoint holds {_describe(saved_dtype, saved_shape)}, "
                f"the target expects {_describe(dtype, shape)}"
            )
            differing.add(path)
    problems += structure
    if problems:
        layout_version = index.get("state_layout", 1)
        if layout_version < layout.STATE_LAYOUT_VERSION:
            problems.append(
                f"this checkpoint predates the state layout change (state layout "
                f"{layout_version} < {layout.STATE_LAYOUT_VERSION}: EmaState gained `scale`, "
                "SkipClipState.grad_norm_var_ema became grad_norm_square_ema); restore it with "
                "the axlearn version that wrote it, or restore only the model parameters"
            )
        raise StateMismatchError(
            f"Cannot restore {ckpt_dir} into the target state (the checkpoint tree dtypes or "
            "shapes differ from the target's):\n  " + "\n  ".join(problems),
            paths=frozenset(differing),
        )
    return entries


@dataclasses.dataclass
class _LeafRead:
    index: int  # Position among the target leaves.
    path: str
    entry: dict
    sharding: Optional[jax.sharding.Sharding]
    shape: tuple[int, ...]
    dtype: np.dtype
    # Target regions this process needs (unique), and chunks (key -> region) covering them.
    regions: list[state_tree.Region]
    chunks: dict[str, state_tree.Region]

    @property
    def chunk_bytes(self) -> int:
        return (
            sum(
                int(np.prod(state_tree.region_shape(r), dtype=np.int64))
                for r in self.chunks.values()
            )
            * self.dtype.itemsize
        )


def _plan_leaf(i: int, path: str, leaf: Any, entry: dict) -> _LeafRead:
    shape = tuple(entry["shape"])
    dtype = state_tree.parse_dtype(entry["dtype"])
    chunk_shape = tuple(max(1, c) for c in entry["chunk_shape"])
    sharding = _target_sharding(leaf)
    if sharding is None:
        regions = [tuple((0, d) for d in shape)]
    else:
        regions = sorted(
            {
                state_tree.normalize_index(idx, shape)
                for idx in sharding.addressable_devices_indices_map(shape).values()
            }
        )
    chunks: dict[str, state_tree.Region] = {}
    for region in regions:
        if any(a == b for a, b in region):
            continue
        ranges = [range(a // c, -(-b // c)) for (a, b), c in zip(region, chunk_shape)]
        for grid in itertools.product(*ranges):
            key = layout.chunk_key(grid)
            if key not in chunks:
                chunks[key] = tuple(
                    (g * c, min((g + 1) * c, d)) for g, c, d in zip(grid, chunk_shape, shape)
                )
    return _LeafRead(
        index=i,
        path=path,
        entry=entry,
        sharding=sharding,
        shape=shape,
        dtype=dtype,
        regions=regions,
        chunks=chunks,
    )


def _intersect(a: state_tree.Region, b: state_tree.Region) -> Optional[state_tree.Region]:
    result = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    if any(lo >= hi for lo, hi in result):
        return None
    return result


def _assemble(region: state_tree.Region, read: _LeafRead, data: dict[str, np.ndarray]):
    """Returns the numpy array of `region` built from the chunks read."""
    shape = state_tree.region_shape(region)
    if 0 in shape:
        return np.zeros(shape, read.dtype)
    for key, chunk_region in read.chunks.items():
        if chunk_region == region:
            return data[key]
    out = np.empty(shape, read.dtype)
    for key, chunk_region in read.chunks.items():
        overlap = _intersect(region, chunk_region)
        if overlap is None:
            continue
        dst = tuple(slice(lo - r0, hi - r0) for (lo, hi), (r0, _) in zip(overlap, region))
        src = tuple(slice(lo - c0, hi - c0) for (lo, hi), (c0, _) in zip(overlap, chunk_region))
        out[dst] = data[key][src]
    return out


def _read_chunk(
    root: file_access.RunDir, rel: str, read: _LeafRead, key: str, region: state_tree.Region
) -> np.ndarray:
    """Reads one chunk file, checks its size and CRC-32; returns the chunk clipped to `region`.

    Our zarr arrays are uncompressed, C-order and unfiltered, so a chunk file holds exactly the
    chunk's bytes (edge chunks padded to the full chunk shape, as zarr v2 stores them): one read
    (O_DIRECT where the filesystem allows, see chunk_file.py) straight into a page-aligned
    buffer that the devices adopt without a copy, no decoding. (Buffers adopted this way are
    never donated in place by XLA, so a restored array stays intact even if the next step
    donates it.)

    The file is opened below the step directory's descriptor `root` with no link followed
    (`file_access`): the index's path is contained by the open itself.
    """
    file = os.path.join(root.path, rel)
    chunk_shape = tuple(max(1, c) for c in read.entry["chunk_shape"])
    extent = tuple(b - a for a, b in region) if region else chunk_shape
    if read.entry.get("checksum") is None:
        return _read_axlearn_chunk(root, rel, file, read, chunk_shape, extent)
    try:
        data = chunk_file.read_chunk(
            rel, dtype=read.dtype, chunk_shape=chunk_shape, extent=extent, root=root
        )
    except FileNotFoundError as e:
        raise CheckpointCorruptionError(
            f"Chunk file {file} of leaf {read.path!r} is missing"
        ) from e
    except chunk_file.ChunkSizeError as e:
        raise CheckpointCorruptionError(
            f"Chunk file {file} of leaf {read.path!r} has the wrong size ({e.size} bytes, "
            f"expected {e.expected}): the file was truncated or altered"
        ) from e
    except file_access.FileAccessError as e:
        raise CheckpointCorruptionError(
            f"Chunk file {file} of leaf {read.path!r} is refused: {e.rule}"
        ) from e
    except OSError as e:
        raise CheckpointCorruptionError(
            f"Reading chunk file {file} of leaf {read.path!r} failed: {e}"
        ) from e
    expected = read.entry["checksum"].get("crc32", {}).get(key)
    actual = state_tree.crc32_hex(data)
    if expected != actual:
        raise CheckpointCorruptionError(
            f"Chunk file {file} of leaf {read.path!r} does not match its checksum (index: "
            f"{expected}, file: {actual}): the file was altered or truncated"
        )
    return data


def _read_axlearn_chunk(
    root: file_access.RunDir,
    rel: str,
    file: str,
    read: _LeafRead,
    chunk_shape: tuple[int, ...],
    extent: tuple[int, ...],
) -> np.ndarray:
    """Reads and decodes one chunk of AXLearn's layout (zstd or raw; it has no checksum)."""
    raw = int(np.prod(chunk_shape, dtype=np.int64)) * read.dtype.itemsize
    try:
        data = file_access.read_bytes(root, rel, max_bytes=axlearn_layout.max_chunk_file_bytes(raw))
    except file_access.FileMissingError as e:
        raise CheckpointCorruptionError(
            f"Chunk file {file} of leaf {read.path!r} is missing (every chunk of the array's "
            "grid is written by AXLearn's save)"
        ) from e
    except file_access.FileAccessError as e:
        raise CheckpointCorruptionError(
            f"Chunk file {file} of leaf {read.path!r} is refused: {e.rule}"
        ) from e
    try:
        chunk = axlearn_layout.decode_chunk(
            data, compressor=read.entry.get("compressor"), dtype=read.dtype, chunk_shape=chunk_shape
        )
    except ValueError as e:
        raise CheckpointCorruptionError(
            f"Chunk file {file} of leaf {read.path!r} is not a valid "
            f"{read.entry.get('compressor') or 'raw'} chunk of "
            f"{_describe(read.dtype, chunk_shape)} "
            f"({len(data)} bytes): {str(e)[:200]}"
        ) from e
    return chunk[tuple(slice(0, n) for n in extent)]


class _Reader:
    def __init__(self, ckpt_dir: str, *, timeout_s: float):
        self.ckpt_dir = ckpt_dir
        self.timeout_s = timeout_s
        self.num_bytes = 0
        try:
            # Every file of the step is opened below this descriptor, no link followed.
            self.root = layout.open_step_dir(ckpt_dir)
        except file_access.FileAccessError as e:
            raise CheckpointCorruptionError(f"Step directory {ckpt_dir}: {e.rule}") from e

    def close(self) -> None:
        """Closes the step directory's descriptor."""
        self.root.close()

    def _chunk_file(self, read: _LeafRead, key: str) -> str:
        return f"{read.entry['file']}/{key}"

    def read_group(self, group: list[_LeafRead]):
        """Issues every chunk read of `group`, then yields (read, {key: verified chunk}) per leaf.

        Chunks are read and verified on a thread pool; leaves come back in order as soon as their
        chunks are ready, so the caller moves one leaf to the devices while later reads run.
        """
        pending = {
            read.index: [
                (
                    key,
                    state_tree.submit_io(
                        _read_chunk, self.root, self._chunk_file(read, key), read, key, region
                    ),
                )
                for key, region in read.chunks.items()
            ]
            for read in group
        }
        try:
            for read in group:
                chunks = {}
                for key, future in pending.pop(read.index):
                    data = future.result(timeout=self.timeout_s)
                    self.num_bytes += data.nbytes
                    chunks[key] = data
                yield read, chunks
        finally:
            for futures in pending.values():
                for _, future in futures:
                    future.cancel()

    def read_bytes_leaf(self, path: str, entry: dict) -> bytes:
        me = str(jax.process_index())
        info = entry["per_process"].get(me)
        if info is None and int(me) >= len(entry["per_process"]) and "0" in entry["per_process"]:
            # Saved by fewer processes (a restart on more): this process reads process 0's value
            # and its owner decides whether it can use it (a Grain input's state holds the global
            # input position; a tf.data input's names the feeds it lacks).
            info = entry["per_process"]["0"]
        if info is None:
            raise CheckpointCorruptionError(
                f"Leaf {path!r} of {self.ckpt_dir} has no value for process {me} (saved by "
                f"processes {sorted(entry['per_process'])})"
            )
        file = os.path.join(self.ckpt_dir, str(info["file"]))
        if info.get("axlearn_tf"):
            return self._read_axlearn_tf(path, str(info["file"]))
        size = info.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CheckpointCorruptionError(
                f"Leaf {path!r} of {self.ckpt_dir}: its index entry has no valid size"
            )
        try:
            value = file_access.read_bytes(self.root, str(info["file"]), max_bytes=size)
        except file_access.FileAccessError as e:
            raise CheckpointCorruptionError(f"File {file} of leaf {path!r}: {e.rule}") from e
        if len(value) != info["size"] or state_tree.crc32_hex(value) != info["checksum"]:
            raise CheckpointCorruptionError(
                f"File {file} of leaf {path!r} does not match its size/checksum in the index"
            )
        return value

    def _read_axlearn_tf(self, path: str, prefix: str) -> bytes:
        """Packs AXLearn's `tf_<i>/<path>.index|.data-*` into `tf_iterators`' archive bytes."""
        parent, base = os.path.split(prefix)
        files = {}
        try:
            for name in sorted(file_access.listdir(self.root, parent)):
                if name.startswith(f"{base}.") and (
                    name == f"{base}.index" or name.startswith(f"{base}.data-")
                ):
                    files[tf_iterators.AXLEARN_PREFIX + name[len(base) :]] = file_access.read_bytes(
                        self.root,
                        f"{parent}/{name}",
                        max_bytes=axlearn_layout.MAX_TF_FILE_BYTES,
                    )
        except file_access.FileAccessError as e:
            raise CheckpointCorruptionError(
                f"tf.data iterator {prefix} of leaf {path!r} in {self.ckpt_dir}: {e.rule}"
            ) from e
        if f"{tf_iterators.AXLEARN_PREFIX}.index" not in files:
            raise CheckpointCorruptionError(
                f"{self.ckpt_dir}/{prefix}.index of leaf {path!r} is missing"
            )
        return tf_iterators.pack_files(files)


def restore_state(
    *,
    ckpt_dir: str,
    index: dict,
    state: Any,
    budget_bytes: int,
    timeout_s: float,
    validation: CheckpointValidationType = CheckpointValidationType.EXACT,
) -> tuple[Any, RestoreStats]:
    """Restores `ckpt_dir` into the structure, shardings and dtypes of `state`.

    Args:
        ckpt_dir: The committed step directory.
        index: Its parsed index.
        state: The target tree: jax.Arrays or jax.ShapeDtypeStructs (with shardings) or
            TensorSpecs for sharded arrays, numpy arrays for host arrays, and values/bytes.
        budget_bytes: Maximum bytes of chunks read at a time.
        timeout_s: Time-out of each chunk read.
        validation: How strictly the target must match (see `CheckpointValidationType`).

    Returns:
        (restored state, stats).

    Raises:
        StateMismatchError: If the target does not match the checkpoint (naming leaves).
        CheckpointCorruptionError: If a file is missing or corrupt (naming file and leaf).
    """
    start = time.perf_counter()
    pairs, treedef = state_tree.flatten_state(state)
    pairs, rbg_paths = _map_axlearn_rbg_keys(index, pairs)
    entries = check_target(ckpt_dir, index, pairs, validation)
    reader = _Reader(ckpt_dir, timeout_s=timeout_s)
    try:
        restored, stats = _restore_with(reader, index, pairs, treedef, entries, start, budget_bytes)
    finally:
        reader.close()
    if rbg_paths:
        restored = _map_prng_keys(ckpt_dir, restored, rbg_paths)
    return restored, stats


# AXLearn's launcher runs JAX's `rbg` PRNG: its raw key is uint32[4], `[a, b, a, b]` where the
# threefry key at the same point is `[a, b]`. A key saved under one implementation restores into
# a target of the other by that mapping: AXLearn's rbg keys into a threefry run, and the threefry
# keys of our earlier checkpoints (before the trainer selected rbg as AXLearn's launcher does)
# into an rbg run.
_RBG_KEY_SHAPE = (4,)
_THREEFRY_KEY_SHAPE = (2,)
# The trainer state's key leaf; only it is mapped from threefry to rbg.
_PRNG_KEY_PATH = "prng_key"


def _map_axlearn_rbg_keys(index: dict, pairs: list) -> tuple[list, dict]:
    """Reads a saved PRNG key of the other implementation in its saved shape.

    A uint32[4] key of AXLearn's layout restored into a uint32[2] target, or the uint32[2]
    `prng_key` of our layout restored into a uint32[4] target, is read as saved (mapped by
    `_map_prng_keys` afterwards).

    Returns:
        (pairs, {mapped path: (saved shape, the target's sharding, None for a host array)}).
    """
    entries = {leaf["path"]: leaf for leaf in index["leaves"]}
    out, mapped = [], {}
    for path, leaf in pairs:
        entry = entries.get(path)
        saved = None
        if (
            entry is not None
            and entry["kind"] == layout.KIND_ARRAY
            and entry["dtype"] == "uint32"
            and _target_kind(leaf) == layout.KIND_ARRAY
            and np.dtype(leaf.dtype) == np.uint32
        ):
            pair = (tuple(entry["shape"]), tuple(leaf.shape))
            if pair == (_RBG_KEY_SHAPE, _THREEFRY_KEY_SHAPE) and (
                index.get("layout") == axlearn_layout.LAYOUT_NAME
            ):
                saved = _RBG_KEY_SHAPE
            elif pair == (_THREEFRY_KEY_SHAPE, _RBG_KEY_SHAPE) and path == _PRNG_KEY_PATH:
                saved = _THREEFRY_KEY_SHAPE
        if saved is not None:
            sharding = _target_sharding(leaf)
            mapped[path] = (saved, sharding)
            if sharding is not None:
                # A key is replicated: read all its words on every device.
                leaf = jax.ShapeDtypeStruct(
                    saved,
                    np.uint32,
                    sharding=jax.sharding.SingleDeviceSharding(jax.local_devices()[0]),
                )
            else:
                leaf = np.zeros(saved, np.uint32)
        out.append((path, leaf))
    return out, mapped


def _map_prng_keys(ckpt_dir: str, restored: Any, paths: dict) -> Any:
    """Maps each key at `paths`: rbg `[a, b, a, b]` to threefry `[a, b]`, or the reverse."""

    def convert(path, value):
        if path not in paths:
            return value
        saved, sharding = paths[path]
        key = np.asarray(value)
        if saved == _THREEFRY_KEY_SHAPE:
            result = np.concatenate([key, key])
        elif not np.array_equal(key[:2], key[2:]):
            raise StateMismatchError(
                f"{ckpt_dir}: leaf {path!r} is an rbg key {key.tolist()} that is not of the form "
                "[a, b, a, b], so it has no threefry equivalent; run with the rbg PRNG "
                "(jax_default_prng_impl=rbg) to restore it",
                paths=frozenset([path]),
            )
        else:
            result = key[:2].copy()
        return result if sharding is None else jax.device_put(result, sharding)

    pairs, treedef = state_tree.flatten_state(restored)
    return jax.tree_util.tree_unflatten(treedef, [convert(p, v) for p, v in pairs])


def _restore_with(
    reader: _Reader,
    index: dict,
    pairs: list,
    treedef: Any,
    entries: dict,
    start: float,
    budget_bytes: int,
) -> tuple[Any, RestoreStats]:
    """Reads every leaf of `pairs` through `reader` (see `restore_state`)."""
    out: list[Any] = [None] * len(pairs)
    reads = []
    for i, (path, leaf) in enumerate(pairs):
        entry = entries[path]
        if entry["kind"] == layout.KIND_VALUE:
            out[i] = entry["value"]
        elif entry["kind"] == layout.KIND_BYTES:
            out[i] = reader.read_bytes_leaf(path, entry)
        else:
            reads.append(_plan_leaf(i, path, leaf, entry))
    group: list[_LeafRead] = []
    group_bytes = 0

    def flush():
        nonlocal group, group_bytes
        if not group:
            return
        for read, chunks in reader.read_group(group):
            regions = {r: _assemble(r, read, chunks) for r in read.regions}
            target_dtype = getattr(pairs[read.index][1], "dtype", None)
            if target_dtype is not None and np.dtype(target_dtype) != read.dtype:
                # Only reached with an UP_TO_DTYPE validation: cast to the target's dtype.
                regions = {r: v.astype(target_dtype) for r, v in regions.items()}
            if read.sharding is None:
                out[read.index] = regions[read.regions[0]]
            else:
                out[read.index] = jax.make_array_from_callback(
                    read.shape,
                    read.sharding,
                    lambda idx, read=read, regions=regions: regions[
                        state_tree.normalize_index(idx, read.shape)
                    ],
                )
        group, group_bytes = [], 0

    for read in reads:
        if group and group_bytes + read.chunk_bytes > budget_bytes:
            flush()
        group.append(read)
        group_bytes += read.chunk_bytes
    flush()
    restored = jax.tree_util.tree_unflatten(treedef, out)
    stats = RestoreStats(
        step=index["step"], num_bytes=reader.num_bytes, seconds=time.perf_counter() - start
    )
    return restored, stats
