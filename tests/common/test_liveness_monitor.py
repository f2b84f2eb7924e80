"""Tests axlearn/common/liveness_monitor.py on event files written by TensorBoard's writer."""

import io
import os
from unittest import mock

import pytest
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from axlearn.common.liveness_monitor import TfSummaryMonitor


def _records(*wall_times: float) -> bytes:
    """TFRecord bytes of Events with these wall times, framed by TensorBoard's RecordWriter."""
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    for t in wall_times:
        writer.write(event_pb2.Event(wall_time=t, step=1).SerializeToString())
    return buffer.getvalue()


def _append(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)


def _monitor(summary_dir, timeout=10.0, start=5.0) -> TfSummaryMonitor:
    cfg = TfSummaryMonitor.default_config().set(
        summary_dir=str(summary_dir), max_timeout_seconds=timeout, max_start_seconds=start
    )
    return cfg.instantiate()


def _at(t: float):
    return mock.patch("time.time", mock.MagicMock(return_value=t))


def test_grace_period_then_timeout(tmp_path):
    monitor = _monitor(tmp_path, timeout=10, start=30)
    assert not monitor.started()
    with pytest.raises(RuntimeError, match="reset"):
        monitor.ping()
    with _at(1000.0):
        monitor.reset()
    assert monitor.started()
    with _at(1025.0):
        assert monitor.ping()  # Past the timeout, within the grace period.
    with _at(1030.0):
        assert monitor.ping()
    with _at(1030.5):
        assert not monitor.ping()  # Both over.


def test_the_newest_event_at_any_depth_is_the_heartbeat(tmp_path):
    monitor = _monitor(tmp_path, timeout=10, start=0)
    with _at(1000.0):
        monitor.reset()
    _append(str(tmp_path / "train_train" / "events.out.tfevents.1.host"), _records(990.0, 1020.0))
    _append(str(tmp_path / "a" / "b" / "events.out.tfevents.2.host"), _records(1015.0))
    _append(str(tmp_path / "a" / "notes.txt"), b"not an event file")
    with _at(1030.0):
        assert monitor.ping()
    assert monitor._latest == 1020.0
    with _at(1030.5):
        assert not monitor.ping()
    # A new event (in a file seen before) revives it.
    _append(str(tmp_path / "a" / "b" / "events.out.tfevents.2.host"), _records(1040.0))
    with _at(1045.0):
        assert monitor.ping()
    assert monitor._latest == 1040.0


def test_a_record_being_written_is_read_when_complete(tmp_path):
    path = str(tmp_path / "run" / "events.out.tfevents.3.host")
    data = _records(1001.0, 1050.0)
    half = len(_records(1001.0)) + 7  # The first record and part of the second's header.
    monitor = _monitor(tmp_path, timeout=10, start=0)
    with _at(1000.0):
        monitor.reset()
    _append(path, data[:half])
    with _at(1005.0):
        assert monitor.ping()
    assert monitor._latest == 1001.0
    _append(path, data[half:-2])  # All but the last CRC bytes.
    with _at(1005.0):
        monitor.ping()
    assert monitor._latest == 1001.0
    _append(path, data[-2:])
    with _at(1055.0):
        assert monitor.ping()
    assert monitor._latest == 1050.0


def test_events_before_reset_do_not_count(tmp_path):
    _append(str(tmp_path / "events.out.tfevents.4.host"), _records(900.0))
    monitor = _monitor(tmp_path, timeout=10, start=0)
    with _at(1000.0):
        monitor.reset()
        assert monitor.ping()
    assert monitor._latest == 1000.0


def test_missing_dir_and_linked_files_are_not_heartbeats(tmp_path):
    monitor = _monitor(tmp_path / "absent", timeout=10, start=0)
    with _at(1000.0):
        monitor.reset()
    with _at(1020.0):
        assert not monitor.ping()  # A warning, no crash.

    outside = tmp_path / "outside"
    _append(str(outside / "events.out.tfevents.5.host"), _records(1019.0))
    watched = tmp_path / "watched"
    os.makedirs(watched)
    os.symlink(outside / "events.out.tfevents.5.host", watched / "events.out.tfevents.5.host")
    os.symlink(outside, watched / "linked_dir")
    monitor = _monitor(watched, timeout=10, start=0)
    with _at(1000.0):
        monitor.reset()
    with _at(1020.0):
        assert not monitor.ping()  # Links (to files or dirs) are not followed.


def test_a_corrupt_file_is_skipped(tmp_path):
    _append(str(tmp_path / "events.out.tfevents.6.host"), b"\xff" * 64)
    _append(str(tmp_path / "x" / "events.out.tfevents.7.host"), _records(1009.0))
    monitor = _monitor(tmp_path, timeout=10, start=0)
    with _at(1000.0):
        monitor.reset()
    with _at(1015.0):
        assert monitor.ping()


@pytest.mark.parametrize("field,value", [("max_timeout_seconds", 0), ("max_start_seconds", -1.0)])
def test_bad_config_names_the_field(tmp_path, field, value):
    cfg = TfSummaryMonitor.default_config().set(
        summary_dir=str(tmp_path), max_timeout_seconds=10, max_start_seconds=1
    )
    cfg.set(**{field: value})
    with pytest.raises(ValueError, match=f"TfSummaryMonitor.{field}"):
        cfg.instantiate()
