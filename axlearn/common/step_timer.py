"""Step time accounting: the interval between two consecutive host syncs on the loss.

A step's wall time is the time between two consecutive calls of `StepTimer.end_step`, which the
trainer makes right after it has the step's loss on the host (`float(loss)` returned). The first
step's interval starts at `StepTimer.start()`. Dispatch stays pipelined: the trainer dispatches
step N+1 before it reads step N's loss, so the device never idles while the host waits.

Overheads (compile, input wait, summaries, eval, checkpoint, profiler, ...) are host time measured
with `StepTimer.overhead(kind)` (or reported with `add_overhead`) and charged to the interval in
which they happen, i.e. to the step whose `end_step` comes next: the log line of that step shows
its wall time and the overheads inside it. Nested `overhead` blocks count once (the outermost).

Some overheads make a step unrepresentative of training speed: steps that contain compile,
eval, checkpoint or profiler time are labelled with that reason and left out of averages
(`EXCLUDED_KINDS`). Input wait and summary writing recur every step and stay in.

Notes on what the numbers mean under pipelining: overhead time runs on the host while the device
may still be busy with an already dispatched step, so a step's wall time is at least
max(device time, host time) and the overheads in it are not simply additive. To measure an
overhead that must not overlap device work (eval, checkpoint), the trainer first syncs the step
(so the pipeline is drained), then runs the overhead, then dispatches the next step.

Example (a fake clock):

    times = iter([0.0, 0.0, 0.8, 1.0, 1.0, 3.0, 3.1])
    timer = StepTimer(clock=lambda: next(times))
    timer.start()                       # t = 0.0
    with timer.overhead("compile"):     # t = 0.0 .. 0.8
        pass
    step0 = timer.end_step(0)           # t = 1.0: "1.000 s (compile 0.800 s)", label "compile"
    with timer.overhead("checkpoint"):  # t = 1.0 .. 3.0
        pass
    step1 = timer.end_step(1)           # t = 3.1: "2.100 s (checkpoint 2.000 s)"
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Optional, Protocol

# Overhead kinds the trainer reports. Others are allowed (they show up in the log as given).
OVERHEAD_KINDS = ("compile", "input", "summary", "eval", "checkpoint", "profiler")
# Steps containing any of these are excluded from averages; the first present is the label.
EXCLUDED_KINDS = ("compile", "eval", "checkpoint", "profiler")


class StepTimerError(RuntimeError):
    """The timer was used out of order (e.g. end_step before start, or inside an overhead)."""


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """The measured time of one step.

    Attributes:
        step: The step number given to `end_step`.
        wall_s: Seconds between the previous sync (or `start`) and this step's sync.
        overheads: Seconds of each overhead kind inside that interval.
        excluded_reason: The first of `EXCLUDED_KINDS` present in `overheads`, if any: the step is
            labelled with it and excluded from averages.
    """

    step: int
    wall_s: float
    overheads: dict[str, float]
    excluded_reason: Optional[str]

    @property
    def overhead_s(self) -> float:
        """Total overhead seconds inside the step."""
        return float(sum(self.overheads.values()))

    def describe(self) -> str:
        """Returns e.g. '0.152 s (input 0.001 s, checkpoint 2.004 s)'."""
        text = f"{self.wall_s:.3f} s"
        parts = [f"{k} {v:.3f} s" for k, v in self.overheads.items() if v > 0]
        if parts:
            text += " (" + ", ".join(parts) + ")"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Returns a JSON-ready dict."""
        return dict(
            step=self.step,
            wall_s=self.wall_s,
            overheads=dict(self.overheads),
            overhead_s=self.overhead_s,
            excluded_reason=self.excluded_reason,
        )


class OverheadListener(Protocol):
    """Told of a StepTimer's overhead blocks (e.g. to record them as run events)."""

    def overhead_started(self, kind: str) -> None:
        """An outermost overhead block of `kind` starts."""

    def overhead_ended(self, kind: str, seconds: float) -> None:
        """It ended after `seconds`."""


