"""Resolving paths below a run directory's descriptor with no link followed (see the package)."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading
from typing import BinaryIO, Union

# The rules, quoted by refusals.
RULE_RELATIVE = "paths inside a run directory must be relative and must not use '..'"
RULE_NO_LINK = (
    "run files are never opened through a symbolic link (no component below the run directory "
    "may be a link); remove the link"
)
RULE_REGULAR = "only regular files are read or written in a run directory; this is "

# openat2(2): the syscall number is the same on x86_64 and aarch64 (the generic table).
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(os.uname().machine)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08


class FileAccessError(OSError):
    """A run file was refused or could not be read: `"<path>: <rule>"`, never its content."""

    def __init__(self, path: str, rule: str, *, err: int = errno.EPERM):
        super().__init__(err, rule)
        self.path = path
        self.rule = rule

    def __str__(self) -> str:
        return f"{self.path}: {self.rule}"

    def __reduce__(self):
        return (_rebuild_error, (self.path, self.rule, self.errno))


class FileMissingError(FileAccessError, FileNotFoundError):
    """A run file (or a directory above it) does not exist; also a `FileNotFoundError`."""


def _rebuild_error(path: str, rule: str, err: int) -> FileAccessError:
    cls = FileMissingError if err == errno.ENOENT else FileAccessError
    return cls(path, rule, err=err)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_state = {"checked": False, "fn": None}
_openat2_lock = threading.Lock()


def _openat2_fn():
    """Returns libc's `syscall` when the kernel has openat2, else None (checked once)."""
    if _openat2_state["checked"]:
        return _openat2_state["fn"]
    with _openat2_lock:
        if not _openat2_state["checked"]:
            fn = None
            if _SYS_OPENAT2 is not None and os.uname().sysname == "Linux":
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    fn = libc.syscall
                    fn.restype = ctypes.c_long
                    probe = _call_openat2(fn, os.open("/", os.O_RDONLY | os.O_DIRECTORY), ".")
                    if probe < 0:
                        fn = None
                    else:
                        os.close(probe)
                except (OSError, AttributeError):
                    fn = None
            _openat2_state["fn"] = fn
            _openat2_state["checked"] = True
    return _openat2_state["fn"]


def _call_openat2(
    fn, dir_fd: int, name: str, flags: int = os.O_RDONLY, mode: int = 0, *, close_dir: bool = True
) -> int:
    how = _OpenHow(
        flags | os.O_CLOEXEC,
        mode if flags & os.O_CREAT else 0,
        _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
    )
    try:
        return fn(_SYS_OPENAT2, dir_fd, os.fsencode(name), ctypes.byref(how), ctypes.sizeof(how))
    finally:
        if close_dir:
            os.close(dir_fd)


def uses_openat2() -> bool:
    """Whether paths are resolved with `openat2` (else component by component).

    Returns:
        True when the kernel has openat2 and it is used.
    """
    return _openat2_fn() is not None


def _parts(relpath: str, shown: str) -> list[str]:
    """Splits a relative path into components, refusing absolute paths and `..`."""
    if not isinstance(relpath, str) or "\0" in relpath:
        raise FileAccessError(shown, RULE_RELATIVE + " (got a value that is not a path string)")
    if os.path.isabs(relpath):
        raise FileAccessError(shown, RULE_RELATIVE + " (got an absolute path)")
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise FileAccessError(shown, RULE_RELATIVE + " (got '..')")
    return parts


