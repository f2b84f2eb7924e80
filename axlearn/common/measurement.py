"""Run measurement (AXLearn's names): one global recorder per process, chosen by flags.

    from axlearn.common import measurement

    measurement.define_flags()          # --recorder_type, --recorder_spec
    ...                                 # flags parsed
    measurement.initialize(flags.FLAGS)  # builds the recorder; no-op without --recorder_type
    measurement.record_event(measurement.Event.START_JOB)

`--recorder_type` is a registered name (`local`: the built-in recorder of
`axlearn.common.measurement_local`, which appends events to `<trainer_dir>/events/`) or
`module:name`, which imports `module` first so that it can register `name`. Without a recorder,
`record_event` does nothing. `axlearn goodput TRAINER_DIR` reads what the local recorder wrote.

`defer_events()` holds the events recorded from then on in memory, with their times, until
`flush_deferred_events()` records them: `launch_trainer_main` defers from START_JOB until the run
holds its trainer dir's lock and its trainer is built, so a run refused by the lock (a second
trainer on a live dir) or rejected for its config writes nothing into the live run's events.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterator
from typing import Any, Optional

from absl import flags, logging

from axlearn.common import measurement_local  # noqa: F401  (registers "local")
from axlearn.common.measurement_base import (
    SPAN_EVENTS,
    Event,
    EventType,
    Recorder,
    _recorders,
    define_flags,
    register_recorder,
)

__all__ = [
    "Event",
    "EventType",
    "Recorder",
    "define_flags",
    "register_recorder",
    "global_recorder",
    "initialize",
    "record_event",
    "record_span",
    "start_monitoring",
    "defer_events",
    "flush_deferred_events",
]

# The recorder of this process; None until `initialize` builds one.
global_recorder: Optional[Recorder] = None
# Events held by `defer_events` (event, args, kwargs with their `time`); None: not deferring.
_deferred: Optional[list[tuple[Event, tuple, dict]]] = None


def defer_events() -> None:
    """Holds the events recorded from now on (with their times) until they are flushed.

    No-op without a recorder. The held events are lost if the process exits first, which is the
    point: a run that is refused writes nothing.
    """
    global _deferred
    if global_recorder is not None and _deferred is None:
        _deferred = []


def flush_deferred_events() -> int:
    """Records the held events in order, with the times they happened, and stops deferring.

    Returns:
        How many events were recorded (0 when none was held).
    """
    global _deferred
    held, _deferred = _deferred, None
    for event, args, kwargs in held or []:
        global_recorder.record(event, *args, **kwargs)
    return len(held or [])


def initialize(fv: flags.FlagValues) -> None:
    """Builds the global recorder from `--recorder_type` (no-op if unset or already built).

    Args:
        fv: The parsed flags (with `define_flags`' flags).

    Raises:
        ValueError: If `--recorder_type` names no registered recorder (the message lists them).
    """
    global global_recorder
    if not fv.recorder_type:
        logging.info("No --recorder_type: the run's events are not recorded.")
        return
    if global_recorder is not None:
        logging.warning("A recorder (%s) is already initialized; keeping it.", global_recorder)
        return
    module, _, name = fv.recorder_type.rpartition(":")
    if module:
        importlib.import_module(module)
    recorder_class = _recorders.get(name)
    if recorder_class is None:
        raise ValueError(
            f"--recorder_type={fv.recorder_type}: unknown recorder {name!r}. Registered: "
            f"{sorted(_recorders)}; or pass module:name to import the module that registers it."
        )
    global_recorder = recorder_class.from_flags(fv=fv)
    logging.info("Recording the run's events with %s.", global_recorder)


def record_event(event: Event, *args: Any, **kwargs: Any) -> None:
    """Records an instantaneous event with the global recorder (no-op without one).

    Args:
        event: The event.
        *args: Positional details (START_STEP: the step).
        **kwargs: Named details.
    """
    if global_recorder is None:
        return
    if _deferred is not None:
        _deferred.append((event, args, dict(kwargs, time=time.time())))
        return
    global_recorder.record(event, *args, **kwargs)


@contextlib.contextmanager
def record_span(event: EventType, *args: Any, **kwargs: Any) -> Iterator[None]:
    """Records the start and end of a span with the global recorder (no-op without one).

    Args:
        event: The span type.
        *args: Positional details.
        **kwargs: Named details (e.g. `custom_badput_event_type="checkpoint"`).

    Yields:
        Nothing.
    """
    if global_recorder is None:
        yield
        return
    if _deferred is not None:
        start, end = SPAN_EVENTS[event]
        record_event(start, *args, **kwargs)
        try:
            yield
        finally:
            if end is not None:
                record_event(end, *args, **kwargs)
        return
    with global_recorder.record_event(event, *args, **kwargs):
        yield


def start_monitoring() -> None:
    """Starts the global recorder's background monitoring (no-op without a recorder)."""
    if global_recorder is not None:
        global_recorder.start_monitoring()