class StepTimer:
    """Measures step wall times between host syncs and charges overheads to the step paying them.

    Interface used by the trainer:
        timer.start()                        # before the first step's input/dispatch
        with timer.overhead("input"): batch = next(it)
        ...dispatch step N+1, then float(loss of step N)...
        timing = timer.end_step(N)           # right after the host sync on step N's loss
        with timer.overhead("checkpoint"): ...   # charged to the next end_step
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.perf_counter,
        excluded_kinds: tuple[str, ...] = EXCLUDED_KINDS,
    ):
        """Creates the timer.

        Args:
            clock: Monotonic time source in seconds (injectable for tests).
            excluded_kinds: Overhead kinds that exclude a step from averages.
        """
        self._clock = clock
        self._excluded_kinds = tuple(excluded_kinds)
        self._interval_start: Optional[float] = None
        self._overheads: dict[str, float] = {}
        self._depth = 0
        self._last_step: Optional[int] = None
        self._listeners: list[OverheadListener] = []

    def add_listener(self, listener: OverheadListener) -> None:
        """Tells `listener` when each outermost overhead block starts and ends.

        Args:
            listener: Has `overhead_started(kind)` and `overhead_ended(kind, seconds)`.
        """
        self._listeners.append(listener)

    @property
    def started(self) -> bool:
        """Whether `start` was called."""
        return self._interval_start is not None

    def start(self) -> None:
        """Opens the first interval (or restarts timing, dropping pending overheads)."""
        if self._depth:
            raise StepTimerError("StepTimer.start() called inside an overhead block")
        self._interval_start = self._clock()
        self._overheads = {}

    @contextlib.contextmanager
    def overhead(self, kind: str) -> Iterator[None]:
        """Measures the block's host time as overhead `kind` of the current interval.

        Nested blocks count once: only the outermost block's time is recorded.

        Args:
            kind: E.g. one of `OVERHEAD_KINDS`.

        Yields:
            None.
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._depth = 1
        for listener in self._listeners:
            listener.overhead_started(kind)
        begin = self._clock()
        try:
            yield
        finally:
            self._depth = 0
            seconds = self._clock() - begin
            self.add_overhead(kind, seconds)
            for listener in self._listeners:
                listener.overhead_ended(kind, seconds)

    def add_overhead(self, kind: str, seconds: float) -> None:
        """Adds `seconds` of overhead `kind` (measured elsewhere) to the current interval.

        Args:
            kind: The overhead kind.
            seconds: Non-negative seconds.

        Raises:
            ValueError: If `seconds` is negative.
        """
        if seconds < 0:
            raise ValueError(f"StepTimer.add_overhead: negative time {seconds} for {kind!r}")
        self._overheads[kind] = self._overheads.get(kind, 0.0) + float(seconds)

    def pending_overheads(self) -> dict[str, float]:
        """Overheads recorded so far in the open interval."""
        return dict(self._overheads)

    def end_step(self, step: int) -> StepTiming:
        """Closes the current interval as `step`'s time and opens the next one.

        Call right after the host sync on `step`'s loss.

        Args:
            step: The step number (strictly increasing across calls).

        Returns:
            The step's `StepTiming`.

        Raises:
            StepTimerError: If not started, inside an overhead block, or `step` does not increase.
        """
        if self._interval_start is None:
            raise StepTimerError("StepTimer.end_step() called before start()")
        if self._depth:
            raise StepTimerError(f"StepTimer.end_step({step}) called inside an overhead block")
        if self._last_step is not None and step <= self._last_step:
            raise StepTimerError(
                f"StepTimer.end_step({step}): steps must increase (last was {self._last_step})"
            )
        now = self._clock()
        wall = now - self._interval_start
        overheads = self._overheads
        reason = next((k for k in self._excluded_kinds if overheads.get(k, 0.0) > 0), None)
        timing = StepTiming(step=step, wall_s=wall, overheads=overheads, excluded_reason=reason)
        self._interval_start = now
        self._overheads = {}
        self._last_step = step
        return timing
