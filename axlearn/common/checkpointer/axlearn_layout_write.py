"""Writing one step in AXLearn's own checkpoint layout (what AXLearn's `Checkpointer` restores).

The files are those AXLearn HEAD's `TensorStoreStateStorage` writes (see `axlearn_layout` for
the reader):

```
<dir>/step_00000006/
    gda/<leaf path>/.zarray     zarr v2: zstd level 1, "." separator, fill_value null
    gda/<leaf path>/0.0, 1.0    one chunk per shard (a scalar's chunk is `0`)
    tf_<process>/<path>.index, .data-00000-of-00001   a tf.data iterator AXLearn saved
    index                       one line of JSON, a list of [path, value] pairs, written last
```

Chunks are encoded by TensorStore's zarr driver over an in-memory key-value store (TensorStore
never opens a path) and every file is written through `file_access`: relative to a descriptor
of the step directory, no link followed, each file whole (`write_atomic`). The step directory is
created here and never overwritten: an existing entry at its name (a link included) is refused.
The `index`, the commit marker, is written after every other file; then the step is read back
with our own reader of AXLearn's layout and every value compared bit for bit (on a mismatch the
index is renamed away, so the step stays uncommitted).

A `prng_key` leaf that is a threefry key (uint32[2], `[a, b]`) is written as the `rbg` key
AXLearn's launcher runs with (`[a, b, a, b]`); our reader maps it back for a threefry target.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
import time
from typing import Any, Optional, Union

import numpy as np

from axlearn.common import file_access
from axlearn.common.checkpointer import axlearn_layout, layout, state_tree, tf_iterators

# The zstd level AXLearn's zarr arrays are compressed with.
ZSTD_LEVEL = 1
# The index entry AXLearn writes first; no state leaf may take this path.
STEP_PATH = "step"
# The trainer state's PRNG key leaf (mapped from threefry to rbg).
PRNG_KEY_PATH = "prng_key"
# The class AXLearn's index names for a tf.data iterator leaf.
TF_ITERATOR_CLASS = "<class 'tensorflow.python.data.ops.iterator_ops.OwnedIterator'>"
# The most bytes of one tf.data iterator file taken from an archive.
_MAX_TF_MEMBER_BYTES = axlearn_layout.MAX_TF_FILE_BYTES


class AXLearnWriteError(ValueError):
    """A state or destination that cannot be written in AXLearn's layout (names file and rule)."""


@dataclasses.dataclass
class WriteResult:
    """What `write_step` wrote."""

    # The step directory written (committed and verified).
    step_dir: str
    # Array leaves written under `gda/`.
    num_arrays: int
    # Chunk files written.
    num_chunks: int
    # Bytes of array data before compression.
    raw_bytes: int
    # Bytes of the chunk files written (zstd).
    chunk_file_bytes: int
    # Seconds spent writing (without the verification).
    write_seconds: float
    # Seconds spent reading the step back and comparing it.
    verify_seconds: float


@dataclasses.dataclass(frozen=True)
class PerProcessBytes:
    """A bytes leaf saved by several processes (a pytree leaf, unlike a dict)."""

    # {process index as a string: that process's bytes}.
    by_process: dict[str, bytes]


@dataclasses.dataclass
class _Array:
    """One array leaf to write."""

    # Its leaf path (the folder under `gda/`).
    path: str
    # Its value, on the host (a threefry `prng_key` already mapped to rbg).
    value: np.ndarray
    # The chunk shape of its `.zarray` (a saved shard's shape).
    chunk_shape: tuple[int, ...]


