"""Checks a step directory's metadata: the index against the tree it describes, and every
array's `.zarray` against the index.

The chunk checksums in the index prove the array bytes; these checks prove the rest: that the
index still names every leaf saved in the directory (a leaf removed from the index would
otherwise restore as a model mismatch, or verify as OK), and that each array's zarr metadata has
the shape, dtype and chunking the index says (a damaged `.zarray` would otherwise be restored,
or read by other zarr readers, without a word). Restore, `axlearn checkpoint verify` and garbage
collection all use them, so a step whose metadata disagrees is never restored or removed
silently.

`chunks_complete` judges a directory without an index: whether every chunk its `.zarray` files
describe is present at full size (an index lost after the save finished, not a save cut short).

Every file is read through `axlearn.common.file_access` below the step directory's descriptor:
no link followed at any component, regular files only, `.zarray` reads bounded
(`MAX_ZARRAY_BYTES`), so a `.zarray` linked to an outside file or to `/dev/zero`, or a FIFO in
its place, is one error naming the file and never its content.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Optional

import numpy as np

from axlearn.common import file_access
from axlearn.common.checkpointer import layout, state_tree

_ZARRAY = ".zarray"
# The most bytes a `.zarray` may hold (ours are about 300); a larger one is refused unread.
MAX_ZARRAY_BYTES = 64 << 10
# The deepest JSON nesting of a `.zarray` (ours is 2).
MAX_ZARRAY_DEPTH = 8


def _walk(step: file_access.RunDir, top: str):
    """(relative dir, file names) of every directory below `top` of `step`, links not followed."""
    try:
        for rel, _, names in file_access.walk(step, top):
            yield rel, names
    except file_access.FileAccessError:
        return


def _tree_array_dirs(step: file_access.RunDir) -> set[str]:
    """The relative paths (`gda/...`) of every directory under `gda/` holding a `.zarray`."""
    return {d for d, names in _walk(step, layout.ARRAYS_DIR) if _ZARRAY in names}


def _tree_host_files(step: file_access.RunDir) -> set[str]:
    """The relative paths (`host/process_<i>/...`) of every file under `host/`."""
    return {f"{d}/{n}" for d, names in _walk(step, layout.HOST_DIR) for n in names}


def _open_step(step_dir: str | file_access.RunDir) -> tuple[file_access.RunDir, bool]:
    if isinstance(step_dir, file_access.RunDir):
        return step_dir, False
    return layout.open_step_dir(step_dir), True


def read_zarray(step: file_access.RunDir, rel: str) -> dict:
    """Reads the `.zarray` of the array directory `rel` of a step (bounded, no link followed).

    Args:
        step: The step directory.
        rel: The array directory, relative to it (`gda/<leaf>`).

    Returns:
        The parsed metadata.

    Raises:
        FileAccessError: If it is missing, a link, not regular, too large, not UTF-8 or not JSON.
    """
    return file_access.read_json(
        step, f"{rel}/{_ZARRAY}", max_bytes=MAX_ZARRAY_BYTES, max_depth=MAX_ZARRAY_DEPTH
    )


def _expected_zarray(entry: dict) -> dict:
    return json.loads(
        state_tree.zarr_metadata_json(
            shape=entry["shape"],
            dtype=state_tree.parse_dtype(entry["dtype"]),
            chunk_shape=entry["chunk_shape"],
        )
    )


def check_zarray(step_dir: str | file_access.RunDir, entry: dict) -> Optional[str]:
    """Returns what is wrong with the `.zarray` of an array leaf, or None.

    Args:
        step_dir: The step directory (a path or an open `file_access.RunDir`).
        entry: The leaf's index entry.

    Returns:
        One message naming the file, the leaf and what is wrong (never the file's content).
    """
    step, owned = _open_step(step_dir)
    try:
        return _check_zarray(step, entry)
    finally:
        if owned:
            step.close()


def _check_zarray(step: file_access.RunDir, entry: dict) -> Optional[str]:
    if entry.get("checksum") is None:
        # AXLearn's layout: its `.zarray` was read and checked with its index
        # (`axlearn_layout.parse_index`), zstd compressor included.
        return None
    file = os.path.join(step.path, str(entry["file"]), _ZARRAY)
    leaf = entry["path"]
    try:
        found = read_zarray(step, str(entry["file"]))
    except file_access.FileAccessError as e:
        if e.errno == errno.ENOENT:
            return f"{file} (leaf {leaf!r}): zarr metadata missing"
        return f"{file} (leaf {leaf!r}): zarr metadata unreadable: {e.rule}"
    step_dir = step.path
    try:
        expected = _expected_zarray(entry)
    except (TypeError, ValueError) as e:
        return f"{os.path.join(step_dir, layout.INDEX_FILE)}: leaf {leaf!r} is malformed: {e}"
    if not isinstance(found, dict):
        return f"{file} (leaf {leaf!r}): zarr metadata is not a JSON object"
    diffs = [
        f"{key} {_short(found.get(key))} (index: {expected[key]!r})"
        for key in sorted(expected)
        if found.get(key) != expected[key]
    ]
    if diffs:
        return f"{file} (leaf {leaf!r}): zarr metadata disagrees with the index: " + ", ".join(
            diffs
        )
    return None


def _short(value: object) -> str:
    """A value read from a file, shown at most 80 characters long."""
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _zarr_itemsize(zarr_dtype: str) -> int:
    """Bytes per element of a zarr v2 dtype string ('<f4', or a name such as 'bfloat16')."""
    try:
        return np.dtype(zarr_dtype).itemsize
    except TypeError:
        return state_tree.parse_dtype(zarr_dtype).itemsize


def check_metadata(step_dir: str, index: dict) -> list[str]:
    """Checks `index` against the files of `step_dir` (cheap: no chunk is read).

    - every array leaf's `.zarray` exists and has the index's shape, dtype and chunk shape;
    - every array directory and bytes file in the tree is named by the index (a leaf removed
      from the index is found).
    Missing chunk and bytes files are found when they are read (restore, verify).

    Args:
        step_dir: The step directory.
        index: Its parsed index (`layout.read_index_file`).

    Returns:
        One message per problem, naming the file and the leaf; empty if the metadata agrees.
    """
    try:
        step, owned = _open_step(step_dir)
    except file_access.FileAccessError as e:
        return [str(e)]
    try:
        return _check_metadata(step, index)
    finally:
        if owned:
            step.close()


def _check_metadata(step: file_access.RunDir, index: dict) -> list[str]:
    step_dir = step.path
    errors = []
    indexed_arrays, indexed_files = set(), set()
    for entry in index["leaves"]:
        if entry["kind"] == layout.KIND_ARRAY:
            indexed_arrays.add(os.path.normpath(str(entry["file"])).replace(os.sep, "/"))
            error = _check_zarray(step, entry)
            if error:
                errors.append(error)
        elif entry["kind"] == layout.KIND_BYTES:
            for info in entry["per_process"].values():
                indexed_files.add(os.path.normpath(str(info.get("file", ""))).replace(os.sep, "/"))
    index_file = os.path.join(step_dir, layout.INDEX_FILE)
    for rel in sorted(_tree_array_dirs(step) - indexed_arrays):
        errors.append(
            f"{os.path.join(step_dir, rel)}: an array on disk that {index_file} does not list "
            "(the index lost a leaf)"
        )
    for rel in sorted(_tree_host_files(step) - indexed_files):
        errors.append(
            f"{os.path.join(step_dir, rel)}: a bytes file on disk that {index_file} does not list "
            "(the index lost a leaf)"
        )
    return errors


def chunks_complete(step_dir: str) -> bool:
    """Whether a step directory without an index holds a complete set of arrays.

    True when `gda/` holds at least one array and, for every array, a readable `.zarray` and
    every chunk file of its grid at full size. Such a directory is a finished save whose index
    was lost, not an interrupted save: it is set aside, never deleted (see recovery.py).

    Args:
        step_dir: The step directory.

    Returns:
        Whether every array's chunks are present at full size.
    """
    try:
        step = layout.open_step_dir(step_dir)
    except file_access.FileAccessError:
        return False
    with step:
        return _chunks_complete(step)


def _chunks_complete(step: file_access.RunDir) -> bool:
    array_dirs = _tree_array_dirs(step)
    if not array_dirs:
        return False
    for rel in array_dirs:
        try:
            meta = read_zarray(step, rel)
            shape = [int(d) for d in meta["shape"]]
            chunks = [max(1, int(c)) for c in meta["chunks"]]
            itemsize = _zarr_itemsize(meta["dtype"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if 0 in shape:
            continue
        chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * itemsize
        grid = [-(-d // c) for d, c in zip(shape, chunks)]
        with file_access.open_subdir(step, rel) as array_dir:
            for grid_index in np.ndindex(*grid) if grid else [()]:
                try:
                    st = os.stat(
                        layout.chunk_key(tuple(grid_index)),
                        dir_fd=array_dir.fd,
                        follow_symlinks=False,
                    )
                except OSError:
                    return False
                if not stat.S_ISREG(st.st_mode) or st.st_size != chunk_bytes:
                    return False
    return True
