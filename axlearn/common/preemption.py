"""Preemption: on SIGTERM, finish the step in flight, save it, exit with `PREEMPTED_EXIT_CODE`.

Schedulers (Kubernetes, GCE spot VMs, Slurm, TPU maintenance events) announce an eviction with
SIGTERM and kill the process a grace period later (30 s by default on Kubernetes and GCE). While
`SpmdTrainer.run` runs, a `PreemptionHandler` turns that SIGTERM into a clean stop:

1. The signal only records the notice (the time it arrived and a flag); training goes on until
   the step being dispatched is in flight.
2. After dispatching step N the trainer sees the notice, waits for step N to finish (a dispatched
   step cannot be abandoned part-way; it costs at most one step time), reports it, and saves
   step N unless its save policy already did, then waits until the save is committed.
3. It raises `TrainingPreempted`, a `SystemExit` whose code is `PREEMPTED_EXIT_CODE` (75,
   `EX_TEMPFAIL` of sysexits.h: "temporary failure, retry"), so a launcher or script exits with
   that code and the scheduler knows a restart will resume from the saved step.
4. A deadline, `timeout_seconds` after the signal arrived, bounds all of it: if the process is
   still running then (a step or a save that hangs), it logs what it was doing and exits at once
   with the same code; the newest committed checkpoint is then an earlier one, which a restart
   resumes from.

Ctrl-C (SIGINT) is handled the same way, with exit code `INTERRUPTED_EXIT_CODE` (130, the
shell's 128 + SIGINT): the step in flight is finished and saved, and the process exits with one
line. A second Ctrl-C exits at once (same code), saying which step is not saved; the newest
committed checkpoint is then the one a restart resumes from.

The arrival time is taken by a thread woken through `signal.set_wakeup_fd`, so the deadline
counts from the signal even while the main thread is blocked in a long device call.

With several processes (`jax.distributed`), the processes must agree on the step to save: when
JAX's preemption service is on (its default), the notice comes from
`jax.experimental.multihost_utils.reached_preemption_sync_point`, which JAX's own SIGTERM
listener drives and which returns True on the same step on every process. Without it, a
multi-process trainer does not handle SIGTERM (a warning says so).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Callable, Optional

import jax
from absl import logging

from axlearn.common import exit_codes

# The exit code of a trainer stopped by a preemption notice (EX_TEMPFAIL: retry later; defined in
# exit_codes.py). The newest committed checkpoint holds the last completed step (unless the
# deadline passed first).
PREEMPTED_EXIT_CODE = exit_codes.PREEMPTED_EXIT_CODE

# Seconds from the notice to the exit when not configured: under the 30 s grace period that
# Kubernetes and GCE spot VMs give by default.
DEFAULT_PREEMPTION_TIMEOUT_SECONDS = 25.0

# The exit code of a trainer stopped by Ctrl-C (SIGINT), saved or not: 128 + SIGINT, what a
# shell reports for a process ended by Ctrl-C.
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT


class TrainingPreempted(SystemExit):
    """Raised by `SpmdTrainer.run` after a preemption notice, once the save is committed.

    A `SystemExit`: unless caught, the process exits with `PREEMPTED_EXIT_CODE`.

    Attributes:
        step: The last completed step.
        saved_step: The step committed for the restart (normally `step`).
        notice_to_exit_s: Seconds from the notice to the end of the save.
    """

    def __init__(
        self,
        *,
        step: int,
        saved_step: Optional[int],
        notice_to_exit_s: float,
        interrupted: bool = False,
    ):
        super().__init__(INTERRUPTED_EXIT_CODE if interrupted else PREEMPTED_EXIT_CODE)
        self.step = step
        self.saved_step = saved_step
        self.notice_to_exit_s = notice_to_exit_s
        self.interrupted = interrupted

    def __str__(self) -> str:
        what = "Interrupted (Ctrl-C)" if self.interrupted else "Preempted"
        return (
            f"{what} after step {self.step}; committed step {self.saved_step} "
            f"{self.notice_to_exit_s:.2f}s after the notice; exit code {self.code}."
        )


class PreemptionHandler:
    """Receives preemption notices while in a `with` block; see the module docstring.

    Usage (what SpmdTrainer.run does):

        with PreemptionHandler(timeout_seconds=25) as preemption:
            while training:
                ... dispatch step N ...
                if preemption.requested(step=N):
                    ... finish step N, save it, wait ...
                    raise preemption.preempted(step=N, saved_step=N)
    """

    def __init__(
        self,
        *,
        timeout_seconds: Optional[float] = None,
        signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
        exit_fn: Callable[[int], None] = os._exit,  # pylint: disable=protected-access
    ):
        """Initializes the handler (nothing is installed until `__enter__`).

        Args:
            timeout_seconds: Seconds from the notice to the exit; None: the default (25 s).
            signals: The signals that mean "stop": SIGINT (Ctrl-C) exits with
                INTERRUPTED_EXIT_CODE, the others with PREEMPTED_EXIT_CODE.
            exit_fn: Called with the exit code when the deadline passes or a second Ctrl-C
                arrives (tests replace it).

        Raises:
            ValueError: If timeout_seconds is not positive.
        """
        if timeout_seconds is None:
            timeout_seconds = DEFAULT_PREEMPTION_TIMEOUT_SECONDS
        if not timeout_seconds > 0:
            raise ValueError(f"preemption timeout_seconds must be > 0, got {timeout_seconds!r}")
        self._timeout_seconds = float(timeout_seconds)
        self._signals = tuple(signals)
        self._exit_fn = exit_fn
        self._notice = threading.Event()
        self._notice_time: Optional[float] = None
        self._lock = threading.RLock()
        self._previous_handlers: dict[int, object] = {}
        self._previous_wakeup_fd: Optional[int] = None
        self._pipe: Optional[tuple[int, int]] = None
        self._listener: Optional[threading.Thread] = None
        self._deadline: Optional[threading.Timer] = None
        self._use_jax_sync = False
        self._active = False
        self._doing = "training"
        # Whether the notice was a Ctrl-C (SIGINT); the number of SIGINTs seen; the last step.
        self._interrupted = False
        self._sigint_count = 0
        self._last_step: Optional[int] = None

    @property
    def timeout_seconds(self) -> float:
        """Seconds from the notice to the exit."""
        return self._timeout_seconds

    @property
    def active(self) -> bool:
        """Whether notices are received (inside the `with` block, when a handler is installed)."""
        return self._active

    def __enter__(self) -> PreemptionHandler:
        if jax.process_count() > 1:
            if _jax_preemption_service_running():
                self._use_jax_sync = True
                self._active = True
            else:
                logging.warning(
                    "JAX's preemption service is off (jax_enable_preemption_service): this "
                    "%d-process trainer does not handle SIGTERM.",
                    jax.process_count(),
                )
            return self
        if threading.current_thread() is not threading.main_thread():
            logging.warning(
                "The trainer does not run in the main thread, so it cannot handle SIGTERM; "
                "a preemption will not save a checkpoint."
            )
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        for signum in self._signals:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        self._previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._listener = threading.Thread(
            target=self._listen, args=(read_fd,), name="preemption_listener", daemon=True
        )
        self._listener.start()
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        with self._lock:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
        if self._pipe is not None:
            signal.set_wakeup_fd(
                -1 if self._previous_wakeup_fd is None else self._previous_wakeup_fd
            )
            for signum, previous in self._previous_handlers.items():
                signal.signal(signum, previous)
            self._previous_handlers = {}
            read_fd, write_fd = self._pipe
            self._pipe = None
            os.close(write_fd)  # Wakes the listener with EOF.
            if self._listener is not None:
                self._listener.join(timeout=5)
                self._listener = None
            os.close(read_fd)
        self._active = False

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        """The Python-level handler (runs in the main thread between bytecodes)."""
        del frame
        # The listener thread counts SIGINTs (each signal reaches both it and this handler).
        self._record_notice(f"signal {signal.Signals(signum).name}", signum=signum)

    def _listen(self, read_fd: int) -> None:
        """Wakes on the C-level signal handler's write, even while the main thread is blocked."""
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in self._signals:
                    continue
                if signum == signal.SIGINT:
                    with self._lock:
                        self._sigint_count += 1
                        again = self._sigint_count > 1
                    if again:
                        self._exit_now()
                        return
                self._record_notice(f"signal {signal.Signals(signum).name}", signum=signum)

    def _exit_now(self) -> None:
        """A second Ctrl-C: exits at once with one line saying what is not saved."""
        step = "the step in flight" if self._last_step is None else f"step {self._last_step}"
        line = (
            f"Second Ctrl-C while {self._doing}: exiting now with code {INTERRUPTED_EXIT_CODE}; "
            f"{step} is not saved, so a restart resumes from the newest committed "
            "checkpoint (one Ctrl-C saves before exiting).\n"
        )
        try:
            os.write(2, line.encode())
        except OSError:
            pass
        self._exit_fn(INTERRUPTED_EXIT_CODE)

    @property
    def exit_code(self) -> int:
        """The code the process exits with after the notice (Ctrl-C: 130, else 75)."""
        return INTERRUPTED_EXIT_CODE if self._interrupted else PREEMPTED_EXIT_CODE

    def _record_notice(self, source: str, *, signum: Optional[int] = None) -> None:
        with self._lock:
            if self._notice.is_set():
                return
            self._interrupted = signum == signal.SIGINT
            self._notice_time = time.monotonic()
            self._notice.set()
            self._deadline = threading.Timer(self._timeout_seconds, self._on_deadline)
            self._deadline.daemon = True
            self._deadline.start()
        if self._interrupted:
            logging.warning(
                "Ctrl-C: finishing the step in flight, saving it and exiting with code %d "
                "within %.0f s (press Ctrl-C again to exit at once without saving).",
                INTERRUPTED_EXIT_CODE,
                self._timeout_seconds,
            )
            return
        logging.warning(
            "Preemption notice (%s): finishing the step in flight, saving it and exiting with "
            "code %d within %.0f s.",
            source,
            PREEMPTED_EXIT_CODE,
            self._timeout_seconds,
        )

    def _on_deadline(self) -> None:
        logging.error(
            "Preemption: still %s %.0f s after the notice; exiting now with code %d. The newest "
            "committed checkpoint is the one a restart resumes from.",
            self._doing,
            self._timeout_seconds,
            self.exit_code,
        )
        logging.flush()
        sys.stderr.flush()
        self._exit_fn(self.exit_code)

    def set_activity(self, what: str) -> None:
        """Names what the trainer is doing, for the deadline's message (e.g. "saving step 7")."""
        self._doing = what

    def requested(self, *, step: int) -> bool:
        """Whether to stop after `step` (call once per step, after dispatching it).

        Single process: whether a notice arrived. Several processes: whether all reached JAX's
        preemption sync point at `step` (the same answer on every process).

        Args:
            step: The step just dispatched.

        Returns:
            Whether to finish `step`, save it and exit.
        """
        if not self._active:
            return False
        self._last_step = step
        if self._use_jax_sync:
            # pylint: disable-next=import-outside-toplevel
            from jax.experimental import multihost_utils

            if multihost_utils.reached_preemption_sync_point(step):
                self._record_notice(f"JAX preemption sync point at step {step}")
                return True
            return False
        return self._notice.is_set()

    def seconds_since_notice(self) -> Optional[float]:
        """Seconds since the notice arrived, or None without a notice."""
        if self._notice_time is None:
            return None
        return time.monotonic() - self._notice_time

    def preempted(self, *, step: int, saved_step: Optional[int]) -> TrainingPreempted:
        """The exception to raise once the save is committed.

        Args:
            step: The last completed step.
            saved_step: The step committed for the restart.

        Returns:
            The exception.
        """
        return TrainingPreempted(
            step=step,
            saved_step=saved_step,
            notice_to_exit_s=self.seconds_since_notice() or 0.0,
            interrupted=self._interrupted,
        )


def _jax_preemption_service_running() -> bool:
    """Whether jax.distributed runs JAX's preemption sync manager (it listens for SIGTERM)."""
    try:
        # pylint: disable-next=import-outside-toplevel
        from jax._src import distributed
    except ImportError:  # pragma: no cover - a JAX without this module.
        return False
    state = getattr(distributed, "global_state", None)
    return getattr(state, "preemption_sync_manager", None) is not None
