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
"""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from axlearn.common.checkpointer import layout, state_tree

_ZARRAY = ".zarray"


def _tree_array_dirs(step_dir: str) -> set[str]:
    """The relative paths (`gda/...`) of every directory under `gda/` holding a `.zarray`."""
    root = os.path.join(step_dir, layout.ARRAYS_DIR)
    found = set()
    for d, _, names in os.walk(root):
        if _ZARRAY in names:
            found.add(os.path.relpath(d, step_dir).replace(os.sep, "/"))
    return found


def _tree_host_files(step_dir: str) -> set[str]:
    """The relative paths (`host/process_<i>/...`) of every file under `host/`."""
    root = os.path.join(step_dir, layout.HOST_DIR)
    found = set()
    for d, _, names in os.walk(root):
        for name in names:
            found.add(os.path.relpath(os.path.join(d, name), step_dir).replace(os.sep, "/"))
    return found


def _expected_zarray(entry: dict) -> dict:
    return json.loads(
        state_tree.zarr_metadata_json(
            shape=entry["shape"],
            dtype=state_tree.parse_dtype(entry["dtype"]),
            chunk_shape=entry["chunk_shape"],
        )
    )


def check_zarray(step_dir: str, entry: dict) -> Optional[str]:
    """Returns what is wrong with the `.zarray` of an array leaf, or None."""
    file = os.path.join(step_dir, entry["file"], _ZARRAY)
    leaf = entry["path"]
    try:
        with open(file, "rb") as f:
            found = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        return f"{file} (leaf {leaf!r}): zarr metadata missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"{file} (leaf {leaf!r}): zarr metadata unreadable: {e}"
    try:
        expected = _expected_zarray(entry)
    except (TypeError, ValueError) as e:
        return f"{os.path.join(step_dir, layout.INDEX_FILE)}: leaf {leaf!r} is malformed: {e}"
    if not isinstance(found, dict):
        return f"{file} (leaf {leaf!r}): zarr metadata is not a JSON object"
    diffs = [
        f"{key} {found.get(key)!r} (index: {expected[key]!r})"
        for key in sorted(expected)
        if found.get(key) != expected[key]
    ]
    if diffs:
        return f"{file} (leaf {leaf!r}): zarr metadata disagrees with the index: " + ", ".join(
            diffs
        )
    return None


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
    errors = []
    indexed_arrays, indexed_files = set(), set()
    for entry in index["leaves"]:
        if entry["kind"] == layout.KIND_ARRAY:
            indexed_arrays.add(str(entry["file"]).strip("/"))
            error = check_zarray(step_dir, entry)
            if error:
                errors.append(error)
        elif entry["kind"] == layout.KIND_BYTES:
            for info in entry["per_process"].values():
                indexed_files.add(str(info.get("file", "")))
    index_file = os.path.join(step_dir, layout.INDEX_FILE)
    for rel in sorted(_tree_array_dirs(step_dir) - indexed_arrays):
        errors.append(
            f"{os.path.join(step_dir, rel)}: an array on disk that {index_file} does not list "
            "(the index lost a leaf)"
        )
    for rel in sorted(_tree_host_files(step_dir) - indexed_files):
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
    array_dirs = _tree_array_dirs(step_dir)
    if not array_dirs:
        return False
    for rel in array_dirs:
        array_dir = os.path.join(step_dir, rel)
        try:
            with open(os.path.join(array_dir, _ZARRAY), "rb") as f:
                meta = json.loads(f.read().decode("utf-8"))
            shape = [int(d) for d in meta["shape"]]
            chunks = [max(1, int(c)) for c in meta["chunks"]]
            itemsize = _zarr_itemsize(meta["dtype"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if 0 in shape:
            continue
        chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * itemsize
        grid = [-(-d // c) for d, c in zip(shape, chunks)]
        for grid_index in np.ndindex(*grid) if grid else [()]:
            file = os.path.join(array_dir, layout.chunk_key(tuple(grid_index)))
            try:
                if os.path.getsize(file) != chunk_bytes:
                    return False
            except OSError:
                return False
    return True