class RunDir:
    """A directory descriptor of a run directory's root; paths below it never follow a link.

    The root itself is opened as the user named it (links in that path are followed: they are
    the user's choice). Use as a context manager or call `close()`.
    """

    def __init__(self, path: str, *, create: bool = False):
        """Opens `path`.

        Args:
            path: The run directory as the user named it.
            create: Create it (and its parents) first if it is missing.

        Raises:
            FileAccessError: If it is missing or not a directory.
        """
        self.path = os.fspath(path)
        if create:
            try:
                os.makedirs(self.path, exist_ok=True)
            except FileExistsError as e:
                raise FileAccessError(self.path, "is not a directory", err=errno.ENOTDIR) from e
        self.fd = open_dir(self.path)

    def close(self) -> None:
        """Closes the descriptor."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except (OSError, AttributeError, TypeError):
            pass

    def join(self, relpath: str) -> str:
        """The path of `relpath` under the root, for messages."""
        return os.path.join(self.path, relpath) if relpath not in ("", ".") else self.path

    def __repr__(self) -> str:
        return f"RunDir({self.path!r})"


Root = Union[str, RunDir]


def open_dir(path: str) -> int:
    """Opens a run directory's root (following links in the path the user named).

    Args:
        path: The directory.

    Returns:
        A directory file descriptor (the caller closes it).

    Raises:
        FileAccessError: If it is missing or not a directory.
    """
    try:
        return os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError as e:
        raise FileMissingError(path, "does not exist", err=errno.ENOENT) from e
    except NotADirectoryError as e:
        raise FileAccessError(path, "is not a directory", err=errno.ENOTDIR) from e


class _Root:
    """A borrowed or owned root descriptor (internal)."""

    def __init__(self, root: Root):
        if isinstance(root, RunDir):
            if root.fd < 0:
                raise FileAccessError(root.path, "the run directory was closed", err=errno.EBADF)
            self.fd, self.path, self._owned = root.fd, root.path, False
        else:
            self.path = os.fspath(root)
            self.fd, self._owned = open_dir(self.path), True

    def __enter__(self) -> _Root:
        return self

    def __exit__(self, *exc) -> None:
        if self._owned:
            os.close(self.fd)

    def show(self, relpath: str) -> str:
        return os.path.join(self.path, relpath) if relpath not in ("", ".") else self.path


def _translate(e: OSError, shown: str, *, writing: bool = False) -> FileAccessError:
    if e.errno == errno.ELOOP:
        return FileAccessError(shown, RULE_NO_LINK, err=errno.ELOOP)
    if e.errno == errno.EXDEV:
        return FileAccessError(shown, RULE_RELATIVE + " (it leaves the run directory)", err=e.errno)
    if e.errno == errno.ENOENT:
        return FileMissingError(shown, "does not exist", err=e.errno)
    if e.errno == errno.ENOTDIR:
        return FileAccessError(
            shown, "a component of the path is not a directory (or is a link)", err=e.errno
        )
    if e.errno == errno.EISDIR:
        return FileAccessError(shown, RULE_REGULAR + "a directory", err=e.errno)
    if e.errno == errno.ENXIO:
        return FileAccessError(shown, RULE_REGULAR + "a FIFO or device", err=e.errno)
    if e.errno == errno.EACCES or e.errno == errno.EPERM:
        return FileAccessError(shown, "permission denied", err=e.errno)
    verb = "written" if writing else "opened"
    return FileAccessError(shown, f"could not be {verb}: {e.strerror}", err=e.errno or errno.EIO)


def _openat(dir_fd: int, parts: list[str], flags: int, mode: int, shown: str) -> int:
    """Opens `parts` below `dir_fd` with no link followed at any component."""
    flags |= os.O_CLOEXEC | os.O_NOFOLLOW
    fn = _openat2_fn()
    if fn is not None:
        fd = _call_openat2(fn, dir_fd, "/".join(parts) or ".", flags, mode, close_dir=False)
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.ENOTDIR:
            raise _translate(OSError(err, os.strerror(err)), shown, writing=bool(flags & 3))
        # ENOTDIR: a component is a file or a link (O_NOFOLLOW | O_DIRECTORY on a link); the
        # walk below finds which and says so (it follows no link either).
    current = dir_fd
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(
                    part,
                    os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=current,
                )
            except OSError as e:
                if e.errno == errno.ENOTDIR and _is_link_at(current, part):
                    raise FileAccessError(shown, RULE_NO_LINK, err=errno.ELOOP) from e
                raise _translate(e, shown) from e
            if current != dir_fd:
                os.close(current)
            current = nxt
        try:
            return os.open(parts[-1] if parts else ".", flags, mode, dir_fd=current)
        except OSError as e:
            if (
                e.errno in (errno.ENOTDIR, errno.EEXIST)
                and parts
                and _is_link_at(current, parts[-1])
            ):
                raise FileAccessError(shown, RULE_NO_LINK, err=errno.ELOOP) from e
            raise _translate(e, shown, writing=bool(flags & 3)) from e
    finally:
        if current != dir_fd:
            os.close(current)


def _is_link_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_parent(root: _Root, relpath: str) -> tuple[int, str, str]:
    """Opens the directory holding `relpath` (no link followed): (dir fd, last name, shown)."""
    shown = root.show(relpath)
    parts = _parts(relpath, shown)
    if not parts:
        raise FileAccessError(shown, "names the run directory itself, not a file in it")
    fd = _openat(root.fd, parts[:-1], os.O_RDONLY | os.O_DIRECTORY, 0, shown)
    return fd, parts[-1], shown


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(root: _Root, relpath: str, flags: int, mode: int = 0o644) -> int:
    shown = root.show(relpath)
    parts = _parts(relpath, shown)
    if not parts:
        raise FileAccessError(shown, RULE_REGULAR + "a directory", err=errno.EISDIR)
    fd = _openat(root.fd, parts, flags | os.O_NONBLOCK | os.O_NOCTTY, mode, shown)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileAccessError(shown, RULE_REGULAR + _kind(st.st_mode), err=errno.EINVAL)
        # O_NONBLOCK stays set: Linux ignores it for regular files (it only kept the open of a
        # FIFO or device from blocking).
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_fd(root: Root, relpath: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """Opens a regular file below `root` with `os.open` flags; no link followed at any component.

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`.
        flags: `os.open` flags (e.g. `O_WRONLY | O_CREAT | O_TRUNC`); `O_NOFOLLOW`, `O_CLOEXEC`
            are added, and `O_NONBLOCK` while checking the file's type.
        mode: The mode of a created file (before the umask).

    Returns:
        A file descriptor of a regular file (the caller closes it).

    Raises:
        FileAccessError: If the path is refused, missing, a link or not a regular file.
    """
    with _Root(root) as r:
        return _open_regular(r, relpath, flags, mode)


def open_read(root: Root, relpath: str) -> BinaryIO:
    """Opens a regular file below `root` for reading (no link at any component, no blocking).

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`.

    Returns:
        A binary file object.

    Raises:
        FileAccessError: If the path is refused, missing, a link or not a regular file.
    """
    return os.fdopen(open_fd(root, relpath, os.O_RDONLY), "rb")


def open_write(root: Root, relpath: str, *, append: bool = False, mode: int = 0o644) -> BinaryIO:
    """Opens a regular file below `root` for writing (created if missing; truncated unless append).

    Prefer `write_atomic` for files read back whole; this is for streams (logs, chunk files).

    Args:
        root: The run directory (a path or a `RunDir`).
        relpath: The file, relative to `root`; its directory must exist.
        append: Append (`O_APPEND`) instead of truncating.
        mode: The mode of a created file (before the umask).

    Returns:
        An unbuffered binary file object.

    Raises:
        FileAccessError: If the path is refused, a link or not a regular file.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    if not append:
        # Truncate only after the type check: O_TRUNC on a FIFO or device would be a side effect.
        fd = open_fd(root, relpath, os.O_WRONLY | os.O_CREAT, mode)
        os.ftruncate(fd, 0)
    else:
        fd = open_fd(root, relpath, flags, mode)
    return os.fdopen(fd, "ab" if append else "wb", buffering=0)


def _show(root: Root, relpath: str) -> str:
    base = root.path if isinstance(root, RunDir) else os.fspath(root)
    return os.path.join(base, relpath) if relpath not in ("", ".") else base
