"""Tests axlearn/common/goodput.py on synthetic event files with known intervals."""

import json
import os

import pytest

from axlearn.common import goodput


def _write(path, events, *, tail=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
        f.write(tail)


def _process_events(attempt_offset=0.0):
    ev = []
    # Attempt 1: steps 1-10 at 1010..1019; input 0.1 s before each step; a checkpoint at step 5.
    ev.append(dict(event="START_JOB", time=1001.0, process_start=1000.5, attempt=1))
    for s in range(1, 11):
        ev.append(dict(event="START_STEP", time=1010.0 + s - 1, step=s, input_s=0.1, attempt=1))
        if s == 5:
            ev.append(
                dict(
                    event="START_CUSTOM_BADPUT_EVENT",
                    time=1014.2,
                    attempt=1,
                    custom_badput_event_type="checkpoint",
                )
            )
            ev.append(
                dict(
                    event="END_CUSTOM_BADPUT_EVENT",
                    time=1014.7,
                    attempt=1,
                    custom_badput_event_type="checkpoint",
                )
            )
    # Attempt 2: resumes from step 8; steps 9-12 at 1030..1033; an eval after step 12.
    ev.append(dict(event="START_JOB", time=1026.0, process_start=1025.5, attempt=2))
    for i, s in enumerate(range(9, 13)):
        ev.append(dict(event="START_STEP", time=1030.0 + i, step=s, input_s=0.1, attempt=2))
    ev.append(
        dict(
            event="START_CUSTOM_BADPUT_EVENT",
            time=1033.5,
            attempt=2,
            custom_badput_event_type="eval",
        )
    )
    ev.append(
        dict(
            event="END_CUSTOM_BADPUT_EVENT", time=1034.0, attempt=2, custom_badput_event_type="eval"
        )
    )
    ev.append(dict(event="END_JOB", time=1039.5, attempt=2))
    return ev


_LAUNCHER = [
    dict(event="ATTEMPT_START", time=1000.0, attempt=1),
    dict(
        event="ATTEMPT_END",
        time=1022.0,
        attempt=1,
        status="failed",
        cause="process 1 was killed by SIGKILL (exit code 137)",
    ),
    dict(event="ATTEMPT_START", time=1025.0, attempt=2),
    dict(event="ATTEMPT_END", time=1040.0, attempt=2, status="ok"),
]


def test_known_intervals(tmp_path):
    d = str(tmp_path)
    _write(os.path.join(d, "events", "process_0.jsonl"), _process_events())
    # Process 1: a damaged file (unknown event, torn last line) is read with warnings.
    _write(
        os.path.join(d, "events", "process_1.jsonl"),
        [dict(event="SOMETHING_NEW", time=1.0)] + _process_events(),
        tail='{"event": "START_STEP", "ti',
    )
    _write(os.path.join(d, "events", "launcher.jsonl"), _LAUNCHER)
    report = goodput.compute_goodput(d)
    # Hand computation (see the event times above).
    expected = dict(
        productive=6.7 + 9.2,  # Steps 1-8: 8 x 1 s - 8 x 0.1 input - 0.5 checkpoint; 9-12.
        redone=0.9 + 3.0,  # Steps 9 (1 s - 0.1 input) and 10 (1019 until the kill at 1022).
        startup=10.0 + 5.0,
        checkpoint=0.5,
        eval=0.5,
        input=0.9 + 0.3,
        other_badput=0.0,
        idle=3.0,
    )
    assert report.wall_s == pytest.approx(40.0)
    for k, v in expected.items():
        assert report.parts[k] == pytest.approx(v), k
    assert sum(report.parts.values()) == pytest.approx(report.wall_s, rel=0.01)
    assert report.goodput == pytest.approx(15.9 / 40)
    assert [a.status for a in report.attempts] == ["failed", "ok"]
    failed = report.failed_attempts[0]
    assert failed.committed_step == 8 and failed.redone_steps == 2
    assert failed.cause.startswith("process 1 was killed by SIGKILL")
    assert report.num_processes == 2
    assert len(report.warnings) == 2
    assert all("process_1.jsonl" in w for w in report.warnings)
    assert any("torn last line" in w for w in report.warnings)
    assert any("SOMETHING_NEW" in w for w in report.warnings)
    text = goodput.format_goodput(report)
    assert "39.8%" in text and "re-done steps" in text and "killed by SIGKILL" in text
    as_json = json.loads(json.dumps(report.to_dict()))
    assert as_json["num_failed_attempts"] == 1
    assert as_json["parts_sum_s"] == pytest.approx(40.0)


def test_without_launcher_file(tmp_path):
    d = str(tmp_path)
    _write(os.path.join(d, "events", "process_0.jsonl"), _process_events())
    report = goodput.compute_goodput(d)
    # Attempts run from each process's start to its last event.
    assert report.wall_s == pytest.approx(1039.5 - 1000.5)
    assert sum(report.parts.values()) == pytest.approx(report.wall_s)
    assert [a.status for a in report.attempts] == ["failed", "ok"]
    assert report.parts["idle"] == pytest.approx(1025.5 - 1019.0)
    assert report.attempts[0].redone_steps == 2


def test_no_events(tmp_path):
    with pytest.raises(goodput.NoEventsError, match="has no event files"):
        goodput.compute_goodput(str(tmp_path))


def test_span_open_at_a_failure_is_redone(tmp_path):
    d = str(tmp_path)
    events = _process_events()
    # Attempt 1 dies inside a save that started at 1019.5 (step 10's interval).
    events.insert(
        events.index(next(e for e in events if e.get("step") == 10)) + 1,
        dict(event="START_CUSTOM_BADPUT_EVENT", time=1019.5, attempt=1,
             custom_badput_event_type="checkpoint"),
    )  # fmt: skip
    _write(os.path.join(d, "events", "process_0.jsonl"), events)
    _write(os.path.join(d, "events", "launcher.jsonl"), _LAUNCHER)
    report = goodput.compute_goodput(d)
    assert report.parts["checkpoint"] == pytest.approx(0.5)  # Only the completed save.
    assert report.parts["redone"] == pytest.approx(3.9)
    assert sum(report.parts.values()) == pytest.approx(40.0)


def test_stopping_after_a_failure_is_idle(tmp_path):
    d = str(tmp_path)
    launcher = [dict(e) for e in _LAUNCHER]
    launcher[1]["failed_at"] = 1021.0  # Seen at 1021; the other process stopped by 1022.
    _write(os.path.join(d, "events", "process_0.jsonl"), _process_events())
    _write(os.path.join(d, "events", "launcher.jsonl"), launcher)
    report = goodput.compute_goodput(d)
    assert report.wall_s == pytest.approx(40.0)
    assert report.parts["idle"] == pytest.approx(3.0 + 1.0)
    assert report.parts["redone"] == pytest.approx(3.9 - 1.0)
    assert sum(report.parts.values()) == pytest.approx(40.0)
