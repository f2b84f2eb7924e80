"""The trainer's profiler: a part that `SpmdTrainer` owns (see docs/trainer.md).

At each of `start_steps` a 3-step `jax.profiler` trace starts on the processes in
`process_indices` (written under `trace_dir`); the trainer charges starting and stopping it to
the step as the `profiler` overhead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Callable, Literal, Union

import jax
from absl import logging

# The number of steps a trace covers.
TRACE_STEPS = 3


class Profiler:
    """Starts and stops `jax.profiler` traces at configured steps.

    Interface: `before_step(step, ...)` (before step `step` is dispatched) and `stop()`.
    """

    def __init__(
        self,
        *,
        start_steps: Sequence[int],
        process_indices: Union[Literal["all"], Sequence[int]],
        trace_dir: str,
        log: Callable[..., None],
    ):
        """Builds a profiler (nothing is traced until `before_step`).

        Args:
            start_steps: The steps at which a trace starts.
            process_indices: The processes that trace: a list of process indices or "all".
            trace_dir: Where the traces are written.
            log: Logs a message (the trainer's step log: `log(msg, *args)`).
        """
        self._start_steps = set(start_steps)
        self._process_indices = process_indices
        self._trace_dir = trace_dir
        self._log = log
        self._tracing = False
        self._stop_step = None

    def _traces_here(self) -> bool:
        indices = self._process_indices
        return indices == "all" or jax.process_index() in indices

    def before_step(
        self,
        step: int,
        *,
        in_flight: Any,
        overhead: Callable[[], contextlib.AbstractContextManager],
    ) -> None:
        """Stops a trace that covered its steps and starts one configured for `step`.

        Args:
            step: The step about to be dispatched.
            in_flight: A device value of the step in flight (waited for before a trace stops,
                so the trace holds that step whole), or None.
            overhead: Returns the context in which profiler work is timed (the step's
                `profiler` overhead).
        """
        if self._stop_step is not None and step >= self._stop_step:
            with overhead():
                if in_flight is not None:
                    jax.block_until_ready(in_flight)
                self.stop()
        if step in self._start_steps and self._traces_here():
            if self._stop_step is not None:
                logging.warning("Not tracing at step %d: a trace is still running.", step)
                return
            with overhead():
                jax.profiler.start_trace(self._trace_dir)
                self._tracing = True
            self._log("Started profiler trace for steps %d-%d.", step, step + TRACE_STEPS - 1)
            self._stop_step = step + TRACE_STEPS

    def stop(self) -> None:
        """Stops the running trace, if any."""
        self._stop_step = None
        if self._tracing:
            jax.profiler.stop_trace()
            self._tracing = False
            self._log("Stopped profiler trace.")
