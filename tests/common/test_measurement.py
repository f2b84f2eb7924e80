"""Tests axlearn/common/measurement.py and the local recorder (measurement_local.py)."""

import json
import os

import pytest
from absl import flags

from axlearn.common import measurement, measurement_base, measurement_local


@pytest.fixture(autouse=True)
def _restore_globals():
    recorders = dict(measurement_base._recorders)
    measurement.global_recorder = None
    yield
    measurement.global_recorder = None
    measurement_base._recorders.clear()
    measurement_base._recorders.update(recorders)


def _flags(**values) -> flags.FlagValues:
    fv = flags.FlagValues()
    measurement.define_flags(flag_values=fv)
    flags.DEFINE_string("trainer_dir", None, "", flag_values=fv)
    for k, v in values.items():
        fv.set_default(k, v)
    fv.mark_as_parsed()
    return fv


def test_register_twice_fails():
    @measurement.register_recorder("test_dummy")
    class Dummy(measurement.Recorder):
        pass

    assert measurement_base._recorders["test_dummy"] is Dummy
    with pytest.raises(ValueError, match="already registered"):
        measurement.register_recorder("test_dummy")(Dummy)


def test_no_recorder_type_is_a_no_op():
    measurement.initialize(_flags())
    assert measurement.global_recorder is None
    measurement.record_event(measurement.Event.START_JOB)  # Nothing to record to.


def test_unknown_recorder_type():
    with pytest.raises(ValueError, match="unknown recorder 'nope'.*local"):
        measurement.initialize(_flags(recorder_type="nope"))


def test_module_colon_name():
    measurement.initialize(
        _flags(recorder_type="axlearn.common.measurement_local:local", trainer_dir="/tmp/x")
    )
    assert isinstance(measurement.global_recorder, measurement_local.LocalRecorder)


def test_local_recorder_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("PROCESS_ID", "3")
    monkeypatch.setenv(measurement_local.ATTEMPT_ENV, "2")
    measurement.initialize(_flags(recorder_type="local", trainer_dir=str(tmp_path)))
    measurement.record_event(measurement.Event.START_JOB)
    measurement.record_event(measurement.Event.START_STEP, 7, input_s=0.25)
    with measurement.record_span(
        measurement.EventType.CUSTOM_BADPUT_EVENT, custom_badput_event_type="checkpoint"
    ):
        pass
    path = os.path.join(str(tmp_path), "events", "process_3.jsonl")
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [e["event"] for e in lines] == [
        "START_JOB",
        "START_STEP",
        "START_CUSTOM_BADPUT_EVENT",
        "END_CUSTOM_BADPUT_EVENT",
    ]
    assert lines[1]["step"] == 7 and lines[1]["input_s"] == 0.25
    assert all(e["attempt"] == 2 and e["pid"] == os.getpid() for e in lines)
    assert lines[2]["custom_badput_event_type"] == "checkpoint"
    # The process started before its first event (from /proc on Linux).
    assert lines[0]["process_start"] <= lines[0]["time"]


def test_next_attempt_starts_on_a_fresh_line(tmp_path):
    d = str(tmp_path)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "p.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"event": "START_JOB", "time": 1.0}\n{"event": "START_ST')  # Torn by a crash.
    rec = measurement_local.LocalRecorder.default_config().set(name="t", dir=d, file_label="p")
    rec = rec.instantiate()
    rec.record(measurement.Event.START_JOB)
    rec.close()
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[1] == '{"event": "START_ST'
    assert json.loads(lines[2])["event"] == "START_JOB"


def test_spec_errors():
    with pytest.raises(ValueError, match="--recorder_spec=bad"):
        measurement.initialize(_flags(recorder_type="local", recorder_spec=["bad"]))
    with pytest.raises(ValueError, match="needs --trainer_dir"):
        measurement.initialize(_flags(recorder_type="local"))
    with pytest.raises(ValueError, match="not gs://b/run/events .*--recorder_spec=dir="):
        measurement.initialize(_flags(recorder_type="local", trainer_dir="gs://b/run"))


def test_process_label(monkeypatch):
    for var in ("PROCESS_ID", "TPU_WORKER_ID", "NUM_PROCESSES"):
        monkeypatch.delenv(var, raising=False)
    assert measurement_local.process_label() == "process_0"
    monkeypatch.setenv("TPU_WORKER_ID", "5")
    assert measurement_local.process_label() == "process_5"
    monkeypatch.delenv("TPU_WORKER_ID")
    monkeypatch.setenv("NUM_PROCESSES", "4")
    assert measurement_local.process_label().startswith("host_")


def test_linked_events_dir_or_file_is_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinel = outside / "process_0.jsonl"
    sentinel.write_bytes(b"sentinel\n")
    before = (sentinel.read_bytes(), sentinel.stat().st_mtime_ns)
    run = tmp_path / "run"
    run.mkdir()
    (run / "events").symlink_to(outside)  # A linked events/ directory.
    rec = measurement_local.LocalRecorder.default_config().set(
        name="t", dir=str(run / "events"), file_label="process_0"
    ).instantiate()
    with pytest.raises(OSError, match="link"):
        rec.record(measurement.Event.START_JOB)
    (run / "events").unlink()
    (run / "events").mkdir()
    (run / "events" / "process_0.jsonl").symlink_to(sentinel)  # A linked event file.
    with pytest.raises(OSError, match="link"):
        rec.record(measurement.Event.START_JOB)
    assert (sentinel.read_bytes(), sentinel.stat().st_mtime_ns) == before
