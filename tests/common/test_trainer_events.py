"""Tests axlearn/common/trainer_events.py: the step timer's blocks become run events."""

import json
import os

import pytest

from axlearn.common import measurement, measurement_local
from axlearn.common.step_timer import StepTimer
from axlearn.common.trainer_events import TrainerEvents


@pytest.fixture
def recorder(tmp_path):
    cfg = measurement_local.LocalRecorder.default_config().set(
        name="t", dir=str(tmp_path), file_label="p"
    )
    measurement.global_recorder = cfg.instantiate()
    yield os.path.join(str(tmp_path), "p.jsonl")
    measurement.global_recorder = None


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_events_from_the_timer(recorder):
    clock = _Clock()
    timer = StepTimer(clock=clock)
    events = TrainerEvents()
    timer.add_listener(events)
    timer.start()
    with timer.overhead("input"):
        clock.t += 0.25
    events.step_started(1)
    with timer.overhead("checkpoint"):
        with timer.overhead("input"):  # Nested: counted once, as the outer kind.
            clock.t += 1.0
    with timer.overhead("summary"):  # Neither badput nor input: no event.
        clock.t += 0.5
    with timer.overhead("input"):
        clock.t += 0.125
    with timer.overhead("input"):
        clock.t += 0.125
    events.step_started(2)
    with events.span(measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type="eval"):
        pass
    with open(recorder, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [(e["event"], e.get("step"), e.get("input_s")) for e in lines] == [
        ("START_STEP", 1, 0.25),
        ("START_CUSTOM_BADPUT_EVENT", None, None),
        ("END_CUSTOM_BADPUT_EVENT", None, None),
        ("START_STEP", 2, 0.25),
        ("START_CUSTOM_BADPUT_EVENT", None, None),
        ("END_CUSTOM_BADPUT_EVENT", None, None),
    ]
    assert [e.get("custom_badput_event_type") for e in lines if "CUSTOM" in e["event"]] == [
        "checkpoint",
        "checkpoint",
        "eval",
        "eval",
    ]


def test_no_recorder_records_nothing():
    events = TrainerEvents()
    events.overhead_started("checkpoint")
    events.overhead_ended("checkpoint", 1.0)
    events.step_started(1)  # No global recorder: no-op.