def _tf_files(path: str, value: Union[bytes, PerProcessBytes]) -> dict[str, dict[str, bytes]]:
    """{process: {suffix (`.index`, `.data-...`): bytes}} of a tf.data iterator bytes leaf."""
    per_process = value.by_process if isinstance(value, PerProcessBytes) else {"0": value}
    result = {}
    for proc, data in per_process.items():
        if not str(proc).isdigit() or not isinstance(data, (bytes, bytearray)):
            raise AXLearnWriteError(
                f"leaf {path!r:.200}: process {proc!r:.20} holds no bytes; a bytes leaf is one "
                "archive or a PerProcessBytes of archives"
            )
        files = {}
        try:
            with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as tar:
                for member in tar.getmembers():
                    name = member.name
                    prefix = tf_iterators.AXLEARN_PREFIX
                    if not member.isfile() or os.path.basename(name) != name:
                        raise AXLearnWriteError(
                            f"leaf {path!r:.200}: archive member {name!r:.80} is not a plain file"
                        )
                    if member.size > _MAX_TF_MEMBER_BYTES:
                        raise AXLearnWriteError(
                            f"leaf {path!r:.200}: archive member {name!r:.80} is over "
                            f"{_MAX_TF_MEMBER_BYTES} bytes"
                        )
                    suffix = name[len(prefix) :]
                    if not name.startswith(prefix) or not (
                        suffix == ".index" or suffix.startswith(".data-")
                    ):
                        raise AXLearnWriteError(
                            f"leaf {path!r:.200} is a tf.data iterator saved by this checkpointer "
                            f"(archive member {name!r:.80}: its object graph roots the iterator "
                            "below `iterator`), which AXLearn's restore cannot read; only "
                            "iterators read from AXLearn's layout (`axlearn_root.*`) are written "
                            "back. Drop this leaf from the state to write the rest"
                        )
                    files[suffix] = tar.extractfile(member).read()
        except tarfile.TarError as e:
            raise AXLearnWriteError(
                f"leaf {path!r:.200}: its bytes are not a tf.data iterator archive (an "
                f"uncompressed tar: {str(e).splitlines()[0]:.80}); AXLearn's layout holds arrays, "
                "tf.data iterators and JSON values"
            ) from e
        if ".index" not in files:
            raise AXLearnWriteError(f"leaf {path!r:.200}: its archive has no `.index` file")
        result[str(int(proc))] = files
    return result


def _chunk_shape(path: str, value: Any, shape: tuple, chunk_shapes: dict) -> tuple[int, ...]:
    chunks = chunk_shapes.get(path)
    if chunks is None:
        sharding = getattr(value, "sharding", None)
        chunks = sharding.shard_shape(shape) if sharding is not None else shape
    chunks = tuple(max(1, int(c)) for c in chunks)
    if len(chunks) != len(shape):
        raise AXLearnWriteError(
            f"leaf {path!r:.200}: chunk shape {chunks} has not one dimension per dimension of "
            f"its shape {shape}"
        )
    return chunks


def plan_leaves(
    state: Any, *, chunk_shapes: Optional[dict] = None, rbg_prng_key: bool = True
) -> tuple[list[tuple[str, Any]], list[_Array], dict[str, dict]]:
    """Turns a state tree into AXLearn's index pairs, the arrays and the tf.data files to write.

    Args:
        state: The state: arrays (jax or numpy), JSON values, and tf.data iterator bytes leaves
            (an archive read from AXLearn's layout, or a `PerProcessBytes` of them).
        chunk_shapes: {leaf path: chunk shape}; default: a jax.Array's shard shape, else whole.
        rbg_prng_key: Write a threefry `prng_key` (uint32[2]) as the rbg key `[a, b, a, b]`.

    Returns:
        (index pairs after `["step", N]`, arrays, {leaf path: {process: {suffix: bytes}}}).

    Raises:
        AXLearnWriteError: Naming the leaf and the rule it breaks.
    """
    import jax  # pylint: disable=import-outside-toplevel

    chunk_shapes = chunk_shapes or {}
    pairs, _ = state_tree.flatten_state(state)
    index, arrays, tf_leaves = [], [], {}
    for path, leaf in pairs:
        if path == STEP_PATH:
            raise AXLearnWriteError(
                f"leaf {path!r}: AXLearn's index holds the step under this path; rename the leaf"
            )
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
                raise AXLearnWriteError(
                    f"leaf {path!r:.200} is not fully addressable by this process; the writer "
                    "runs in one process (restore onto one host first)"
                )
            value = np.asarray(leaf)
            if (
                rbg_prng_key
                and path == PRNG_KEY_PATH
                and value.dtype == np.uint32
                and value.shape == (2,)
            ):
                value = np.concatenate([value, value])
            shape = tuple(value.shape)
            chunks = _chunk_shape(path, leaf, shape, chunk_shapes)
            if value.shape != tuple(np.shape(leaf)):
                chunks = shape
            dtype = state_tree.dtype_name(value.dtype)
            index.append((path, {"dtype": dtype, "shape": str(shape)}))
            arrays.append(_Array(path=path, value=value, chunk_shape=chunks))
        elif isinstance(leaf, (bytes, bytearray, PerProcessBytes)):
            tf_leaves[path] = _tf_files(path, leaf)
            index.append((path, TF_ITERATOR_CLASS))
        elif leaf is None or isinstance(leaf, state_tree.VALUE_TYPES):
            index.append((path, leaf))
        else:
            raise AXLearnWriteError(
                f"leaf {path!r:.200} is a {type(leaf).__name__}; AXLearn's layout holds arrays, "
                "tf.data iterators and JSON values (bool, int, float, str, None)"
            )
    return index, arrays, tf_leaves


