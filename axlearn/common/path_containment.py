"""Paths read from files stay inside their directory; run files are never opened through a link.

A checkpoint `index`, a save's per-process manifests, a Hugging Face `weight_map` and a run
record name other files by path. Those files are written by programs, not by hand, and may be
crafted: one rule holds for every such path:

- it is relative to the directory its file describes (the step directory, the Hugging Face
  directory, the trainer dir), never absolute, never leaving it with `..`
  (`contained_relpath`, a lexical check);
- it is opened through `axlearn.common.file_access` relative to a descriptor of that directory
  with no symbolic link followed at any component, so the check and the open are one call and a
  link swapped in between cannot redirect it. `contained_path` additionally refuses a path that
  crosses a link now (for callers that hand the path to another library);
- the error names the file, the entry and this rule, never the content of any file.

Files a run writes under a fixed name (`run.lock`, the run record) are opened with
`open_no_follow` / `write_text_no_follow` (through `file_access`): a symbolic link planted under
that name is refused or replaced, so a run never truncates or overwrites the link's target.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

from axlearn.common import file_access

# The rule, quoted by every refusal.
CONTAINMENT_RULE = (
    "paths read from a file must be relative to its directory and stay inside it (no absolute "
    "path, no '..' leaving it, no symbolic link crossed)"
)


class PathContainmentError(ValueError):
    """A path read from a file is absolute, leaves its directory or crosses a link out of it."""


def _refusal(entry: object, source: str, what: str, reason: str) -> PathContainmentError:
    shown = repr(entry) if len(repr(entry)) <= 200 else repr(entry)[:200] + "..."
    return PathContainmentError(
        f"{source}: {what} names the path {shown}, which {reason}; refused: {CONTAINMENT_RULE}."
    )


def contained_relpath(entry: object, *, source: str, what: str, directory: str = "") -> str:
    """Returns `entry` normalized, refusing one that is not a relative path inside its directory.

    A lexical check: open the result through `axlearn.common.file_access` (relative to the
    directory's descriptor, no link followed), which contains it at the open.

    Args:
        entry: The path as read from `source` (anything: it is checked to be a string).
        source: The file the entry was read from (named in the error).
        what: Which entry it is, e.g. "leaf 'model/w'" (named in the error).
        directory: The directory, named in the error (optional).

    Returns:
        The normalized relative path ('/'-separated, no '.' parts).

    Raises:
        PathContainmentError: If it is not a non-empty string, is absolute or leaves with '..'.
    """
    if not isinstance(entry, str) or not entry or "\0" in entry:
        raise _refusal(entry, source, what, "is not a non-empty path string")
    if os.path.isabs(entry):
        raise _refusal(entry, source, what, "is absolute")
    norm = os.path.normpath(entry)
    if norm in (".", os.curdir) or norm == os.pardir or norm.startswith(os.pardir + os.sep):
        where = f" {directory}" if directory else ""
        raise _refusal(entry, source, what, f"leaves the directory{where}")
    return norm.replace(os.sep, "/")


def contained_path(
    directory: str,
    entry: object,
    *,
    source: str,
    what: str,
    follow_final_link: bool = False,
) -> str:
    """Returns `directory/entry`, refusing an entry outside `directory` or crossing a link.

    Prefer `contained_relpath` and opening through `file_access` (no window between the check
    and the open); this is for paths handed to another library.

    Args:
        directory: The directory the entry is relative to.
        entry: The path as read from `source` (anything: it is checked to be a string).
        source: The file the entry was read from (named in the error).
        what: Which entry it is, e.g. "leaf 'model/w'" (named in the error).
        follow_final_link: Allow the last component itself to be a symbolic link (a Hugging Face
            cache links each weight file into its blob store); its directories must not be links.

    Returns:
        The joined path.

    Raises:
        PathContainmentError: If the entry is not a non-empty relative path inside `directory`
            or a component below `directory` is a symbolic link, naming `source`, `what` and the
            rule.
    """
    rel = contained_relpath(entry, source=source, what=what, directory=directory)
    parts = rel.split("/")
    checked = parts[:-1] if follow_final_link else parts
    for i in range(len(checked)):
        try:
            st = file_access.lstat(directory, "/".join(parts[: i + 1]))
        except file_access.FileAccessError:
            break  # Missing (or not a directory): nothing below it can be a link.
        if stat.S_ISLNK(st.st_mode):
            raise _refusal(
                entry,
                source,
                what,
                f"crosses a symbolic link out of (or within) the directory {directory}; no link "
                "below it is followed",
            )
    return os.path.join(directory, entry)


def is_link(path: str) -> bool:
    """Whether `path` is a symbolic link (a missing path is not).

    Args:
        path: Any path.

    Returns:
        True for a symbolic link, dangling or not.
    """
    return os.path.islink(path)


def open_no_follow(
    path: str, flags: int, mode: int = 0o644, *, what: Optional[str] = None, root: str = ""
) -> int:
    """Opens a regular file with no link followed (`file_access.open_fd`), refusing a link clearly.

    Args:
        path: The file.
        flags: `os.open` flags.
        mode: The mode of a created file.
        what: What the file is, for the error (default: "file").
        root: The run directory `path` lies in: no component below it may be a link (default:
            the file's own directory, so only the last component is guarded).

    Returns:
        The file descriptor.

    Raises:
        PathContainmentError: If `path` (or a component below `root`) is a symbolic link.
        OSError: For any other failure to open (a `file_access.FileAccessError`).
    """
    root = root or os.path.dirname(path) or "."
    rel = file_access.split_root(path, root)
    if rel is None:
        raise ValueError(f"{path} is not inside {root}")
    try:
        return file_access.open_fd(root, rel, flags, mode)
    except file_access.FileAccessError as e:
        if e.errno == errno.ELOOP:
            target = ""
            if os.path.islink(path):
                target = f" (to {os.readlink(path)!r})"
            raise PathContainmentError(
                f"{what or 'file'} {path} is a symbolic link{target} or lies below one; run "
                "files are never opened through a link, so the link's target is not touched. "
                "Remove the link (or use another directory)."
            ) from e
        raise


def write_text_no_follow(path: str, text: str, *, root: str = "") -> None:
    """Writes `text` to `path` via a fresh temporary file and a rename, never through a link.

    The rename replaces a link at `path` by the file (the link's target is not touched).

    Args:
        path: The destination.
        text: The content (UTF-8).
        root: The run directory `path` lies in: no component below it may be a link (default:
            the file's own directory).

    Raises:
        PathContainmentError: If a directory component below `root` is a symbolic link.
    """
    root = root or os.path.dirname(path) or "."
    rel = file_access.split_root(path, root)
    if rel is None:
        raise ValueError(f"{path} is not inside {root}")
    try:
        file_access.write_atomic(root, rel, text.encode("utf-8"))
    except file_access.FileAccessError as e:
        if e.errno == errno.ELOOP:
            raise PathContainmentError(
                f"{path}: a directory above it (below {root}) is a symbolic link; run files "
                "are never written through a link. Remove the link."
            ) from e
        raise
