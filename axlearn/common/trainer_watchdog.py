"""The trainer's profiler tracing and hang watchdog (part of SpmdTrainer).

- Profiling: `start_trace_steps` start a 3-step `jax.profiler` trace on the processes in
  `start_trace_process_indices`; its cost is charged to the step as the `profiler` overhead.
- Watchdog: if the step does not advance for `watchdog_timeout_seconds`, every thread's stack is
  logged; after `crash_on_hang_timeout_seconds` the process exits with `HANG_EXIT_CODE` (75), which
  `axlearn local launch --max_restarts` and the JobSet's restart policy treat as a failure.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from typing import Optional

import jax
from absl import logging

from axlearn.common.exit_codes import HANG_EXIT_CODE


class TrainerWatchdogMixin:
    """Profiler and watchdog methods of SpmdTrainer."""

    def _should_trace_here(self) -> bool:
        indices = self._config.start_trace_process_indices
        return indices == "all" or jax.process_index() in indices

    def _maybe_trace(self, stop_trace_step: Optional[int], pending) -> Optional[int]:
        """Starts a 3-step jax.profiler trace at configured steps; stops it 3 steps later."""
        next_step = self._step + 1
        if stop_trace_step is not None and next_step >= stop_trace_step:
            with self._timer.overhead("profiler"):
                if pending is not None:
                    jax.block_until_ready(pending.outputs["loss"])
                self._stop_trace()
            stop_trace_step = None
        if next_step in self._config.start_trace_steps and self._should_trace_here():
            if stop_trace_step is not None:
                logging.warning("Not tracing at step %d: a trace is still running.", next_step)
            else:
                with self._timer.overhead("profiler"):
                    trace_dir = os.path.join(self._config.dir, "summaries", "train_train")
                    jax.profiler.start_trace(trace_dir)
                    self._tracing = True
                self._step_log("Started profiler trace for steps %d-%d.", next_step, next_step + 2)
                stop_trace_step = next_step + 3
        return stop_trace_step

    def _stop_trace(self) -> None:
        if getattr(self, "_tracing", False):
            jax.profiler.stop_trace()
            self._tracing = False
            self._step_log("Stopped profiler trace.")

    @contextlib.contextmanager
    def _watchdog(self):
        cfg = self._config
        if cfg.watchdog_timeout_seconds or cfg.crash_on_hang_timeout_seconds:
            self._watchdog_stop = threading.Event()
            self._watchdog_thread = threading.Thread(
                target=self._watchdog_loop, name=f"{self.path()}.watchdog", daemon=True
            )
            self._watchdog_thread.start()
        try:
            yield
        finally:
            if self._watchdog_thread is not None:
                self._watchdog_stop.set()
                self._watchdog_thread.join()
                self._watchdog_thread = None

    def _watchdog_loop(self) -> None:
        """Logs every thread's stack if the step does not advance; optionally kills the process."""
        cfg = self._config
        timeouts = [
            t for t in (cfg.watchdog_timeout_seconds, cfg.crash_on_hang_timeout_seconds) if t
        ]
        interval = min(min(timeouts), 60.0)
        last_step, last_change = self._step, time.monotonic()
        reported = False
        while not self._watchdog_stop.wait(interval):
            if self._step != last_step:
                last_step, last_change, reported = self._step, time.monotonic(), False
                continue
            stalled = time.monotonic() - last_change
            if (
                cfg.watchdog_timeout_seconds
                and stalled >= cfg.watchdog_timeout_seconds
                and not reported
            ):
                logging.warning(
                    "Watchdog: step %s has not advanced for %.0f s. Thread stacks:\n%s",
                    self._step,
                    stalled,
                    thread_stack_traces(),
                )
                reported = True
            if cfg.crash_on_hang_timeout_seconds and stalled >= cfg.crash_on_hang_timeout_seconds:
                logging.error(
                    "Watchdog: step %s has not advanced for %.0f s; exiting with code %d (a "
                    "hang) so that the launcher restarts the job.",
                    self._step,
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
