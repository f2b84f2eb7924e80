"""On-disk layout of checkpoints: step directories, the `index` commit marker, leaf paths.

```
<dir>/step_00000100/            one directory per step, `step_%08d`
    gda/<leaf path>/            one zarr array (TensorStore) per array leaf, named by tree path
        .zarray                 zarr metadata
        0.0, 0.1, ...           one chunk file per saved shard (no compression)
    host/process_<i>/<leaf path> per-process bytes leaves (e.g. input iterator state)
    index                       JSON, written last: the commit marker
```

A step directory without a readable `index` is uncommitted: it is never restored.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
from typing import Any, Optional

from absl import logging

from axlearn.common.path_containment import PathContainmentError, contained_path

# Directory name of a step: `step_` followed by exactly 8 digits.
STEP_DIR_PREFIX = "step_"
_STEP_DIR_RE = re.compile(r"^step_(\d{8})$")
# The commit marker, written after every array of the step has been written.
INDEX_FILE = "index"
# Sub-directory holding one zarr array per array leaf.
ARRAYS_DIR = "gda"
# Sub-directory holding per-process bytes leaves.
HOST_DIR = "host"
# Sub-directory where processes leave their shard checksums for process 0 (multi-process only).
MANIFESTS_DIR = "manifests"
# Identifies our index format.
INDEX_FORMAT = "axlearn.checkpoint"
INDEX_VERSION = 1
# Version of the state layout (the fields of optimizer states) a checkpoint was written with.
# Indexes without `state_layout` predate version 2, which gave `EmaState` its `scale` field and
# renamed `SkipClipState.grad_norm_var_ema` to `grad_norm_square_ema` (AXLearn's layouts).
STATE_LAYOUT_VERSION = 2
# Kinds of leaves in the index.
KIND_ARRAY = "array"
KIND_VALUE = "value"
KIND_BYTES = "bytes"
# Name used for the leaf path of a state that is a single leaf (empty tree path).
ROOT_LEAF_NAME = "_root"


class CheckpointIndexError(ValueError):
    """An `index` file is missing, unreadable or malformed."""


def step_dir_name(step: int) -> str:
    """Returns the directory name of `step`, `step_%08d`.

    Args:
        step: A step in [0, 10**8).

    Returns:
        The name.

    Raises:
        ValueError: If the step is out of range.
    """
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**8:
        raise ValueError(f"Checkpoint step must be an int in [0, 10**8), got {step!r}")
    return f"{STEP_DIR_PREFIX}{step:08d}"


def parse_step_from_dir(step_dir: str) -> int:
    """Returns the step of a step directory path like `.../step_00000100`.

    Args:
        step_dir: The directory path.

    Returns:
        The step.

    Raises:
        ValueError: If the base name is not `step_%08d`.
    """
    match = _STEP_DIR_RE.match(os.path.basename(os.path.normpath(step_dir)))
    if not match:
        raise ValueError(f"Not a checkpoint step directory (step_%08d): {step_dir}")
    return int(match.group(1))


def step_dirs(base_dir: str) -> list[tuple[int, str]]:
    """Returns (step, path) of every `step_%08d` directory under `base_dir`, committed or not.

    Args:
        base_dir: The checkpointer directory; may not exist.

    Returns:
        Pairs sorted by step.
    """
    try:
        names = os.listdir(base_dir)
    except FileNotFoundError:
        return []
    result = []
    for name in names:
        match = _STEP_DIR_RE.match(name)
        path = os.path.join(base_dir, name)
        if match and os.path.islink(path):
            _warn_linked_step_dir(path)
            continue
        if match and os.path.isdir(path):
            result.append((int(match.group(1)), path))
    return sorted(result)


# Linked step directories already warned about (garbage collection lists steps every interval).
_warned_links: set[str] = set()


def _warn_linked_step_dir(path: str) -> None:
    if path not in _warned_links:
        _warned_links.add(path)
        logging.warning(
            "Ignoring %s: it is a symbolic link (to %r). Checkpoints never follow a link out of "
            "their directory: restore, garbage collection and set-aside leave it and its target "
            "alone. Replace it with a copy of the step to use it.",
            path,
            os.readlink(path),
        )


def is_committed(step_dir: str) -> bool:
    """Whether `step_dir` has an `index` file (cheap check; the index is not parsed).

    A step directory that is a symbolic link is never committed: it is not a step of this
    directory (see `step_dirs`).
    """
    return not os.path.islink(step_dir) and os.path.isfile(os.path.join(step_dir, INDEX_FILE))


def checkpoint_paths(base_dir: str) -> list[str]:
    """Returns the committed step directories under `base_dir` (those with an `index`), by step.

    Args:
        base_dir: The checkpointer directory.

    Returns:
        The directory paths, oldest first.
    """
    return [path for _, path in step_dirs(base_dir) if is_committed(path)]


def latest_checkpoint_path(base_dir: str) -> Optional[str]:
    """Returns the newest step directory under `base_dir` whose index is readable, else None.

    Uncommitted directories newer than it and directories with unreadable indices are skipped with
    a warning that names them.

    Args:
        base_dir: The checkpointer directory.

    Returns:
        The directory path, or None if there is no committed checkpoint.
    """
    for step, path in reversed(step_dirs(base_dir)):
        if not is_committed(path):
            logging.warning(
                "Skipping uncommitted checkpoint %s (no %s file: its save did not finish).",
                path,
                INDEX_FILE,
            )
            continue
        try:
            read_index_file(path)
        except CheckpointIndexError as e:
            logging.warning("Skipping corrupt checkpoint %s: %s", path, e)
            continue
        del step
        return path
    return None


def latest_checkpoint_step(base_dir: str) -> Optional[int]:
    """Returns the step of `latest_checkpoint_path(base_dir)`, or None if there is none.

    Args:
        base_dir: The checkpointer directory.

    Returns:
        The newest committed step, or None.
    """
    path = latest_checkpoint_path(base_dir)
    return None if path is None else parse_step_from_dir(path)


def sync_filesystem(path: str) -> None:
    """Makes everything written to the filesystem holding `path` durable (Linux `syncfs`).

    One call after a save's files replaces an fsync per file and per directory (each a journal
    commit). Falls back to `os.sync()` where `syncfs` is unavailable.

    Args:
        path: Any file or directory on the filesystem.
    """
    libc = _libc()
    syncfs = getattr(libc, "syncfs", None) if libc is not None else None
    if syncfs is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs failed: {os.strerror(err)}", path)
    finally:
        os.close(fd)


@functools.cache
def _libc() -> Optional[ctypes.CDLL]:
    """The C library of this process (None where it cannot be loaded)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _fsync_dir(path: str) -> None:
    """Makes the entries of directory `path` (files created, renamed or removed) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomically(path: str, value: Any) -> None:
    """Writes `value` as JSON to `path` via a temporary file, fsync and rename.

    Args:
        path: The destination file.
        value: A JSON-serializable value.
    """
    tmp_path = f"{path}.tmp.{os.getpid()}"
    data = json.dumps(value, sort_keys=True).encode("utf-8")
    with open(tmp_path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_path, path)
    _fsync_dir(os.path.dirname(path) or ".")


def write_index_file(step_dir: str, index: dict) -> None:
    """Writes the commit marker `step_dir/index` atomically.

    Args:
        step_dir: The step directory.
        index: The index (see `make_index`).
    """
    write_json_atomically(os.path.join(step_dir, INDEX_FILE), index)


def make_index(*, step: int, process_count: int, leaves: list[dict]) -> dict:
    """Returns an index dict.

    Args:
        step: The step.
        process_count: How many processes wrote the checkpoint.
        leaves: One entry per leaf (see `read_index_file` for the fields).

    Returns:
        The index.
    """
    return dict(
        format=INDEX_FORMAT,
        version=INDEX_VERSION,
        step=step,
        process_count=process_count,
        state_layout=STATE_LAYOUT_VERSION,
        leaves=leaves,
    )


_REQUIRED_LEAF_FIELDS = {
    KIND_ARRAY: ("dtype", "shape", "chunk_shape", "file", "checksum"),
    KIND_VALUE: ("value",),
    KIND_BYTES: ("per_process",),
}


def read_index_file(step_dir: str) -> dict:
    """Reads and validates `step_dir/index`.

    The index is JSON: `{"format", "version", "step", "process_count", "leaves": [...]}`. Each leaf
    has `path` and `kind`:
    - `array`: `dtype` (numpy name), `shape`, `chunk_shape`, `file` (relative zarr path),
      `checksum` ({"crc32": {chunk key: 8 hex digits}}).
    - `value`: a small JSON value (`value`), e.g. an int or string.
    - `bytes`: `per_process` ({process index: {"file", "size", "checksum"}}).

    Args:
        step_dir: The step directory.

    Returns:
        The index dict.

    Raises:
        CheckpointIndexError: If the file is missing, not JSON, or malformed.
    """
    path = os.path.join(step_dir, INDEX_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            index = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError as e:
        raise CheckpointIndexError(f"{path} does not exist (uncommitted checkpoint)") from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointIndexError(
                f"{path} is a symbolic link; an index is never read through a link (its target "
                "is outside what this step directory holds)"
            ) from e
        raise CheckpointIndexError(f"{path} is not a readable JSON index: {e}") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointIndexError(f"{path} is not a readable JSON index: {e}") from e
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise CheckpointIndexError(f"{path} is not an {INDEX_FORMAT} index")
    if index.get("version") != INDEX_VERSION:
        raise CheckpointIndexError(
            f"{path} has index version {index.get('version')!r}; this code reads {INDEX_VERSION}"
        )
    if not isinstance(index.get("step"), int) or not isinstance(index.get("leaves"), list):
        raise CheckpointIndexError(f"{path} lacks a valid step or leaves list")
    for leaf in index["leaves"]:
        kind = leaf.get("kind") if isinstance(leaf, dict) else None
        if kind not in _REQUIRED_LEAF_FIELDS or not isinstance(leaf.get("path"), str):
            raise CheckpointIndexError(f"{path} has a malformed leaf entry: {leaf!r:.200}")
        missing = [k for k in _REQUIRED_LEAF_FIELDS[kind] if k not in leaf]
        if missing:
            raise CheckpointIndexError(f"{path}: leaf {leaf['path']!r} lacks fields {missing}")
        _check_leaf_files(step_dir, path, leaf)
    return index


def _check_leaf_files(step_dir: str, index_path: str, leaf: dict) -> None:
    """Refuses a leaf whose `file` (or a process's bytes `file`) reaches outside `step_dir`."""
    what = f"leaf {leaf['path']!r:.200}"
    try:
        if leaf["kind"] == KIND_ARRAY:
            contained_path(step_dir, leaf["file"], source=index_path, what=what)
        elif leaf["kind"] == KIND_BYTES:
            per_process = leaf["per_process"]
            if not isinstance(per_process, dict):
                raise CheckpointIndexError(f"{index_path}: {what} has a malformed per_process")
            for proc, info in per_process.items():
                if not isinstance(info, dict):
                    raise CheckpointIndexError(
                        f"{index_path}: {what}, process {proc!r:.20} has a malformed entry"
                    )
                contained_path(
                    step_dir, info.get("file"), source=index_path, what=f"{what}, process {proc}"
                )
    except PathContainmentError as e:
        raise CheckpointIndexError(str(e)) from e


def validate_leaf_path(path: str) -> str:
    """Checks that a tree path can name files: '/'-separated, no empty or dot-leading parts.

    Args:
        path: The '/'-joined tree path of a leaf ('' for a single-leaf state).

    Returns:
        The path to use on disk ('' becomes `ROOT_LEAF_NAME`).

    Raises:
        ValueError: If a key of the path cannot be a file name.
    """
    if path == "":
        return ROOT_LEAF_NAME
    for part in path.split("/"):
        if not part or part.startswith(".") or "\0" in part or "\\" in part:
            raise ValueError(
                f"State leaf path {path!r} cannot name a checkpoint file: its keys must be "
                "non-empty, contain no '/' or '\\' and not start with '.'"
            )
    return path


def chunk_key(grid_index: tuple[int, ...]) -> str:
    """Returns the zarr (v2, '.'-separated) chunk key of a chunk grid index, '0' for scalars."""
    return ".".join(str(i) for i in grid_index) if grid_index else "0"
