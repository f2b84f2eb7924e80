"""Writes, directory listings and removals below a run directory, never through a link."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import uuid
from typing import Iterator, Optional

from axlearn.common.file_access.resolve import (
    FileAccessError,
    FileMissingError,
    Root,
    RunDir,
    _open_parent,
    _openat,
    _parts,
    _Root,
    _show,
    _translate,
    open_fd,
)


def write_atomic(root: Root, relpath: str, data: bytes, *, mode: int = 0o644) -> None:
    """Writes `data` whole: a temporary file in the same directory, fsync, rename, fsync dir.

    A reader sees the old content or the new, never a part. A link at `relpath` is replaced by
    the file (its target is untouched); a link at a directory component is refused.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`; its directory must exist.
        data: The content.
        mode: The mode of the file (before the umask).

    Raises:
        FileAccessError: If the path is refused, or the destination is a directory.
    """
    with _Root(root) as r:
        dir_fd, name, shown = _open_parent(r, relpath)
        try:
            tmp = f".{name}.tmp.{os.getpid()}.{uuid.uuid4().hex[:12]}"
            try:
                fd = os.open(
                    tmp,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    mode,
                    dir_fd=dir_fd,
                )
            except OSError as e:
                raise _translate(e, shown, writing=True) from e
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                _unlink_quietly(tmp, dir_fd)
                raise
            os.close(fd)
            try:
                os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError as e:
                _unlink_quietly(tmp, dir_fd)
                raise _translate(e, shown, writing=True) from e
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def append_line(root: Root, relpath: str, line: bytes) -> None:
    """Appends one whole line in one `write` (`O_APPEND`, created if missing, never a link).

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`; its directory must exist.
        line: One line; a trailing newline is added if missing. It must not hold another newline.

    Raises:
        FileAccessError: If the path is refused or the file is not regular.
        ValueError: If `line` holds a newline before its end.
    """
    if not line.endswith(b"\n"):
        line += b"\n"
    if b"\n" in line[:-1]:
        raise ValueError(f"{_show(root, relpath)}: append_line takes one line; got several.")
    fd = open_fd(root, relpath, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        written = os.write(fd, line)
        if written != len(line):
            raise FileAccessError(
                _show(root, relpath),
                f"short append ({written} of {len(line)} bytes)",
                err=errno.EIO,
            )
    finally:
        os.close(fd)


def makedirs(root: Root, relpath: str, *, mode: int = 0o755, exist_ok: bool = True) -> None:
    """Creates `relpath` and its missing parents below `root`; an existing link is refused.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The directory, relative to `root`.
        mode: The mode of created directories (before the umask).
        exist_ok: If False, the last component must not exist (anything there, a link included,
            is refused): the caller is its only creator.

    Raises:
        FileAccessError: If a component is a link or not a directory, or (with `exist_ok`
            False) the last component already exists.
    """
    with _Root(root) as r:
        shown = r.show(relpath)
        parts = _parts(relpath, shown)
        current = os.dup(r.fd)
        try:
            for i, part in enumerate(parts):
                try:
                    os.mkdir(part, mode, dir_fd=current)
                except FileExistsError as e:
                    if not exist_ok and i == len(parts) - 1:
                        raise FileAccessError(
                            shown, "already exists (never overwritten)", err=errno.EEXIST
                        ) from e
                except OSError as e:
                    raise _translate(e, shown, writing=True) from e
                nxt = _openat(current, [part], os.O_RDONLY | os.O_DIRECTORY, 0, shown)
                os.close(current)
                current = nxt
        finally:
            os.close(current)


def walk(root: Root, relpath: str = ".") -> Iterator[tuple[str, list[str], list[str]]]:
    """Walks a directory tree below `root` top-down by descriptors, never following a link.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The directory to walk, relative to `root`.

    Yields:
        (directory relative to `root`, its subdirectory names, its other entry names: files,
        and links of any kind, which are never descended).

    Raises:
        FileAccessError: If `relpath` is refused, missing, a link or not a directory.
    """
    top = open_subdir(root, relpath)
    stack = [(os.path.normpath(relpath).replace(os.sep, "/"), top.fd)]
    top.fd = -1  # Owned by the stack now.
    try:
        while stack:
            rel, fd = stack.pop()
            try:
                dirs, files = [], []
                with os.scandir(fd) as entries:
                    for entry in entries:
                        (dirs if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
                dirs.sort()
                files.sort()
                yield rel, dirs, files
                for name in reversed(dirs):
                    try:
                        sub = os.open(
                            name,
                            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                            dir_fd=fd,
                        )
                    except OSError:
                        continue  # Removed (or replaced by a link) meanwhile: not descended.
                    stack.append((name if rel == "." else f"{rel}/{name}", sub))
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)


def open_subdir(root: Root, relpath: str) -> RunDir:
    """Opens a directory below `root` (no link at any component) as a `RunDir` of its own.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The directory, relative to `root`.

    Returns:
        A `RunDir` whose descriptor is that directory (the caller closes it).

    Raises:
        FileAccessError: If the path is refused, missing, a link or not a directory.
    """
    with _Root(root) as r:
        shown = r.show(relpath)
        fd = _openat(r.fd, _parts(relpath, shown), os.O_RDONLY | os.O_DIRECTORY, 0, shown)
    sub = RunDir.__new__(RunDir)
    sub.path, sub.fd = shown, fd
    return sub


def listdir(root: Root, relpath: str = ".") -> list[str]:
    """The sorted entry names of a directory below `root` (no link followed to reach it).

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The directory, relative to `root` ("." for the root).

    Returns:
        Entry names, sorted.

    Raises:
        FileAccessError: If the path is refused, missing, a link or not a directory.
    """
    with open_subdir(root, relpath) as d:
        return sorted(os.listdir(d.fd))


def lstat(root: Root, relpath: str) -> os.stat_result:
    """`lstat` of an entry below `root` (a link is reported as a link, not followed).

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The entry, relative to `root`.

    Returns:
        Its stat result.

    Raises:
        FileAccessError: If the path is refused or missing (or a directory component is a link).
    """
    with _Root(root) as r:
        if not _parts(relpath, r.show(relpath)):
            return os.fstat(r.fd)
        dir_fd, name, shown = _open_parent(r, relpath)
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as e:
            raise _translate(e, shown) from e
        finally:
            os.close(dir_fd)


def exists(root: Root, relpath: str) -> bool:
    """Whether an entry exists below `root` reached with no link (a link itself counts).

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The entry, relative to `root`.

    Returns:
        True if `lstat` finds it.
    """
    try:
        lstat(root, relpath)
        return True
    except FileAccessError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return False
        raise


def remove(root: Root, relpath: str) -> None:
    """Removes a file (or a link itself, never its target) below `root`.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The entry, relative to `root`.

    Raises:
        FileAccessError: If the path is refused, missing or a directory.
    """
    with _Root(root) as r:
        dir_fd, name, shown = _open_parent(r, relpath)
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError as e:
            raise _translate(e, shown, writing=True) from e
        finally:
            os.close(dir_fd)


def rename(root: Root, src: str, dst: str) -> None:
    """Renames an entry below `root` to another name below it (links moved, never followed).

    Args:
        root: The run directory (a path or a `RunDir`).
        src: The entry, relative to `root`.
        dst: The new name, relative to `root` (its directory must exist).

    Raises:
        FileAccessError: If a path is refused or the rename fails.
    """
    with _Root(root) as r:
        src_fd, src_name, src_shown = _open_parent(r, src)
        try:
            dst_fd, dst_name, _ = _open_parent(r, dst)
            try:
                os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as e:
                raise _translate(e, src_shown, writing=True) from e
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)


def rmtree(root: Root, relpath: str, *, missing_ok: bool = False) -> None:
    """Removes a directory tree below `root`, never following a link (a link is removed itself).

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The directory (or a file, or a link), relative to `root`.
        missing_ok: Do nothing if it does not exist.

    Raises:
        FileAccessError: If the path is refused or a removal fails.
    """
    with _Root(root) as r:
        try:
            dir_fd, name, shown = _open_parent(r, relpath)
        except FileAccessError as e:
            if missing_ok and e.errno == errno.ENOENT:
                return
            raise
        try:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                if missing_ok:
                    return
                raise FileMissingError(shown, "does not exist", err=errno.ENOENT) from None
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=dir_fd)
                return
            _rmtree_at(dir_fd, name)
        except OSError as e:
            if isinstance(e, FileAccessError):
                raise
            raise _translate(e, shown, writing=True) from e
        finally:
            os.close(dir_fd)


def _rmtree_at(parent_fd: int, name: str) -> None:
    """Removes directory `name` of `parent_fd` and all below it by descriptors (no link)."""
    if not shutil.rmtree.avoids_symlink_attacks:
        raise OSError(errno.ENOSYS, "this platform has no descriptor-based rmtree")
    shutil.rmtree(name, dir_fd=parent_fd)


def is_regular(root: Root, relpath: str) -> bool:
    """Whether `relpath` is a regular file below `root` reached with no link.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The entry, relative to `root`.

    Returns:
        True for a regular file (a link to one is False).
    """
    try:
        return stat.S_ISREG(lstat(root, relpath).st_mode)
    except FileAccessError:
        return False


def is_dir(root: Root, relpath: str) -> bool:
    """Whether `relpath` is a directory below `root` reached with no link.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The entry, relative to `root`.

    Returns:
        True for a directory (a link to one is False).
    """
    try:
        return stat.S_ISDIR(lstat(root, relpath).st_mode)
    except FileAccessError:
        return False


def split_root(path: str, root: str) -> Optional[str]:
    """`path` relative to `root` when it is lexically inside it, else None.

    Args:
        path: A path.
        root: A directory.

    Returns:
        The relative path ("." for the root itself), or None if `path` is not below `root`.
    """
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return rel
