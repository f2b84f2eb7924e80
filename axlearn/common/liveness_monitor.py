"""Liveness monitors: is a training job still making progress?

`TfSummaryMonitor` watches the TensorBoard event files a trainer writes below `summary_dir` (any
depth, e.g. `summary_dir/train_train/events.out.tfevents.*`): the job is alive while the newest
event's wall time is at most `max_timeout_seconds` old, and always during the grace period of
`max_start_seconds` after `reset()` (start-up: restore and compilation write no summaries).

    monitor = TfSummaryMonitor.default_config().set(
        summary_dir=trainer_dir + "/summaries", max_timeout_seconds=600, max_start_seconds=1800
    ).instantiate()
    monitor.reset()        # At job start (and after a restart).
    ...
    if not monitor.ping(): # From a supervisor loop.
        ...                # The job is stuck.

Event files are read through the file layer (`axlearn.common.file_access`: no link followed,
regular files only) and incrementally: each `ping()` reads only the records appended since the
previous one, and a record still being written is read at the next ping.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Iterator, Optional

from absl import logging

from axlearn.common import file_access
from axlearn.common.config import REQUIRED, Configurable, Required, config_class

# A TFRecord: uint64 length, uint32 masked CRC of the length, the data, uint32 masked CRC of it.
_HEADER = struct.Struct("<QI")
_FOOTER_BYTES = 4
# Records longer than this are taken as a corrupt file (summaries are far smaller).
_MAX_RECORD_BYTES = 256 << 20


class LivenessMonitor(Configurable):
    """The interface of liveness monitors."""

    def started(self) -> bool:
        """Returns whether `reset()` was called (monitoring has started)."""
        raise NotImplementedError(type(self))

    def reset(self) -> None:
        """Starts (or restarts) monitoring, with a new grace period from now."""
        raise NotImplementedError(type(self))

    def ping(self) -> bool:
        """Returns True iff the job is alive."""
        raise NotImplementedError(type(self))


class _EventFileTail:
    """Reads the events appended to one event file since the last read."""

    def __init__(self, relpath: str):
        self.relpath = relpath
        self.offset = 0
        self.broken = False

    def new_wall_times(self, root: file_access.RunDir) -> Iterator[float]:
        """Yields the wall times of the complete records after `offset`, advancing it."""
        if self.broken:
            return
        # pylint: disable-next=import-outside-toplevel
        from tensorboard.compat.proto import event_pb2

        with file_access.open_read(root, self.relpath) as f:
            f.seek(self.offset)
            while True:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    return  # End of file, or a header still being written.
                (length, _) = _HEADER.unpack(header)
                if length > _MAX_RECORD_BYTES:
                    self._give_up(root, f"a record of {length} bytes")
                    return
                body = f.read(length + _FOOTER_BYTES)
                if len(body) < length + _FOOTER_BYTES:
                    return  # A record still being written: read it at the next ping.
                try:
                    event = event_pb2.Event.FromString(body[:length])
                except Exception:  # pylint: disable=broad-exception-caught
                    self._give_up(root, "a record that is not an Event")
                    return
                self.offset += _HEADER.size + length + _FOOTER_BYTES
                yield event.wall_time

    def _give_up(self, root: file_access.RunDir, what: str) -> None:
        logging.warning("%s: %s; no longer read.", root.join(self.relpath), what)
        self.broken = True


class TfSummaryMonitor(LivenessMonitor):
    """Monitors the TensorBoard event files below a summary directory."""

    @config_class
    class Config(LivenessMonitor.Config):
        """Configures TfSummaryMonitor."""

        # The directory below which (at any depth) the job writes TensorBoard event files.
        summary_dir: Required[str] = REQUIRED
        # After the grace period, the job is stuck when no event is newer than this (seconds).
        max_timeout_seconds: Required[float] = REQUIRED
        # The grace period after `reset()` during which `ping()` is always True (seconds).
        max_start_seconds: Required[float] = REQUIRED

    def __init__(self, cfg: Config):
        """Creates the monitor (not started: call `reset()`).

        Args:
            cfg: The config.

        Raises:
            ValueError: If a timeout is negative (or max_timeout_seconds is not positive).
        """
        super().__init__(cfg)
        cfg = self.config
        if not cfg.max_timeout_seconds > 0:
            raise ValueError(
                f"TfSummaryMonitor.max_timeout_seconds must be > 0, got {cfg.max_timeout_seconds}"
            )
        if not cfg.max_start_seconds >= 0:
            raise ValueError(
                f"TfSummaryMonitor.max_start_seconds must be >= 0, got {cfg.max_start_seconds}"
            )
        self._tails: dict[str, _EventFileTail] = {}
        self._lock = threading.Lock()
        self._latest: Optional[float] = None
        self._start_time: Optional[float] = None

    def started(self) -> bool:
        """Returns whether `reset()` was called."""
        return self._start_time is not None

    def reset(self) -> None:
        """Starts the grace period now; events older than now no longer count as a heartbeat."""
        self._latest = time.time()
        self._start_time = self._latest
        logging.info("Summary monitor (re)started at %s.", self._start_time)

    def _new_wall_times(self) -> Iterator[float]:
        """Yields the wall times of the events written since the last call."""
        cfg = self.config
        with file_access.RunDir(cfg.summary_dir) as root, self._lock:
            for rel, _, files in file_access.walk(root):
                for name in files:
                    if "tfevents" not in name:
                        continue
                    relpath = name if rel == "." else f"{rel}/{name}"
                    tail = self._tails.setdefault(relpath, _EventFileTail(relpath))
                    try:
                        yield from tail.new_wall_times(root)
                    except file_access.FileAccessError as e:
                        logging.warning("Skipping an event file: %s", e)

    def ping(self) -> bool:
        """Returns whether the job is alive: in the grace period, or with a recent event.

        Returns:
            False iff the grace period is over and no event is newer than max_timeout_seconds.

        Raises:
            RuntimeError: If `reset()` was never called.
        """
        cfg = self.config
        if not self.started():
            raise RuntimeError("Monitoring hasn't started yet: call reset() first.")
        try:
            for wall_time in self._new_wall_times():
                self._latest = max(self._latest, wall_time)
        except file_access.FileMissingError:
            logging.warning("%s does not exist: unable to infer health.", cfg.summary_dir)
        now = time.time()
        since_latest = now - self._latest
        logging.info(
            "Now: %s; latest summary wall time: %s; seconds since: %s",
            now,
            self._latest,
            since_latest,
        )
        if since_latest <= cfg.max_timeout_seconds:
            return True
        if now - self._start_time <= cfg.max_start_seconds:
            logging.info("In the grace period: skipping the health check.")
            return True
        logging.error("Health check failed: no summary for %.1fs.", since_latest)
        return False
