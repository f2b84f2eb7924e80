"""The trainer's run events (a part of SpmdTrainer): what `axlearn goodput` splits a run by.

`TrainerEvents` records, through the process's measurement recorder
(`axlearn.common.measurement.global_recorder`; nothing without one):
- TRAINING_PREPARATION around restore or initialization, DATA_LOADING around creating the
  input iterator;
- START_STEP for each step as it is dispatched, with `input_s`: the seconds spent waiting for
  that step's batch (measured by the step timer's `input` overhead);
- CUSTOM_BADPUT_EVENT spans of type `checkpoint` and `eval` around the step timer's overhead
  blocks of those kinds (checkpoint blocking, evaluation), and `checkpoint` around the end of the
  run's wait for the last save.

It listens to the step timer (`StepTimer.add_listener`), so the loop only says when a step
starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from axlearn.common import measurement

# Step timer overhead kinds recorded as custom badput, by badput type.
BADPUT_KINDS = ("checkpoint", "eval")


class TrainerEvents:
    """Records the trainer's events with the global measurement recorder."""

    def __init__(self):
        self._input_s = 0.0

    def overhead_started(self, kind: str) -> None:
        """Starts a custom badput span for checkpoint and eval blocks.

        Args:
            kind: The step timer's overhead kind.
        """
        if kind in BADPUT_KINDS:
            measurement.record_event(
                measurement.Event.START_CUSTOM_BADPUT_EVENT, custom_badput_event_type=kind
            )

    def overhead_ended(self, kind: str, seconds: float) -> None:
        """Ends the span, or adds input wait to the next step's `input_s`.

        Args:
            kind: The step timer's overhead kind.
            seconds: How long the block took.
        """
        if kind in BADPUT_KINDS:
            measurement.record_event(
                measurement.Event.END_CUSTOM_BADPUT_EVENT, custom_badput_event_type=kind
            )
        elif kind == "input":
            self._input_s += seconds

    def step_started(self, step: int) -> None:
        """Records START_STEP for `step` with the input wait since the previous step.

        Args:
            step: The step being dispatched.
        """
        measurement.record_event(
            measurement.Event.START_STEP, step, input_s=round(self._input_s, 6)
        )
        self._input_s = 0.0

    @contextlib.contextmanager
    def span(self, event: measurement.EventType, **kwargs) -> Iterator[None]:
        """Records a span (TRAINING_PREPARATION, DATA_LOADING, CUSTOM_BADPUT_EVENT).

        Args:
            event: The span type.
            **kwargs: Its details (e.g. `custom_badput_event_type`).

        Yields:
            Nothing.
        """
        with measurement.record_span(event, **kwargs):
            yield