def encode_array(value: np.ndarray, chunk_shape: tuple[int, ...]) -> dict[str, bytes]:
    """Encodes an array as AXLearn's zarr v2 files: {".zarray" or chunk key: bytes}.

    TensorStore's zarr driver encodes it into an in-memory key-value store (no path opened);
    every chunk is stored, an all-zero one included.

    Args:
        value: The array.
        chunk_shape: The chunk shape (a shard's shape).

    Returns:
        The files of the array's directory.
    """
    import tensorstore as ts  # pylint: disable=import-outside-toplevel

    meta = {
        "zarr_format": 2,
        "shape": list(value.shape),
        "chunks": list(chunk_shape),
        "dtype": state_tree.zarr_dtype(value.dtype),
        "compressor": {"id": "zstd", "level": ZSTD_LEVEL},
        "fill_value": None,
        "filters": None,
        "order": "C",
        "dimension_separator": ".",
    }
    context = ts.Context()
    array = ts.open(
        {
            "driver": "zarr",
            "kvstore": {"driver": "memory"},
            "metadata": meta,
            "create": True,
            "store_data_equal_to_fill_value": True,
        },
        context=context,
    ).result()
    array.write(value).result()
    store = ts.KvStore.open({"driver": "memory"}, context=context).result()
    return {key.decode(): bytes(store[key]) for key in store.list().result()}


def _write_files(root: file_access.RunDir, arrays, tf_leaves) -> tuple[int, int, int]:
    """Writes every array and tf.data file below the step directory `root`."""
    num_chunks = raw = written = 0
    for array in arrays:
        directory = f"{layout.ARRAYS_DIR}/{array.path}"
        file_access.makedirs(root, directory)
        files = encode_array(array.value, array.chunk_shape)
        for name, data in sorted(files.items()):
            file_access.write_atomic(root, f"{directory}/{name}", data)
            if name != ".zarray":
                num_chunks += 1
                written += len(data)
        raw += array.value.nbytes
    for path, per_process in tf_leaves.items():
        for proc, files in per_process.items():
            target = f"tf_{proc}/{path}"
            file_access.makedirs(root, os.path.dirname(target))
            for suffix, data in sorted(files.items()):
                file_access.write_atomic(root, target + suffix, data)
    return num_chunks, raw, written


