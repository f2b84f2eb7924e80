"""An exclusive lock on every directory a run writes, for the lifetime of the run.

Two trainers writing one trainer dir interleave `metrics.jsonl`, skip each other's saves as
"already committed" and can remove each other's in-flight checkpoints; two runs whose
checkpoints land in one directory (a copied config keeping `checkpointer.dir`, or two trainer
dirs whose `checkpoints/` is the same place) restore each other's steps and garbage-collect each
other's committed ones. `RunLock` makes the second one fail at once, naming the owner, and
`hold_run_dirs` takes one lock per directory a run writes or garbage-collects: the trainer dir
and the checkpointer dir, wherever it is. The lock is on the file's inode, so two paths that
reach one directory (a link above it) take one lock.

The lock is `<trainer dir>/run.lock`: a file holding the owner's host, pid and start time (JSON),
locked with `flock(LOCK_EX | LOCK_NB)` on an open descriptor the owner keeps until it exits. The
kernel drops the lock when the owner's process ends, however it ends (SIGKILL included), so a
lock left by a dead owner is stale by construction and the next run takes it over; the file
content then says who held it last. This works on local disks and on NFS with lock support.
On object-store mounts (e.g. gcsfuse) `flock` is not shared between hosts: there the launcher's
job name must be unique per trainer dir instead (see docs/reliability.md).

Only process 0 of a multi-process run takes the lock; the others share the directory.
The lock file is opened through `axlearn.common.file_access` (never through a link, regular
files only, no blocking on a FIFO planted under its name).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from typing import Any, Iterator, Optional

from absl import logging

from axlearn.common import file_access

LOCK_FILE = "run.lock"
# What a lock covers, for its error: (the directory's name, the fix).
TRAINER_DIR = ("Trainer dir", "use another --trainer_dir")
CHECKPOINT_DIR = (
    "Checkpoint dir (checkpointer.dir)",
    "give this run its own checkpointer.dir (a copied config keeps the original's; unset, it is "
    "<trainer_dir>/checkpoints) and its own --trainer_dir",
)


# Lock files held by this process, by (device, inode), so that the launcher and the trainer it
# runs take one lock, and a trainer dir that is also the checkpoint dir is locked once.
_held_here: dict[tuple[int, int], str] = {}


def _lock_key(directory: str) -> Optional[tuple[int, int]]:
    """(device, inode) of `<directory>/run.lock`, or None if it is missing (never followed)."""
    try:
        st = file_access.lstat(directory, LOCK_FILE)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class RunLockError(RuntimeError):
    """The trainer directory is in use by another run."""


def held_by_this_process(directory: str) -> bool:
    """Whether this process already holds the run lock of `directory`.

    Args:
        directory: The trainer directory.

    Returns:
        True if a `RunLock` of this process holds it (through any path to that directory).
    """
    key = _lock_key(directory)
    return key is not None and key in _held_here


def _owner_record() -> dict[str, Any]:
    return dict(
        host=socket.gethostname(),
        pid=os.getpid(),
        start_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


class RunLock:
    """Holds `<dir>/run.lock` exclusively between `acquire()` and `release()` (or a `with`)."""

    def __init__(self, directory: str, *, kind: tuple[str, str] = TRAINER_DIR):
        """Prepares the lock of `directory`.

        Args:
            directory: The directory (created on `acquire` if missing).
            kind: What the directory is and the fix, for the error (`TRAINER_DIR`,
                `CHECKPOINT_DIR`).
        """
        self._dir = directory
        self._path = os.path.join(directory, LOCK_FILE)
        self._fd: Optional[int] = None
        self._key: Optional[tuple[int, int]] = None
        self._kind = kind

    @property
    def path(self) -> str:
        """The lock file."""
        return self._path

    def acquire(self) -> None:
        """Takes the lock, or raises at once if another live process holds it.

        The lock file is opened without following symbolic links: a link planted as `run.lock`
        (e.g. in a shared /tmp trainer dir) is refused and its target never truncated.

        Raises:
            RunLockError: Naming the owner (host, pid, start time) and the lock file, or naming
                the link when `run.lock` is a symbolic link.
        """
        name, fix = self._kind
        if os.path.exists(self._dir) and not os.path.isdir(self._dir):
            raise RunLockError(
                f"{name} {self._dir} is a file, not a directory: pass a directory (a new "
                "one is created)."
            )
        os.makedirs(self._dir, exist_ok=True)
        try:
            fd = file_access.open_fd(self._dir, LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except file_access.FileAccessError as e:
            if e.errno == errno.ELOOP:
                raise RunLockError(
                    f"Run lock {self._path} is a symbolic link (to {_readlink(self._path)!r}); "
                    "run files are never opened through a link, so the link's target is not "
                    "touched. Remove the link (or use another directory)."
                ) from e
            raise RunLockError(f"Run lock {e}. Remove it (or use another directory).") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = _read_owner(fd)
            os.close(fd)
            raise RunLockError(
                f"{name} {self._dir} is in use by another run (host {owner.get('host')}, "
                f"pid {owner.get('pid')}, started {owner.get('start_time')}; lock {self._path}). "
                f"Two runs must not share a directory they write: wait for it to end, stop it, "
                f"or {fix}."
            ) from e
        previous = _read_owner(fd)
        if previous:
            logging.info(
                "Taking over the run lock %s from a run that is gone (host %s, pid %s).",
                self._path,
                previous.get("host"),
                previous.get("pid"),
            )
        data = json.dumps(_owner_record(), sort_keys=True).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        self._fd = fd
        st = os.fstat(fd)
        self._key = (st.st_dev, st.st_ino)
        _held_here[self._key] = self._path

    def release(self) -> None:
        """Releases the lock (the file stays, with the last owner's record)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self._key is not None:
                _held_here.pop(self._key, None)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def held_by_a_live_run(directory: str) -> bool:
    """Whether a live process holds the run lock of `directory` (e.g. a run is training there).

    Probes the lock with a shared, non-blocking `flock` (released at once); never creates the
    file and never follows a link.

    Args:
        directory: The trainer directory.

    Returns:
        True if `<directory>/run.lock` exists and is locked.
    """
    try:
        fd = file_access.open_fd(directory, LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # Closing releases a shared lock taken above.
    return False


@contextlib.contextmanager
def hold_run_dirs(
    trainer_dir: str, checkpoint_dir: Optional[str] = None
) -> Iterator[list[RunLock]]:
    """Holds the run lock of the trainer dir and of the checkpoint dir, wherever it is.

    A directory whose lock this process already holds (the launcher took it, or the checkpoint
    dir is the trainer dir by another path) is not locked twice. The trainer dir is locked
    first, so a second run on it fails before it creates anything else.

    Args:
        trainer_dir: The trainer dir.
        checkpoint_dir: `checkpointer.dir` (None: the trainer dir's lock covers the run).

    Yields:
        The locks taken here (released on exit).

    Raises:
        RunLockError: If another live run holds either, naming it (host, pid, start time).
    """
    taken: list[RunLock] = []
    try:
        for directory, kind in ((trainer_dir, TRAINER_DIR), (checkpoint_dir, CHECKPOINT_DIR)):
            if not isinstance(directory, str) or not directory:
                continue
            if held_by_this_process(directory):
                continue
            lock = RunLock(directory, kind=kind)
            lock.acquire()
            taken.append(lock)
        yield taken
    finally:
        for lock in reversed(taken):
            lock.release()


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0)
        owner = file_access.parse_json(data, LOCK_FILE, max_depth=4) if data else {}
        return owner if isinstance(owner, dict) else {}
    except (OSError, ValueError):
        return {}
