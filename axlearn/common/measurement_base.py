"""The vocabulary of run measurement: events, the recorder interface and its registry.

A recorder receives the events of one process of a run (job start and end, accelerator
initialization, training preparation, data loading, each step, custom badput such as checkpoint
blocking and evaluation) and stores or sends them. Recorders are registered by name with
`register_recorder` and picked at start with `--recorder_type` (see `axlearn.common.measurement`).

This module imports neither jax nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from typing import Any, Optional, TypeVar

from absl import flags

from axlearn.common.config import REQUIRED, Configurable, Required, config_class


class Event(enum.Enum):
    """An instantaneous event of a run, recorded with `Recorder.record`.

    Attributes:
        START_JOB: The process started the job (recorded once per process and attempt).
        END_JOB: The process finished the job normally.
        START_STEP: A training step starts; recorded with the step number.
        START_ACCELERATOR_INIT: Accelerator (device, distributed runtime) set-up starts.
        END_ACCELERATOR_INIT: ... ends.
        START_TRAINING_PREPARATION: Restore or initialization of the state starts.
        END_TRAINING_PREPARATION: ... ends.
        START_DATA_LOADING: Creating the input pipeline starts.
        END_DATA_LOADING: ... ends.
        START_CUSTOM_BADPUT_EVENT: Time that does not train starts (checkpoint blocking,
            evaluation), recorded with `custom_badput_event_type`.
        END_CUSTOM_BADPUT_EVENT: ... ends.
    """

    START_JOB = "START_JOB"
    END_JOB = "END_JOB"
    START_STEP = "START_STEP"
    START_ACCELERATOR_INIT = "START_ACCELERATOR_INIT"
    END_ACCELERATOR_INIT = "END_ACCELERATOR_INIT"
    START_TRAINING_PREPARATION = "START_TRAINING_PREPARATION"
    END_TRAINING_PREPARATION = "END_TRAINING_PREPARATION"
    START_DATA_LOADING = "START_DATA_LOADING"
    END_DATA_LOADING = "END_DATA_LOADING"
    START_CUSTOM_BADPUT_EVENT = "START_CUSTOM_BADPUT_EVENT"
    END_CUSTOM_BADPUT_EVENT = "END_CUSTOM_BADPUT_EVENT"


class EventType(enum.Enum):
    """A span of a run (a start and an end), recorded with `Recorder.record_event`.

    Attributes:
        JOB: The whole job of a process.
        STEP: A training step (only its start is recorded).
        ACCELERATOR_INIT: Accelerator set-up.
        TRAINING_PREPARATION: Restore or initialization of the state.
        DATA_LOADING: Creating the input pipeline.
        CUSTOM_BADPUT_EVENT: Time that does not train (checkpoint blocking, evaluation).
    """

    JOB = "job"
    STEP = "step"
    ACCELERATOR_INIT = "accelerator_init"
    TRAINING_PREPARATION = "training_preparation"
    DATA_LOADING = "data_loading"
    CUSTOM_BADPUT_EVENT = "custom_badput_event"


# The (start, end) events of each span type.
SPAN_EVENTS: dict[EventType, tuple[Event, Optional[Event]]] = {
    EventType.JOB: (Event.START_JOB, Event.END_JOB),
    EventType.STEP: (Event.START_STEP, None),
    EventType.ACCELERATOR_INIT: (Event.START_ACCELERATOR_INIT, Event.END_ACCELERATOR_INIT),
    EventType.TRAINING_PREPARATION: (
        Event.START_TRAINING_PREPARATION,
        Event.END_TRAINING_PREPARATION,
    ),
    EventType.DATA_LOADING: (Event.START_DATA_LOADING, Event.END_DATA_LOADING),
    EventType.CUSTOM_BADPUT_EVENT: (
        Event.START_CUSTOM_BADPUT_EVENT,
        Event.END_CUSTOM_BADPUT_EVENT,
    ),
}


class Recorder(Configurable):
    """Receives the events of one process of a run."""

    @config_class
    class Config(Configurable.Config):
        """Configures Recorder."""

        # The recorder's name (e.g. the run's name), for its logs.
        name: Required[str] = REQUIRED

    @classmethod
    def from_flags(cls, fv: Optional[flags.FlagValues]) -> Recorder:
        """Builds the recorder from `--recorder_spec` (and other flags it documents).

        Args:
            fv: The parsed flags.

        Returns:
            The recorder.
        """
        raise NotImplementedError(f"{cls.__name__}.from_flags")

    def record(self, event: Event, *args: Any, **kwargs: Any) -> None:
        """Records one instantaneous event.

        Args:
            event: The event.
            *args: Positional details (START_STEP: the step number).
            **kwargs: Named details (e.g. `custom_badput_event_type`).
        """
        raise NotImplementedError(f"{type(self).__name__}.record")

    def start_monitoring(self, **kwargs: Any) -> None:
        """Starts background computation or upload of metrics (no-op unless overridden).

        Args:
            **kwargs: Recorder-specific options.
        """
        del kwargs

    @contextlib.contextmanager
    def record_event(self, event: EventType, *args: Any, **kwargs: Any) -> Iterator[None]:
        """Records the start and the end of a span around the `with` body.

        Args:
            event: The span type; STEP records only its start.
            *args: Positional details, passed to both events.
            **kwargs: Named details, passed to both events.

        Yields:
            Nothing; the end is recorded even if the body raises.
        """
        start, end = SPAN_EVENTS[event]
        self.record(start, *args, **kwargs)
        try:
            yield
        finally:
            if end is not None:
                self.record(end, *args, **kwargs)

    @contextlib.contextmanager
    def maybe_monitor_all(self) -> Iterator[None]:
        """Monitors the run within the `with` body (no-op unless overridden).

        Yields:
            Nothing.
        """
        yield


# Recorder classes by registered name.
_recorders: dict[str, type] = {}
_T = TypeVar("_T")


def register_recorder(name: str):
    """Returns a class decorator that registers a recorder class under `name`.

    Args:
        name: The name `--recorder_type` selects it by.

    Returns:
        The decorator; it returns the class unchanged.

    Raises:
        ValueError: (from the decorator) If `name` is already registered.
    """

    def fn(cls: _T) -> _T:
        if name in _recorders:
            raise ValueError(
                f"Recorder {name} is already registered (by {_recorders[name]}); pick another name."
            )
        _recorders[name] = cls
        return cls

    return fn


def define_flags(**kwargs: Any) -> None:
    """Defines `--recorder_type` and `--recorder_spec`.

    Args:
        **kwargs: Passed to `flags.DEFINE_*` (e.g. `flag_values=`, or `default=` is not
            accepted: set a default with `flag_values.set_default`).
    """
    flags.DEFINE_string(
        "recorder_type",
        None,
        "The recorder of the run's events: a registered name (e.g. local) or module:name to "
        "import the module that registers it. Empty: record nothing.",
        **kwargs,
    )
    flags.DEFINE_multi_string(
        "recorder_spec",
        [],
        "key=value settings of the recorder (repeatable); see its from_flags docstring.",
        **kwargs,
    )
