"""An exclusive lock on a trainer directory for the lifetime of a run.

Two trainers writing one trainer dir interleave `metrics.jsonl`, skip each other's saves as
"already committed" and can remove each other's in-flight checkpoints. `RunLock` makes the second
one fail at once, naming the owner.

The lock is `<trainer dir>/run.lock`: a file holding the owner's host, pid and start time (JSON),
locked with `flock(LOCK_EX | LOCK_NB)` on an open descriptor the owner keeps until it exits. The
kernel drops the lock when the owner's process ends, however it ends (SIGKILL included), so a
lock left by a dead owner is stale by construction and the next run takes it over; the file
content then says who held it last. This works on local disks and on NFS with lock support.
On object-store mounts (e.g. gcsfuse) `flock` is not shared between hosts: there the launcher's
job name must be unique per trainer dir instead (see docs/reliability.md).

Only process 0 of a multi-process run takes the lock; the others share the directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Any, Optional

from absl import logging

from axlearn.common.path_containment import PathContainmentError, open_no_follow

LOCK_FILE = "run.lock"


# Lock files held by this process (so that the launcher and the trainer it runs take one lock).
_held_here: set[str] = set()


class RunLockError(RuntimeError):
    """The trainer directory is in use by another run."""


def held_by_this_process(directory: str) -> bool:
    """Whether this process already holds the run lock of `directory`.

    Args:
        directory: The trainer directory.

    Returns:
        True if a `RunLock` of this process holds it.
    """
    return os.path.abspath(os.path.join(directory, LOCK_FILE)) in _held_here


def _owner_record() -> dict[str, Any]:
    return dict(
        host=socket.gethostname(),
        pid=os.getpid(),
        start_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


class RunLock:
    """Holds `<dir>/run.lock` exclusively between `acquire()` and `release()` (or a `with`)."""

    def __init__(self, directory: str):
        self._dir = directory
        self._path = os.path.join(directory, LOCK_FILE)
        self._fd: Optional[int] = None

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
        if os.path.exists(self._dir) and not os.path.isdir(self._dir):
            raise RunLockError(
                f"Trainer dir {self._dir} is a file, not a directory: pass a directory (a new "
                "one is created)."
            )
        os.makedirs(self._dir, exist_ok=True)
        try:
            fd = open_no_follow(self._path, os.O_RDWR | os.O_CREAT, 0o644, what="Run lock")
        except PathContainmentError as e:
            raise RunLockError(str(e)) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = _read_owner(fd)
            os.close(fd)
            raise RunLockError(
                f"Trainer dir {self._dir} is in use by another run (host {owner.get('host')}, "
                f"pid {owner.get('pid')}, started {owner.get('start_time')}; lock {self._path}). "
                "Two trainers must not share a trainer dir: wait for it to end, stop it, or use "
                "another --trainer_dir."
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
        _held_here.add(os.path.abspath(self._path))

    def release(self) -> None:
        """Releases the lock (the file stays, with the last owner's record)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            _held_here.discard(os.path.abspath(self._path))
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
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # Closing releases a shared lock taken above.
    return False


def _read_owner(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0)
        owner = json.loads(data.decode("utf-8")) if data else {}
        return owner if isinstance(owner, dict) else {}
    except (OSError, ValueError):
        return {}
