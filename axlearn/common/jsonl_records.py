"""`metrics.jsonl` as a log of whole records: appends that never leave half a line, and repairs.

- `append_whole_line`: one record per write, never through a link; a short write is undone.
- `cut_torn_tail`: a last line without its newline (a write cut short by a crash) is cut at the
  last complete line, however long the torn record is.
- `move_redone_records`: after a resume, the records of steps the run re-does move to
  `metrics.redone.jsonl` (`redone_path`), so `metrics.jsonl` holds one record per step.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any, Iterator, Optional

from absl import logging

from axlearn.common.path_containment import PathContainmentError, open_no_follow


def cut_torn_tail(path: str) -> int:
    """Cuts a last line without its newline (a write cut short) from a local JSON-lines file.

    Args:
        path: The file; may not exist.

    Returns:
        The number of bytes cut (0 if the file ends with a whole line), logged as a warning.

    Raises:
        OSError: Naming `path`, if it cannot be read or truncated.
    """
    try:
        with os.fdopen(os.open(path, os.O_RDWR | os.O_NOFOLLOW), "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return 0
            keep = _after_last_newline(f, size)
            f.truncate(keep)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise OSError(e.errno, f"{path}: cannot check its last line: {e.strerror}") from e
    logging.warning(
        "%s ended with a torn line (%d bytes without a newline, from a write cut short, e.g. by "
        "a full disk): cut before appending.",
        path,
        size - keep,
    )
    return size - keep


def redone_path(path: str) -> str:
    """Where `move_redone_records` keeps the records of re-done steps (`metrics.redone.jsonl`).

    Args:
        path: The JSON-lines file (e.g. `<trainer_dir>/metrics.jsonl`).

    Returns:
        The path beside it.
    """
    stem, ext = os.path.splitext(path)
    return f"{stem}.redone{ext or '.jsonl'}"


def move_redone_records(path: str, *, first_step: int, chunk: int = 1 << 16) -> int:
    """Moves the last records whose step is >= `first_step` to `redone_path(path)`.

    A resumed run is about to write `first_step` again: the records of it and later steps that
    the earlier attempt wrote were computed again, and the new ones replace them. Records are in
    step order within an attempt, so the superseded ones are the file's tail; it is read
    backwards (bounded memory), appended to the redone file (flushed), then cut from the file.

    Args:
        path: The JSON-lines file (local); may not exist. Its last line must be whole
            (`cut_torn_tail` first).
        first_step: The first step the resumed run writes.
        chunk: Bytes read at a time.

    Returns:
        The number of records moved (logged).

    Raises:
        OSError: Naming the file, if it cannot be read, appended or truncated.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise OSError(e.errno, f"{path}: cannot check for re-done steps: {e.strerror}") from e
    with os.fdopen(fd, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        cut, moved = size, 0
        for start, line in _lines_backwards(f, size, chunk=chunk):
            step = _record_step(line)
            if step is None or step < first_step:
                break
            cut, moved = start, moved + 1
        if moved == 0:
            return 0
        f.seek(cut)
        tail = f.read(size - cut)
        try:
            append_whole_line(redone_path(path), tail.decode("utf-8"), what="re-done records")
            f.truncate(cut)
        except (OSError, UnicodeDecodeError) as e:
            raise OSError(
                getattr(e, "errno", None) or errno.EIO,
                f"{path}: cannot move the records of re-done steps: {e}",
            ) from e
    logging.info(
        "%s: the %d record(s) of steps %d and later, which this resumed run computes again, "
        "moved to %s (the file keeps one record per step).",
        path,
        moved,
        first_step,
        redone_path(path),
    )
    return moved


def _lines_backwards(f: Any, end: int, *, chunk: int) -> Iterator[tuple[int, bytes]]:
    """Yields (offset, line) of the lines of `f` before `end`, last first, a chunk at a time."""
    buffer, pos = b"", end  # `buffer` holds the bytes [pos, end of the current line).
    while True:
        at = buffer.rfind(b"\n", 0, len(buffer) - 1)  # The newline before the last line.
        if at >= 0:
            yield pos + at + 1, buffer[at + 1 :]
            buffer = buffer[: at + 1]
        elif pos == 0:
            if buffer:
                yield 0, buffer
            return
        else:
            start = max(0, pos - chunk)
            f.seek(start)
            buffer = f.read(pos - start) + buffer
            pos = start


def _record_step(line: bytes) -> Optional[int]:
    """The `step` of a JSON-lines record, or None (not a record with an integer step)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _after_last_newline(f: Any, size: int, *, chunk: int = 1 << 20) -> int:
    """The offset just after the last newline in the first `size` bytes of `f` (0 if none).

    Reads backwards a chunk at a time, so a torn record of any length is found in bounded memory.
    """
    end = size
    while end > 0:
        start = max(0, end - chunk)
        f.seek(start)
        block = f.read(end - start)
        at = block.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def append_whole_line(path: str, line: str, *, what: str = "a record") -> None:
    """Appends `line` (ending with a newline) to a local file whole, or not at all.

    One `write` on an O_APPEND descriptor; if it fails or writes part of the line (a full disk),
    the file is truncated back to its size before the write and the error names the file.

    Args:
        path: The file.
        line: The text to append.
        what: What the line is, for the error message.

    Raises:
        OSError: Naming `path` and what could not be appended.
    """
    data = line.encode("utf-8")
    try:
        # Never through a symbolic link: a link planted under a run file's name is refused.
        fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644, what="Run file")
    except PathContainmentError as e:
        raise OSError(errno.ELOOP, str(e)) from e
    except OSError as e:
        raise OSError(e.errno, f"{path}: cannot open to append {what}: {e.strerror}") from e
    try:
        before = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"wrote {written} of {len(data)} bytes")
        except OSError as e:
            try:
                os.ftruncate(fd, before)
            except OSError:
                pass  # The next writer cuts the torn tail (`cut_torn_tail`).
            raise OSError(
                e.errno,
                f"{path}: cannot append {what}: {e.strerror} (the file is left whole; free "
                "space and rerun: the run resumes from its last checkpoint)",
            ) from e
    finally:
        os.close(fd)
