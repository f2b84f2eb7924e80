"""Checks that make an input iterator state prove its position.

An input state (Grain's JSON state, tf.data's `AXINPUT1` header) records what it was reading:
each local source file's path, size, modification time and a cheap content fingerprint
(`file_fingerprint`), so that a restore onto files that changed between save and resume is
refused (`check_sources`) instead of reading on from the saved index into other data.

The fingerprint is the file's size and a CRC-32 of its first and last 64 KiB and of 16 blocks of
4 KiB spread evenly between them: a few reads per file, whatever its size. A file rewritten with
the same size and the same bytes at all those places is not detected; a file with another size,
or rewritten anywhere near its head, its tail (where ArrayRecord keeps its index) or a sampled
block, is. The modification time is recorded for the message only: copying a data set (which
changes it) does not invalidate a state.

Decoding is bounded (`parse_state_json`): a state is at most `MAX_STATE_BYTES`, UTF-8, nested at
most `MAX_STATE_DEPTH` deep, and every field the restore uses has the right JSON type
(`require_int`); each violation is one line naming the state, the field and the fix.

Only local files are fingerprinted (paths on object stores are recorded by name only).
"""

from __future__ import annotations

import json
import os
import stat
import time
import zlib
from collections.abc import Sequence
from typing import Any, Optional

from axlearn.common import file_access


class InputStateError(ValueError):
    """An input iterator state cannot be restored into this input; the message says why.

    Imported by users from `axlearn.common.input_iterator` (and the input modules).
    """


# Largest input state decoded (Grain states are a few KiB; tf.data's header is small).
MAX_STATE_BYTES = 16 * 1024 * 1024
# Deepest JSON nesting accepted in a state (Grain's own state nests a few levels).
MAX_STATE_DEPTH = 64
# Bytes hashed at each end of a source file.
_EDGE_BYTES = 64 * 1024
# Blocks hashed between the two ends, and their size.
_NUM_BLOCKS = 16
_BLOCK_BYTES = 4096
# Largest integer counter accepted.
_MAX_INT = 2**63 - 1
# Most source files fingerprinted per input (more are recorded by name only).
MAX_FINGERPRINTED_FILES = 4096


def file_fingerprint(path: str) -> dict[str, Any]:
    """Returns {"path", "size", "mtime_ns", "crc32"} of a local source file.

    Args:
        path: The file's path (a data file, outside run directories: a link to one is read).
            It must be a regular file; a FIFO or device is refused without blocking.

    Returns:
        The record (crc32 as 8 hex digits, over the head, tail and sampled blocks).

    Raises:
        InputStateError: If the file cannot be opened or is not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputStateError(
            f"Input source {path}: cannot be opened ({e.strerror}); fix the path of the data"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputStateError(
                f"Input source {path}: not a regular file; point the input at its data files"
            )
        size = st.st_size
        key = (path, st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
        crc = _FINGERPRINTS.get(key)
        if crc is None:
            crc = 0
            for offset, length in _sample_ranges(size):
                crc = zlib.crc32(os.pread(fd, length, offset), crc)
            if len(_FINGERPRINTS) > 4 * MAX_FINGERPRINTED_FILES:
                _FINGERPRINTS.clear()
            # A file changed in the last 2 s may change again within the timestamps' granularity
            # (as git's "racy clean" rule): not remembered.
            if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > 2 * 10**9:
                _FINGERPRINTS[key] = crc
    finally:
        os.close(fd)
    return {"path": path, "size": size, "mtime_ns": st.st_mtime_ns, "crc32": f"{crc:08x}"}


# CRCs of files already fingerprinted by this process, keyed by their identity and change times
# (an input rebuilt on the same files does not read them again; a rewritten file has a new
# mtime/ctime, a replaced one a new inode).
_FINGERPRINTS: dict[tuple, int] = {}


def _sample_ranges(size: int) -> list[tuple[int, int]]:
    """The (offset, length) ranges hashed for a file of `size` bytes (all of a small one)."""
    if size <= 2 * _EDGE_BYTES + _NUM_BLOCKS * _BLOCK_BYTES:
        return [(0, size)]
    ranges = [(0, _EDGE_BYTES)]
    middle = size - 2 * _EDGE_BYTES
    for i in range(_NUM_BLOCKS):
        offset = _EDGE_BYTES + (middle - _BLOCK_BYTES) * i // (_NUM_BLOCKS - 1)
        ranges.append((offset, _BLOCK_BYTES))
    ranges.append((size - _EDGE_BYTES, _EDGE_BYTES))
    return ranges


def source_fingerprints(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Fingerprints of the local files among `paths` (others are recorded by name only).

    Args:
        paths: Source file paths, in the order the input reads them.

    Returns:
        One record per path: `file_fingerprint` for a local file (the first
        `MAX_FINGERPRINTED_FILES`), else {"path"}.
    """
    out = []
    for i, path in enumerate(paths):
        local = "://" not in path and i < MAX_FINGERPRINTED_FILES
        out.append(file_fingerprint(path) if local else {"path": path})
    return out