def write_step(
    base_dir: str,
    *,
    step: int,
    state: Any,
    chunk_shapes: Optional[dict] = None,
    rbg_prng_key: bool = True,
) -> WriteResult:
    """Writes `state` as step `step` of AXLearn's layout under `base_dir`, then verifies it.

    Args:
        base_dir: The checkpointer directory (created if missing); `step_%08d` is created in it.
        step: The step.
        state: The state tree (see `plan_leaves`).
        chunk_shapes: {leaf path: chunk shape} (see `plan_leaves`).
        rbg_prng_key: Write a threefry `prng_key` as AXLearn's rbg key (see `plan_leaves`).

    Returns:
        What was written.

    Raises:
        AXLearnWriteError: If a leaf cannot be written, the step directory exists already (or is
            a link), a file cannot be written, or the step read back differs (naming leaves).
    """
    start = time.perf_counter()
    pairs, arrays, tf_leaves = plan_leaves(
        state, chunk_shapes=chunk_shapes, rbg_prng_key=rbg_prng_key
    )
    index = [(STEP_PATH, int(step)), *pairs]
    try:
        index_bytes = json.dumps(index).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise AXLearnWriteError(f"step {step}: a value leaf is not JSON ({e})") from e
    name = layout.step_dir_name(step)
    step_dir = os.path.join(base_dir, name)
    try:
        with file_access.RunDir(base_dir, create=True) as base:
            file_access.makedirs(base, name, exist_ok=False)
            with file_access.open_subdir(base, name) as root:
                num_chunks, raw, written = _write_files(root, arrays, tf_leaves)
                file_access.write_atomic(root, layout.INDEX_FILE, index_bytes)
    except file_access.FileAccessError as e:
        raise AXLearnWriteError(f"{e}; the step is written into a new directory only") from e
    write_seconds = time.perf_counter() - start
    start = time.perf_counter()
    differing = verify_written(step_dir, step=step, pairs=pairs, arrays=arrays, tf=tf_leaves)
    if differing:
        aside = f"{layout.INDEX_FILE}.unverified-{int(time.time())}"
        file_access.rename(step_dir, layout.INDEX_FILE, aside)
        raise AXLearnWriteError(
            f"{step_dir}: read back, leaves {differing[:10]} differ from the state written; its "
            f"index was renamed {aside} (the step stays uncommitted)"
        )
    return WriteResult(
        step_dir=step_dir,
        num_arrays=len(arrays),
        num_chunks=num_chunks,
        raw_bytes=raw,
        chunk_file_bytes=written,
        write_seconds=write_seconds,
        verify_seconds=time.perf_counter() - start,
    )


