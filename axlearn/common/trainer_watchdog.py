"""The trainer's hang watchdog: a part that `SpmdTrainer` owns (see docs/trainer.md).

If the step does not advance for `timeout_seconds`, every thread's stack is logged once; after
`crash_timeout_seconds` the process exits with `HANG_EXIT_CODE` (75), which
`axlearn local launch --max_restarts` and the JobSet's restart policy treat as a failure. The
watchdog reads the step through the callable the trainer hands it and nothing else of the trainer.

With a `DeviceMonitor` (`SpmdTrainer.Config.device_monitor`), the monitor runs inside `running()`
too, and a step that has stalled for a whole check while the monitor calls the host idle is
logged at once (a hang: nothing is computing), without waiting for `timeout_seconds`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from typing import Callable, Iterator, Optional

from absl import logging

from axlearn.common.exit_codes import HANG_EXIT_CODE
from axlearn.common.monitoring.device_monitor import DeviceMonitor


class Watchdog:
    """Logs every thread's stack when the step stalls; optionally kills the process.

    Interface: `running()` (a context manager: the watchdog thread runs inside it).
    """

    def __init__(
        self,
        *,
        current_step: Callable[[], Optional[int]],
        timeout_seconds: Optional[float],
        crash_timeout_seconds: Optional[float],
        name: str,
        device_monitor: Optional[DeviceMonitor] = None,
    ):
        """Builds a watchdog (no thread runs until `running()`).

        Args:
            current_step: Returns the trainer's current step (read from the watchdog thread).
            timeout_seconds: If set, log the stacks once the step stalls for this long.
            crash_timeout_seconds: If set, exit the process once the step stalls for this long.
            name: The watchdog thread's name.
            device_monitor: If set, runs inside `running()`; a stall while it calls the host
                idle is logged at once.
        """
        self._current_step = current_step
        self._timeout_seconds = timeout_seconds
        self._crash_timeout_seconds = crash_timeout_seconds
        self._name = name
        self._device_monitor = device_monitor
        self._stop: Optional[threading.Event] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def enabled(self) -> bool:
        """Whether either timeout is set."""
        return bool(self._timeout_seconds or self._crash_timeout_seconds or self._monitor_interval)

    @property
    def _monitor_interval(self) -> Optional[float]:
        """Seconds between the device monitor's checks (None without an enabled monitor)."""
        if self._device_monitor is None:
            return None
        return self._device_monitor.config.check_interval_in_sec or None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Runs the watchdog thread (if enabled) and the device monitor for the block."""
        monitoring = (
            self._device_monitor.start_monitoring()
            if self._device_monitor is not None
            else contextlib.nullcontext()
        )
        with monitoring, self._watching():
            yield

    @contextlib.contextmanager
    def _watching(self) -> Iterator[None]:
        """Runs the watchdog thread (if enabled) for the duration of the block."""
        if self.enabled:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            if self._thread is not None:
                self._stop.set()
                self._thread.join()
                self._thread = None

    def _loop(self) -> None:
        """Logs every thread's stack if the step does not advance; optionally kills the process."""
        log_after, crash_after = self._timeout_seconds, self._crash_timeout_seconds
        monitor_every = self._monitor_interval
        interval = min(min(t for t in (log_after, crash_after, monitor_every) if t), 60.0)
        last_step, last_change = self._current_step(), time.monotonic()
        reported = False
        while not self._stop.wait(interval):
            step = self._current_step()
            if step != last_step:
                last_step, last_change, reported = step, time.monotonic(), False
                continue
            stalled = time.monotonic() - last_change
            if (
                monitor_every
                and stalled >= monitor_every
                and not reported
                and self._device_monitor.is_host_idle()
            ):
                logging.warning(
                    "Watchdog: step %s has not advanced for %.1f s and the host's devices are "
                    "idle (a hang suspected). Thread stacks:\n%s",
                    step,
                    stalled,
                    thread_stack_traces(),
                )
                reported = True
            if log_after and stalled >= log_after and not reported:
                logging.warning(
                    "Watchdog: step %s has not advanced for %.0f s. Thread stacks:\n%s",
                    step,
                    stalled,
                    thread_stack_traces(),
                )
                reported = True
            if crash_after and stalled >= crash_after:
                logging.error(
                    "Watchdog: step %s has not advanced for %.0f s; exiting with code %d (a "
                    "hang) so that the launcher restarts the job.",
                    step,
                    stalled,
                    HANG_EXIT_CODE,
                )
                logging.flush()
                os._exit(HANG_EXIT_CODE)  # pylint: disable=protected-access


def thread_stack_traces() -> str:
    """Returns the current stack of every Python thread, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():  # pylint: disable=protected-access
        parts.append(
            f"--- Thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
        )
    return "\n".join(parts)
