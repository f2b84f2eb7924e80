"""Paths read from files stay inside their directory; run files are never opened through a link.

A checkpoint `index`, a save's per-process manifests, a Hugging Face `weight_map` and a run
record name other files by path. Those files are written by programs, not by hand, and may be
crafted: one rule holds for every such path (`contained_path`):

- it is resolved relative to the directory its file describes (the step directory, the
  Hugging Face directory, the trainer dir);
- it is refused when it is absolute, when it leaves that directory (`..`), or when it crosses a
  symbolic link out of it (the link's target is outside);
- the error names the file, the entry and this rule, never the content of any file.

Files a run writes into its trainer dir under a fixed name (`run.lock`, the run record) are
opened with `O_NOFOLLOW` (`open_no_follow`): a symbolic link planted under that name is refused,
so a run never truncates or overwrites the link's target.
"""

from __future__ import annotations

import errno
import os
from typing import Optional

# The rule, quoted by every refusal.
CONTAINMENT_RULE = (
    "paths read from a file must be relative to its directory and stay inside it (no absolute "
    "path, no '..' leaving it, no symbolic link out of it)"
)


class PathContainmentError(ValueError):
    """A path read from a file is absolute, leaves its directory or crosses a link out of it."""


def _inside(path: str, directory: str) -> bool:
    """Whether normalized `path` is `directory` or below it (both absolute and normalized)."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def contained_path(
    directory: str,
    entry: object,
    *,
    source: str,
    what: str,
    follow_final_link: bool = False,
) -> str:
    """Returns `directory/entry`, refusing an entry that reaches outside `directory`.

    Args:
        directory: The directory the entry is relative to.
        entry: The path as read from `source` (anything: it is checked to be a string).
        source: The file the entry was read from (named in the error).
        what: Which entry it is, e.g. "leaf 'model/w'" (named in the error).
        follow_final_link: Allow the last component itself to be a symbolic link that points
            outside (a Hugging Face cache links each weight file into its blob store); its
            directories must still stay inside.

    Returns:
        The joined path.

    Raises:
        PathContainmentError: If the entry is not a non-empty relative path inside `directory`,
            naming `source`, `what` and the rule.
    """

    def refuse(reason: str) -> PathContainmentError:
        shown = repr(entry) if len(repr(entry)) <= 200 else repr(entry)[:200] + "..."
        return PathContainmentError(
            f"{source}: {what} names the path {shown}, which {reason}; refused: {CONTAINMENT_RULE}."
        )

    if not isinstance(entry, str) or not entry or "\0" in entry:
        raise refuse("is not a non-empty path string")
    if os.path.isabs(entry):
        raise refuse("is absolute")
    base = os.path.abspath(directory)
    joined = os.path.normpath(os.path.join(base, entry))
    if not _inside(joined, base) or joined == base:
        raise refuse(f"leaves the directory {directory}")
    real_base = os.path.realpath(base)
    checked = os.path.dirname(joined) if follow_final_link else joined
    real = os.path.realpath(checked)
    if not _inside(real, real_base):
        raise refuse(f"crosses a symbolic link out of the directory {directory}")
    return os.path.join(directory, entry)


def is_link(path: str) -> bool:
    """Whether `path` is a symbolic link (a missing path is not).

    Args:
        path: Any path.

    Returns:
        True for a symbolic link, dangling or not.
    """
    return os.path.islink(path)


def open_no_follow(path: str, flags: int, mode: int = 0o644, *, what: Optional[str] = None) -> int:
    """`os.open` with `O_NOFOLLOW`: refuses a symbolic link at `path` with a clear error.

    Args:
        path: The file.
        flags: `os.open` flags (O_NOFOLLOW is added).
        mode: The mode of a created file.
        what: What the file is, for the error (default: "file").

    Returns:
        The file descriptor.

    Raises:
        PathContainmentError: If `path` is a symbolic link.
        OSError: For any other failure to open.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.EEXIST and os.path.islink(path)):
            raise PathContainmentError(
                f"{what or 'file'} {path} is a symbolic link (to {os.readlink(path)!r}); run "
                "files are never opened through a link, so the link's target is not touched. "
                "Remove the link (or use another directory)."
            ) from e
        raise


def write_text_no_follow(path: str, text: str) -> None:
    """Writes `text` to `path` via a fresh temporary file and a rename, never through a link.

    The temporary file is created exclusively without following links, and the rename replaces
    a link at `path` by the file (the link's target is not touched).

    Args:
        path: The destination.
        text: The content (UTF-8).
    """
    tmp = f"{path}.tmp.{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)  # A leftover of this pid, or a planted link: removing it touches no target.
    fd = open_no_follow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, what="temporary file")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