def verify_written(
    step_dir: str, *, step: int, pairs: list, arrays: list[_Array], tf: dict
) -> list[str]:
    """Reads a written step back with our AXLearn-layout reader and compares every value.

    Args:
        step_dir: The step directory written.
        step: Its step.
        pairs: The index pairs written (after the step).
        arrays: The arrays written.
        tf: The tf.data files written ({path: {process: {suffix: bytes}}}).

    Returns:
        The paths that differ (dtype, shape, bytes, value or file); empty if all are equal.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer import tensorstore_restore

    index = layout.read_index_file(step_dir)
    if index.get("layout") != axlearn_layout.LAYOUT_NAME or index["step"] != step:
        return [STEP_PATH]
    target = {a.path: np.zeros(a.value.shape, a.value.dtype) for a in arrays}
    nested: dict = {}
    for path, leaf in target.items():
        node = nested
        *parents, last = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    restored, _ = tensorstore_restore.restore_state(
        ckpt_dir=step_dir,
        index=index,
        state=nested,
        budget_bytes=1 << 30,
        timeout_s=600.0,
        # Value leaves and tf.data files are compared below, not restored.
        validation=tensorstore_restore.CheckpointValidationType.CONTAINS_STATE,
    )
    got = dict(state_tree.flatten_state(restored)[0])
    differing = []
    for array in arrays:
        value = np.asarray(got.get(array.path))
        if (
            value.dtype != array.value.dtype
            or value.shape != array.value.shape
            or value.tobytes() != np.ascontiguousarray(array.value).tobytes()
        ):
            differing.append(array.path)
    leaves = {leaf["path"]: leaf for leaf in index["leaves"]}
    for path, value in pairs:
        leaf = leaves.get(path)
        if leaf is None:
            differing.append(path)
        elif leaf["kind"] == layout.KIND_VALUE and (
            leaf["value"] != value or type(leaf["value"]) is not type(value)
        ):
            differing.append(path)
    with layout.open_step_dir(step_dir) as root:
        for path, per_process in tf.items():
            for proc, files in per_process.items():
                for suffix, data in files.items():
                    back = file_access.read_bytes(
                        root, f"tf_{proc}/{path}{suffix}", max_bytes=len(data)
                    )
                    if back != data:
                        differing.append(f"{path} (tf_{proc}{suffix})")
    return differing


def _read_bytes_leaf(step_dir: str, entry: dict) -> dict[str, bytes]:
    """{process: bytes} of a bytes leaf of our layout, each file checked against its CRC-32."""
    out = {}
    with layout.open_step_dir(step_dir) as root:
        for proc, info in sorted(entry["per_process"].items()):
            file, size = str(info.get("file")), info.get("size")
            shown = os.path.join(step_dir, file)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise AXLearnWriteError(f"{shown}: its index entry has no valid size")
            try:
                data = file_access.read_bytes(root, file, max_bytes=size)
            except file_access.FileAccessError as e:
                raise AXLearnWriteError(f"{shown} (leaf {entry['path']!r:.200}): {e.rule}") from e
            if len(data) != size or state_tree.crc32_hex(data) != info.get("checksum"):
                raise AXLearnWriteError(
                    f"{shown} (leaf {entry['path']!r:.200}) does not match its size/checksum in "
                    "the index"
                )
            out[str(proc)] = data
    return out


def convert_step_dir(src: str, dst: str, *, rbg_prng_key: bool = True) -> WriteResult:
    """Writes the committed step `src` of our layout as the same step of AXLearn's under `dst`.

    Arrays keep their saved chunk shapes (one chunk per saved shard); every chunk read is
    checked against its CRC-32; the written step is read back and compared (`write_step`).

    Args:
        src: A committed `step_%08d` directory of this checkpointer's layout.
        dst: The checkpointer directory to write the step into.
        rbg_prng_key: Write a threefry `prng_key` as AXLearn's rbg key (see `plan_leaves`).

    Returns:
        What was written.

    Raises:
        AXLearnWriteError: If `src` is not a committed step of our layout, a leaf cannot be
            written in AXLearn's layout, or the destination step exists.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer import tensorstore_restore, verify

    src = os.path.normpath(src)
    try:
        step = layout.parse_step_from_dir(src)
        index = layout.read_index_file(src)
    except ValueError as e:  # CheckpointIndexError is a ValueError.
        raise AXLearnWriteError(f"{e}; pass one committed step directory of ours") from e
    if index.get("layout") == axlearn_layout.LAYOUT_NAME:
        raise AXLearnWriteError(f"{src} is already in AXLearn's layout; nothing to convert")
    spec = verify.read_state_spec(src)
    bytes_leaves = {}
    for entry in index["leaves"]:
        if entry["kind"] == layout.KIND_BYTES:
            bytes_leaves[entry["path"]] = _read_bytes_leaf(src, entry)
            node = spec
            *parents, last = entry["path"].split("/")
            for part in parents:
                node = node[part]
            del node[last]
    restored, _ = tensorstore_restore.restore_state(
        ckpt_dir=src,
        index=index,
        state=spec,
        budget_bytes=1 << 30,
        timeout_s=600.0,
        validation=tensorstore_restore.CheckpointValidationType.CONTAINS_STATE,
    )
    for path, per_process in bytes_leaves.items():
        node = restored
        *parents, last = path.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = PerProcessBytes(per_process)
    chunk_shapes = {
        e["path"]: tuple(e["chunk_shape"])
        for e in index["leaves"]
        if e["kind"] == layout.KIND_ARRAY
    }
    return write_step(
        dst, step=step, state=restored, chunk_shapes=chunk_shapes, rbg_prng_key=rbg_prng_key
    )
