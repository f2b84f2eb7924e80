"""On-disk layout of checkpoints: step directories, the `index` commit marker, leaf paths.

```
<dir>/step_00000100/            one directory per step, `step_%08d`
    gda/<leaf path>/            one zarr array (TensorStore) per array leaf, named by tree path
        .zarray                 zarr metadata
        0.0, 0.1, ...           one chunk file per saved shard (no compression)
    host/process_<i>/<leaf path> per-process bytes leaves (e.g. input iterator state)
    manifest.json               our full index: dtypes, chunk shapes, CRC-32s, bytes leaves
    index                       AXLearn's list of [path, value] pairs, written last: the commit
                                marker
```

A step is thus one AXLearn's `Checkpointer` restores unchanged (it reads `index` and `gda/`, and
ignores the rest), while every reader here takes the checksums and the rest from
`manifest.json` and checks that the two files agree. Steps of format version 1 (a JSON object
in `index`, no `manifest.json`) are read as before.

AXLearn's own layout (a list `index`, zstd zarr arrays, `tf_<i>/` iterators) is read too: see
`axlearn_layout`; `axlearn_layout_write` writes it.

A step directory without a readable `index` is uncommitted: it is never restored.

Every file here is opened through `axlearn.common.file_access`: relative to a descriptor of the
checkpointer directory (the directory the user named), with no symbolic link followed at any
component below it (the step directory included), regular files only, metadata reads bounded in
size and nesting. A path the index names is checked lexically here (relative, no `..`) and is
contained by the open itself, so there is no window between a check and an open.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import stat
from typing import Any, Optional

from absl import logging

from axlearn.common import file_access
from axlearn.common.checkpointer import axlearn_layout
from axlearn.common.path_containment import PathContainmentError, contained_relpath

# Directory name of a step: `step_` followed by exactly 8 digits.
STEP_DIR_PREFIX = "step_"
_STEP_DIR_RE = re.compile(r"^step_(\d{8})$")
# The commit marker, written after every array of the step has been written.
INDEX_FILE = "index"
# Sub-directory holding one zarr array per array leaf.
ARRAYS_DIR = axlearn_layout.ARRAYS_DIR  # "gda"
# Sub-directory holding per-process bytes leaves.
HOST_DIR = "host"
# Sub-directory where processes leave their shard checksums for process 0 (multi-process only).
MANIFESTS_DIR = "manifests"
# Identifies our index format.
INDEX_FORMAT = "axlearn.checkpoint"
# Version 2: `manifest.json` holds our index, `index` AXLearn's list; version 1: our index in
# `index` (still read).
INDEX_VERSION = 2
# The versions read.
READ_INDEX_VERSIONS = (1, 2)
# Our full index beside AXLearn's list `index` (version 2), written just before it.
MANIFEST_FILE = "manifest.json"
# How a bytes leaf appears in AXLearn's list `index` (AXLearn's form of a savable's entry; its
# value lives in `host/`, described by `manifest.json`).
BYTES_LEAF_ENTRY = axlearn_layout.OUR_BYTES_LEAF_ENTRY
# Version of the state layout (the fields of optimizer states) a checkpoint was written with.
# Indexes without `state_layout` predate version 2, which gave `EmaState` its `scale` field and
# renamed `SkipClipState.grad_norm_var_ema` to `grad_norm_square_ema` (AXLearn's layouts).
STATE_LAYOUT_VERSION = 2
# Kinds of leaves in the index.
KIND_ARRAY = axlearn_layout.KIND_ARRAY  # "array"
KIND_VALUE = axlearn_layout.KIND_VALUE  # "value"
KIND_BYTES = axlearn_layout.KIND_BYTES  # "bytes"
# Name used for the leaf path of a state that is a single leaf (empty tree path).
ROOT_LEAF_NAME = "_root"
# The most bytes an `index` may hold (about 200 bytes per leaf and 20 per chunk checksum: far
# above any model's); a larger one is refused unread.
MAX_INDEX_BYTES = 256 << 20
# The deepest JSON nesting of an index (its own is 5; value leaves add a little).
MAX_INDEX_DEPTH = 64


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


def build_step_dir(base_dir: str, *, step: int) -> str:
    """Returns the path of the step directory of `step` under `base_dir` (AXLearn's name).

    Args:
        base_dir: The checkpointer directory.
        step: A step in [0, 10**8).

    Returns:
        `<base_dir>/step_%08d`.

    Raises:
        ValueError: If the step is out of range.
    """
    return os.path.join(base_dir, step_dir_name(step))


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


def open_step_dir(step_dir: str) -> file_access.RunDir:
    """Opens a step directory for reading its files: the step directory itself is not a link.

    The checkpointer directory (its parent, as the user named it) is opened as given; the step
    directory below it and every path below that are opened with no link followed.

    Args:
        step_dir: `<checkpointer dir>/step_%08d` (or any directory: its last component is not
            followed if it is a link).

    Returns:
        A `file_access.RunDir` of the step directory (the caller closes it).

    Raises:
        FileAccessError: If it is missing, a link or not a directory.
    """
    parent, name = os.path.split(os.path.normpath(step_dir))
    return file_access.open_subdir(parent or ".", name)


def step_dirs(base_dir: str) -> list[tuple[int, str]]:
    """Returns (step, path) of every `step_%08d` directory under `base_dir`, committed or not.

    Args:
        base_dir: The checkpointer directory; may not exist.

    Returns:
        Pairs sorted by step.
    """
    try:
        root = file_access.RunDir(base_dir)
    except file_access.FileAccessError:
        return []
    result = []
    with root:
        for name in file_access.listdir(root):
            match = _STEP_DIR_RE.match(name)
            if not match:
                continue
            try:
                st = file_access.lstat(root, name)
            except file_access.FileAccessError:
                continue  # Removed meanwhile.
            path = os.path.join(base_dir, name)
            if stat.S_ISLNK(st.st_mode):
                _warn_linked_step_dir(path)
            elif stat.S_ISDIR(st.st_mode):
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
            _readlink(path),
        )


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def is_committed(step_dir: str) -> bool:
    """Whether `step_dir` has an `index` file (cheap check; the index is not parsed).

    A step directory that is a symbolic link is never committed: it is not a step of this
    directory (see `step_dirs`).
    """
    parent, name = os.path.split(os.path.normpath(step_dir))
    # Any entry named `index` (a link or a FIFO too) commits the step: such a step is corrupt
    # (its index is refused when read), never silently skipped as uncommitted.
    return file_access.exists(parent or ".", f"{name}/{INDEX_FILE}")


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
    fd = file_access.open_dir(path)
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


def write_json_atomically(path: str, value: Any, *, root: Optional[str] = None) -> None:
    """Writes `value` as JSON to `path` via a temporary file, fsync and rename (no link followed).

    Args:
        path: The destination file.
        value: A JSON-serializable value.
        root: The run directory `path` lies in (no link is followed below it); default: the
            file's own directory.
    """
    data = json.dumps(value, sort_keys=True).encode("utf-8")
    path = os.path.normpath(path)
    if root is None:
        root = os.path.dirname(path) or "."
    rel = file_access.split_root(path, root)
    if rel is None:
        raise ValueError(f"{path} is not inside {root}")
    file_access.write_atomic(root, rel, data)


def write_index_file(step_dir: str, index: dict) -> None:
    """Commits `step_dir`: writes its index files atomically, the commit marker `index` last.

    A version-2 index (what `make_index` returns) goes to `manifest.json`, and then AXLearn's
    list of `[path, value]` pairs (`axlearn_index_pairs`) to `index`. A version-1 index goes to
    `index` itself.

    Args:
        step_dir: The step directory.
        index: The index (see `make_index`).
    """
    # Below the checkpointer dir: the step directory itself is not followed if it is a link.
    root = os.path.dirname(os.path.normpath(step_dir)) or "."
    if index.get("version") == 1:
        write_json_atomically(os.path.join(step_dir, INDEX_FILE), index, root=root)
        return
    write_json_atomically(os.path.join(step_dir, MANIFEST_FILE), index, root=root)
    rel = file_access.split_root(os.path.join(os.path.normpath(step_dir), INDEX_FILE), root)
    file_access.write_atomic(root, rel, json.dumps(axlearn_index_pairs(index)).encode("utf-8"))


def axlearn_index_pairs(index: dict) -> list:
    """AXLearn's list `index` for one of ours: `["step", N]`, then one pair per leaf.

    An array is `[path, {"dtype": name, "shape": "(d0, d1)"}]` (the shape a Python tuple's
    string), a value leaf `[path, value]`, a bytes leaf `[path, BYTES_LEAF_ENTRY]`. A leaf named
    `step` is left out (AXLearn's index holds the step under that name; `manifest.json` keeps it).

    Args:
        index: Our index (`make_index`).

    Returns:
        The list of pairs, as AXLearn's `Checkpointer` writes and reads it.
    """
    pairs: list = [["step", index["step"]]]
    for leaf in index["leaves"]:
        path, kind = leaf["path"], leaf["kind"]
        if path == "step":
            continue
        if kind == KIND_ARRAY:
            shape = str(tuple(int(d) for d in leaf["shape"]))
            pairs.append([path, {"dtype": leaf["dtype"], "shape": shape}])
        elif kind == KIND_BYTES:
            pairs.append([path, BYTES_LEAF_ENTRY])
        else:
            pairs.append([path, leaf["value"]])
    return pairs


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


def _read_json_file(step_dir: str, name: str, *, missing_ok: bool) -> Any:
    """Reads `step_dir/name` as bounded JSON through the file layer (no link followed)."""
    path = os.path.join(step_dir, name)
    parent, step_name = os.path.split(os.path.normpath(step_dir))
    try:
        return file_access.read_json(
            parent or ".",
            f"{step_name}/{name}",
            max_bytes=MAX_INDEX_BYTES,
            max_depth=MAX_INDEX_DEPTH,
        )
    except file_access.FileAccessError as e:
        if e.errno == errno.ENOENT:
            if missing_ok:
                return None
            raise CheckpointIndexError(f"{path} does not exist (uncommitted checkpoint)") from e
        if e.errno == errno.ELOOP:
            raise CheckpointIndexError(
                f"{path}: the {name.split('.')[0]} (or its step directory) is a symbolic link; an "
                "index is never read through a link (its target is outside what this step "
                "directory holds)"
            ) from e
        raise CheckpointIndexError(f"{path} is not a readable JSON index: {e.rule}") from e


def read_index_file(step_dir: str) -> dict:
    """Reads and validates the index of `step_dir`, in any layout read here.

    Our index is JSON: `{"format", "version", "step", "process_count", "leaves": [...]}`, in
    `manifest.json` beside AXLearn's list `index` (version 2, checked to agree with it) or in
    `index` itself (version 1). Each leaf has `path` and `kind`:
    - `array`: `dtype` (numpy name), `shape`, `chunk_shape`, `file` (relative zarr path),
      `checksum` ({"crc32": {chunk key: 8 hex digits}}).
    - `value`: a small JSON value (`value`), e.g. an int or string.
    - `bytes`: `per_process` ({process index: {"file", "size", "checksum"}}).
    A list `index` without `manifest.json` is a step AXLearn wrote (`axlearn_layout`): returned
    in the same form, with `layout` "axlearn" and no checksums.

    Args:
        step_dir: The step directory.

    Returns:
        The index dict.

    Raises:
        CheckpointIndexError: If a file is missing, not JSON, malformed, or the two disagree.
    """
    path = os.path.join(step_dir, INDEX_FILE)
    index = _read_json_file(step_dir, INDEX_FILE, missing_ok=False)
    if not axlearn_layout.is_axlearn_index(index):
        return _check_ours(index, step_dir, path)
    manifest = _read_json_file(step_dir, MANIFEST_FILE, missing_ok=True)
    if manifest is None:
        return _read_axlearn_index(index, step_dir, path)
    manifest_path = os.path.join(step_dir, MANIFEST_FILE)
    ours = _check_ours(manifest, step_dir, manifest_path)
    _check_pairs_agree(index, ours, shown=path, manifest_path=manifest_path)
    return ours


def _check_ours(index: Any, step_dir: str, path: str) -> dict:
    """Validates our index dict read from `path`."""
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise CheckpointIndexError(f"{path} is not an {INDEX_FORMAT} index")
    if index.get("version") not in READ_INDEX_VERSIONS:
        raise CheckpointIndexError(
            f"{path} has index version {index.get('version')!r:.20}; this code reads "
            f"{list(READ_INDEX_VERSIONS)}"
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
        if kind == KIND_ARRAY and not (
            isinstance(leaf["shape"], list)
            and all(isinstance(d, int) and not isinstance(d, bool) for d in leaf["shape"])
        ):
            raise CheckpointIndexError(f"{path}: leaf {leaf['path']!r} has a malformed shape")
        _check_leaf_files(step_dir, path, leaf)
    return index


def _check_pairs_agree(pairs: list, ours: dict, *, shown: str, manifest_path: str) -> None:
    """Refuses an AXLearn list `index` that is not the one `ours` (from `manifest.json`) gives."""
    expected = {p: v for p, v in axlearn_index_pairs(ours)}
    found: dict = {}
    for item in pairs:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            raise CheckpointIndexError(
                f"{shown}: entry {item!r:.100} is not a [path, value] pair (AXLearn's index is a "
                "list of them)"
            )
        if item[0] in found:
            raise CheckpointIndexError(f"{shown}: leaf {item[0]!r:.200} is listed twice")
        found[item[0]] = item[1]
    for name in sorted(set(expected) | set(found)):
        if expected.get(name, _ABSENT) != found.get(name, _ABSENT):
            raise CheckpointIndexError(
                f"{shown} and {manifest_path} disagree on {name!r:.200} ("
                f"{_shown_entry(found.get(name, _ABSENT))} against "
                f"{_shown_entry(expected.get(name, _ABSENT))}); a save writes both from one "
                "state, so one of them was changed or replaced since"
            )


_ABSENT = object()


def _shown_entry(value: Any) -> str:
    return "absent" if value is _ABSENT else f"{json.dumps(value)[:80]}"


def _read_axlearn_index(value: list, step_dir: str, shown: str) -> dict:
    """Our index dict for AXLearn's list `index` (see `axlearn_layout`), `layout` "axlearn"."""
    try:
        with open_step_dir(step_dir) as root:
            step, leaves = axlearn_layout.parse_pairs(value, root=root, shown=shown)
    except (axlearn_layout.AXLearnIndexError, file_access.FileAccessError) as e:
        raise CheckpointIndexError(str(e)) from e
    for leaf in leaves:
        _check_leaf_files(step_dir, shown, leaf)
    return dict(
        format=INDEX_FORMAT,
        layout=axlearn_layout.LAYOUT_NAME,
        version=INDEX_VERSION,
        step=step,
        process_count=None,
        state_layout=STATE_LAYOUT_VERSION,
        leaves=leaves,
    )


def _check_leaf_files(step_dir: str, index_path: str, leaf: dict) -> None:
    """Refuses a leaf whose `file` (or a process's bytes `file`) reaches outside `step_dir`."""
    what = f"leaf {leaf['path']!r:.200}"
    try:
        if leaf["kind"] == KIND_ARRAY:
            contained_relpath(leaf["file"], source=index_path, what=what)
        elif leaf["kind"] == KIND_BYTES:
            per_process = leaf["per_process"]
            if not isinstance(per_process, dict):
                raise CheckpointIndexError(f"{index_path}: {what} has a malformed per_process")
            for proc, info in per_process.items():
                if not isinstance(info, dict):
                    raise CheckpointIndexError(
                        f"{index_path}: {what}, process {proc!r:.20} has a malformed entry"
                    )
                contained_relpath(
                    info.get("file"), source=index_path, what=f"{what}, process {proc}"
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