def check_sources(saved: Any, current: Sequence[dict[str, Any]], *, what: str, fix: str) -> None:
    """Refuses a restore whose source files differ from those the state was saved reading.

    Files are compared in order by size and fingerprint (a moved but identical data set is
    accepted).

    Args:
        saved: The state's "sources" field (a list of records; None: an older state, unchecked).
        current: `source_fingerprints` of this input's files now.
        what: Names the state in messages (e.g. "Input 'input': the saved Grain state").
        fix: How to proceed when they differ.

    Raises:
        InputStateError: Naming the first file that differs, what differs, and `fix`.
    """
    if saved is None:
        return
    if not isinstance(saved, list) or not all(isinstance(s, dict) for s in saved):
        raise InputStateError(
            f"{what}: field 'sources' must be a list of objects, got {type(saved).__name__}; "
            f"the state is corrupt: {fix}"
        )
    if len(saved) != len(current):
        raise InputStateError(
            f"{what} was saved reading {len(saved)} source files but this input reads "
            f"{len(current)}; {fix}"
        )
    for old, new in zip(saved, current):
        if "crc32" not in old or "crc32" not in new:
            continue
        if old.get("size") != new["size"] or old.get("crc32") != new["crc32"]:
            raise InputStateError(
                f"{what}: source file {new['path']} changed since the state was saved (size "
                f"{old.get('size')} -> {new['size']}, fingerprint {old.get('crc32')} -> "
                f"{new['crc32']}, saved as {old.get('path')}); the saved position would read "
                f"other data: {fix}"
            )


def parse_state_json(data: bytes, *, what: str, fix: str, max_bytes: int = MAX_STATE_BYTES) -> Any:
    """Decodes JSON state bytes, bounded in size and depth.

    Args:
        data: The bytes.
        what: Names the state in messages.
        fix: What to do when it cannot be decoded.
        max_bytes: Largest accepted size.

    Returns:
        The decoded value.

    Raises:
        InputStateError: One line: too large, not UTF-8, too deep or not JSON (never content).
    """
    if len(data) > max_bytes:
        raise InputStateError(
            f"{what} is {len(data)} bytes, more than the {max_bytes} an input state may be; "
            f"it is not a state this input wrote: {fix}"
        )
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputStateError(
            f"{what} is not UTF-8 (byte {e.start}); it is corrupt: {fix}"
        ) from None
    if file_access.json_depth(bytes(data)) > MAX_STATE_DEPTH:
        raise InputStateError(
            f"{what} nests deeper than {MAX_STATE_DEPTH} levels; it is not a state this input "
            f"wrote: {fix}"
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # ValueError: also integers of >4300 digits.
        where = (
            f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        )
        raise InputStateError(f"{what} is not valid JSON{where}; it is corrupt: {fix}") from None


def require_int(
    state: dict, field: str, *, what: str, fix: str, minimum: int = 0, allow_none: bool = False
) -> Optional[int]:
    """Returns `state[field]`, an integer >= `minimum` (not a bool), or refuses the state.

    Args:
        state: The decoded state.
        field: The field's name.
        what: Names the state in messages.
        fix: What to do when the field is invalid.
        minimum: The smallest valid value.
        allow_none: Whether null is valid (returned as None).

    Returns:
        The value.

    Raises:
        InputStateError: Naming the field, its type or value, and `fix`.
    """
    if field not in state:
        raise InputStateError(f"{what} has no field {field!r}; it is corrupt: {fix}")
    value = state[field]
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputStateError(
            f"{what}: field {field!r} must be an integer, got {type(value).__name__}; the state "
            f"is corrupt: {fix}"
        )
    if not minimum <= value <= _MAX_INT:
        raise InputStateError(
            f"{what}: field {field!r} is {str(value)[:24]}, outside [{minimum}, 2**63 - 1]; the "
            f"state is corrupt: {fix}"
        )
    return value
