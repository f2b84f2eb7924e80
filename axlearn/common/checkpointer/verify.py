"""Inspecting checkpoints without a model: list steps, verify every chunk, read the leaf specs."""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from typing import Any, Optional

import jax
import numpy as np

from axlearn.common import file_access
from axlearn.common.checkpointer import axlearn_layout, chunk_file, layout, metadata, state_tree


@dataclasses.dataclass
class CheckpointInfo:
    """A step directory as `list_checkpoints` sees it.

    Attributes:
        step: The step.
        path: The directory.
        committed: Whether its commit marker (`index`) exists (readable or not).
        size_bytes: Total size of its files.
        num_leaves: Leaves in the index (None if uncommitted).
        error: Why the index is unreadable, if it is.
        layout: "axlearn" for AXLearn's own layout (no checksums), else None (ours).
    """

    step: int
    path: str
    committed: bool
    size_bytes: int
    num_leaves: Optional[int] = None
    error: Optional[str] = None
    layout: Optional[str] = None


@dataclasses.dataclass
class VerifyResult:
    """The outcome of `verify_checkpoint`.

    Attributes:
        step: The step.
        path: The directory.
        committed: Whether its commit marker (`index`) exists; an unreadable one is an error.
        num_leaves: Leaves checked.
        num_chunks: Chunk files checked.
        num_bytes: Bytes of array data checked.
        errors: One message per problem (file and leaf named); empty if the checkpoint is good.
        layout: "axlearn" for AXLearn's own layout (no checksums: chunks are checked present and
            decodable to their shape, not against a checksum), else None (ours).
    """

    step: int
    path: str
    committed: bool
    num_leaves: int = 0
    num_chunks: int = 0
    num_bytes: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    layout: Optional[str] = None

    @property
    def ok(self) -> bool:
        """Committed and without errors."""
        return self.committed and not self.errors


def _dir_size(path: str) -> int:
    """Bytes of the regular files below a step directory (links neither followed nor counted)."""
    total = 0
    try:
        step = layout.open_step_dir(path)
    except file_access.FileAccessError:
        return 0
    with step:
        for _, _, files, dir_fd in os.fwalk(".", dir_fd=step.fd):
            for name in files:
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def list_checkpoints(base_dir: str) -> list[CheckpointInfo]:
    """Lists every `step_%08d` directory under `base_dir`, committed or not.

    Args:
        base_dir: The checkpointer directory.

    Returns:
        One entry per step directory, oldest first.
    """
    result = []
    for step, path in layout.step_dirs(base_dir):
        info = CheckpointInfo(step=step, path=path, committed=False, size_bytes=_dir_size(path))
        if layout.is_committed(path):
            info.committed = True
            try:
                index = layout.read_index_file(path)
                info.num_leaves = len(index["leaves"])
                info.layout = index.get("layout")
            except layout.CheckpointIndexError as e:
                info.error = str(e)
        result.append(info)
    return result


def verify_checkpoint(step_dir: str) -> VerifyResult:
    """Checks a step directory: its metadata (`metadata.check_metadata`: the index against the
    tree, every `.zarray` against the index) and every chunk and bytes file against the index's
    checksums.

    Args:
        step_dir: The step directory.

    Returns:
        The result; `errors` names each missing/corrupt file and its leaf.
    """
    step = layout.parse_step_from_dir(step_dir)
    result = VerifyResult(step=step, path=step_dir, committed=False)
    try:
        index = layout.read_index_file(step_dir)
    except layout.CheckpointIndexError as e:
        # An index that exists but cannot be read is a corrupt checkpoint, not an uncommitted one.
        result.committed = layout.is_committed(step_dir)
        result.errors.append(str(e))
        return result
    result.committed = True
    result.layout = index.get("layout")
    if index["step"] != step:
        result.errors.append(f"index is for step {index['step']}, directory for step {step}")
    try:
        root = layout.open_step_dir(step_dir)
    except file_access.FileAccessError as e:
        result.errors.append(str(e))
        return result
    with root:
        _verify_files(root, index, result)
    return result


def _verify_files(root: file_access.RunDir, index: dict, result: VerifyResult) -> None:
    """Checks the metadata and every file of a step (below `root`, no link followed)."""
    step_dir = root.path
    result.errors.extend(metadata.check_metadata(root, index))
    for entry in index["leaves"]:
        result.num_leaves += 1
        path = entry["path"]
        if entry["kind"] == layout.KIND_BYTES:
            for proc, info in sorted(entry["per_process"].items()):
                file = os.path.join(step_dir, str(info["file"]))
                if info.get("axlearn_tf"):
                    if not file_access.is_regular(root, f"{info['file']}.index"):
                        result.errors.append(
                            f"{file}.index (leaf {path!r}, process {proc}): missing"
                        )
                    continue
                size = info.get("size")
                if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                    result.errors.append(f"{file} (leaf {path!r}, process {proc}): no valid size")
                    continue
                try:
                    value = file_access.read_bytes(root, str(info["file"]), max_bytes=size)
                except file_access.FileAccessError as e:
                    why = "missing" if e.errno == errno.ENOENT else e.rule
                    if e.errno == errno.EFBIG:
                        why = f"larger than its size in the index ({size} bytes)"
                    result.errors.append(f"{file} (leaf {path!r}, process {proc}): {why}")
                    continue
                if state_tree.crc32_hex(value) != info["checksum"] or len(value) != info["size"]:
                    result.errors.append(
                        f"{file} (leaf {path!r}, process {proc}): checksum mismatch"
                    )
            continue
        if entry["kind"] != layout.KIND_ARRAY:
            continue
        if metadata.check_zarray(root, entry) is not None:
            continue  # Reported by check_metadata; its chunks cannot be read through it.
        _verify_array(root, entry, result)


