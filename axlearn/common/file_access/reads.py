"""Bounded reads of run files: size, nesting and UTF-8 checked, one line per failure."""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Any

import numpy as np

from axlearn.common.file_access.resolve import FileAccessError, Root, _open_regular, _Root, _show

# Strips JSON strings (so that brackets inside them do not count toward nesting).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
RULE_BOUNDED = "is larger than {limit} bytes, the limit for this file; it is not read"


def read_bytes(root: Root, relpath: str, *, max_bytes: int) -> bytes:
    """Reads a whole regular file of at most `max_bytes` bytes.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`.
        max_bytes: The most bytes the file may hold; a larger file is refused unread.

    Returns:
        The file's bytes.

    Raises:
        FileAccessError: If the path is refused, the file is missing, not regular, or too large.
    """
    with _Root(root) as r:
        fd = _open_regular(r, relpath, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size > max_bytes:
                raise FileAccessError(
                    r.show(relpath), RULE_BOUNDED.format(limit=max_bytes), err=errno.EFBIG
                )
            chunks, total = [], 0
            while True:
                chunk = os.read(fd, min(max_bytes + 1 - total, 1 << 24))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > max_bytes:  # Grew while reading.
                    raise FileAccessError(
                        r.show(relpath), RULE_BOUNDED.format(limit=max_bytes), err=errno.EFBIG
                    )
            return b"".join(chunks)
        finally:
            os.close(fd)


def decode_utf8(data: bytes, shown: str) -> str:
    """Decodes UTF-8, or raises one line naming the file and the offset (never the bytes).

    Args:
        data: The bytes.
        shown: The file, for the error.

    Returns:
        The text.

    Raises:
        FileAccessError: If `data` is not UTF-8.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileAccessError(
            shown, f"is not UTF-8 text (invalid byte at offset {e.start})", err=errno.EINVAL
        ) from None


def read_text(root: Root, relpath: str, *, max_bytes: int) -> str:
    """Reads a whole regular UTF-8 text file of at most `max_bytes` bytes.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`.
        max_bytes: The most bytes the file may hold.

    Returns:
        The text.

    Raises:
        FileAccessError: As `read_bytes`, or if the file is not UTF-8.
    """
    return decode_utf8(read_bytes(root, relpath, max_bytes=max_bytes), _show(root, relpath))


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays/objects in JSON text (brackets in strings do not count).

    Args:
        data: JSON text as UTF-8 bytes.

    Returns:
        The maximum nesting depth (0 for a scalar); computed without recursion.
    """
    if data.count(b"[") + data.count(b"{") == 0:
        return 0
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    arr = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((arr == ord("[")) | (arr == ord("{")), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max())


def parse_json(data: bytes, shown: str, *, max_depth: int = 64) -> Any:
    """Parses JSON bytes with bounded nesting; every failure one line naming `shown`.

    Args:
        data: The bytes.
        shown: The file, for errors.
        max_depth: The deepest nesting allowed.

    Returns:
        The parsed value.

    Raises:
        FileAccessError: If the bytes are not UTF-8, nested deeper than `max_depth` or not JSON.
    """
    text = decode_utf8(data, shown)
    # Fewer brackets than the limit cannot nest deeper than it (most metadata files).
    few = data.count(b"[") + data.count(b"{") <= max_depth
    depth = 0 if few else json_depth(data)
    if depth > max_depth:
        raise FileAccessError(
            shown, f"JSON nested {depth} deep, more than the limit of {max_depth}", err=errno.EINVAL
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise FileAccessError(
            shown,
            f"is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})",
            err=errno.EINVAL,
        ) from None
    except RecursionError:
        raise FileAccessError(shown, "JSON nested too deep", err=errno.EINVAL) from None


def read_json(root: Root, relpath: str, *, max_bytes: int, max_depth: int = 64) -> Any:
    """Reads a JSON file of at most `max_bytes` bytes and `max_depth` nesting.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`.
        max_bytes: The most bytes the file may hold.
        max_depth: The deepest nesting of arrays/objects allowed.

    Returns:
        The parsed value (its types are the caller's to check).

    Raises:
        FileAccessError: As `read_bytes`, or if the file is not UTF-8, too deep or not JSON.
    """
    data = read_bytes(root, relpath, max_bytes=max_bytes)
    return parse_json(data, _show(root, relpath), max_depth=max_depth)