def _verify_array(root: file_access.RunDir, entry: dict, result: VerifyResult) -> None:
    """Checks every chunk file of one array leaf against the index's CRC-32s.

    The arrays are uncompressed, C-order zarr (see `state_tree.zarr_spec`), so a chunk file holds
    exactly the chunk's bytes (edge chunks padded to the full chunk shape): each is read whole
    (`chunk_file.read_chunk`, as restore reads it) and its region's bytes checksummed. Checksums
    and reads run without Python's GIL, so a verification in the background (garbage
    collection during training) costs the training loop little.
    """
    path = entry["path"]
    shape = tuple(entry["shape"])
    dtype = state_tree.parse_dtype(entry["dtype"])
    chunk_shape = tuple(max(1, c) for c in entry["chunk_shape"])
    step_dir = root.path
    array_rel = str(entry["file"])
    array_dir = os.path.join(step_dir, array_rel)
    if 0 in shape:
        return
    grid = [-(-d // c) for d, c in zip(shape, chunk_shape)]
    if entry["checksum"] is None:
        _verify_axlearn_array(root, entry, result, grid)
        return
    sums = entry["checksum"].get("crc32", {})
    for grid_index in np.ndindex(*grid) if grid else [()]:
        key = layout.chunk_key(tuple(grid_index))
        file = os.path.join(array_dir, key)
        result.num_chunks += 1
        expected = sums.get(key)
        if expected is None:
            result.errors.append(f"{file} (leaf {path!r}): no checksum in the index")
            continue
        extent = tuple(min(c, d - g * c) for g, c, d in zip(grid_index, chunk_shape, shape))
        try:
            data = chunk_file.read_chunk(
                f"{array_rel}/{key}", dtype=dtype, chunk_shape=chunk_shape, extent=extent, root=root
            )
        except FileNotFoundError:
            result.errors.append(f"{file} (leaf {path!r}): missing")
            continue
        except chunk_file.ChunkSizeError as e:
            result.errors.append(
                f"{file} (leaf {path!r}): unreadable: {e.size} bytes, expected {e.expected}"
            )
            continue
        except file_access.FileAccessError as e:
            result.errors.append(f"{file} (leaf {path!r}): unreadable: {e.rule}")
            continue
        except OSError as e:
            result.errors.append(f"{file} (leaf {path!r}): unreadable: {e.strerror}")
            continue
        result.num_bytes += data.nbytes
        if state_tree.crc32_hex(data) != expected:
            result.errors.append(f"{file} (leaf {path!r}): checksum mismatch")


def _verify_axlearn_array(
    root: file_access.RunDir, entry: dict, result: VerifyResult, grid: list[int]
) -> None:
    """Checks that every chunk of an AXLearn-layout array is present and decodes to its shape.

    AXLearn's layout carries no checksums: a chunk altered into other valid data is not found.
    """
    path = entry["path"]
    dtype = state_tree.parse_dtype(entry["dtype"])
    chunk_shape = tuple(max(1, c) for c in entry["chunk_shape"])
    raw = int(np.prod(chunk_shape, dtype=np.int64)) * dtype.itemsize
    for grid_index in np.ndindex(*grid) if grid else [()]:
        rel = f"{entry['file']}/{layout.chunk_key(tuple(grid_index))}"
        file = os.path.join(root.path, rel)
        result.num_chunks += 1
        try:
            data = file_access.read_bytes(
                root, rel, max_bytes=axlearn_layout.max_chunk_file_bytes(raw)
            )
        except file_access.FileAccessError as e:
            why = "missing" if e.errno == errno.ENOENT else f"unreadable: {e.rule}"
            result.errors.append(f"{file} (leaf {path!r}): {why}")
            continue
        try:
            chunk = axlearn_layout.decode_chunk(
                data, compressor=entry.get("compressor"), dtype=dtype, chunk_shape=chunk_shape
            )
        except ValueError:
            result.errors.append(
                f"{file} (leaf {path!r}): not a valid {entry.get('compressor') or 'raw'} chunk "
                f"of {dtype.name}{list(chunk_shape)} ({len(data)} bytes)"
            )
            continue
        result.num_bytes += chunk.nbytes


def read_state_spec(step_dir: str) -> dict[str, Any]:
    """Returns the saved leaves of a committed step as a nested dict, to restore into.

    Array leaves become `ShapeDtypeStruct`s (set shardings on them, or pass them as is for
    single-device restores), bytes leaves (e.g. a trainer's `input_iter`) become `b""` and
    value leaves their saved value. Pass the tree as `state` of `Checkpointer.restore` when the
    original state structure is not at hand: every leaf of the checkpoint is in it, so the
    restore of a trainer checkpoint works as that of any other.

    Args:
        step_dir: The committed step directory.

    Returns:
        {key: {key: ... leaf}} following the '/'-separated leaf paths.

    Raises:
        CheckpointIndexError: If the index is missing or unreadable.
    """
    index = layout.read_index_file(step_dir)
    tree: dict[str, Any] = {}
    for entry in index["leaves"]:
        kind = entry["kind"]
        if kind == layout.KIND_ARRAY:
            leaf = jax.ShapeDtypeStruct(
                tuple(entry["shape"]), state_tree.parse_dtype(entry["dtype"])
            )
        elif kind == layout.KIND_BYTES:
            leaf = b""
        else:
            leaf = entry["value"]
        node = tree
        *parents, name = entry["path"].split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = leaf
    return tree
