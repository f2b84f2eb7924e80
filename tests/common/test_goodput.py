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
        # Steps 1-8: 8 x 1 s - 8 x 0.1 input - 0.5 checkpoint; 9-12 (12 ends at END_JOB).
        productive=6.7 + 8.7,
        redone=0.9 + 3.0,  # Steps 9 (1 s - 0.1 input) and 10 (1019 until the kill at 1022).
        startup=10.0 + 5.0,
        checkpoint=0.5,
        eval=0.5,
        input=0.9 + 0.3,
        other_badput=0.0,
        idle=3.0,
    )
    # Attempt 2 ends at its END_JOB (1039.5), not at the launcher's end 0.5 s later.
    assert report.wall_s == pytest.approx(39.5)
    for k, v in expected.items():
        assert report.parts[k] == pytest.approx(v), k
    assert sum(report.parts.values()) == pytest.approx(report.wall_s, rel=0.01)
    assert report.goodput == pytest.approx(15.4 / 39.5)
    assert [a.status for a in report.attempts] == ["failed", "ok"]
    failed = report.failed_attempts[0]
    assert failed.committed_step == 8 and failed.redone_steps == 2
    assert failed.cause.startswith("process 1 was killed by SIGKILL")
    assert report.num_processes == 2
    assert len(report.warnings) == 2
    assert all("process_1.jsonl:" in w for w in report.warnings)
    assert any(w.endswith("process_1.jsonl:23: skipped a torn last line (the process died while "
                          "writing it)") for w in report.warnings)  # fmt: skip
    assert any(w.endswith("process_1.jsonl:1: skipped: unknown event name (field 'event')")
               for w in report.warnings)  # fmt: skip
    assert not any("SOMETHING_NEW" in w or "START_STEP" in w for w in report.warnings)
    text = goodput.format_goodput(report)
    assert "39.0%" in text and "re-done steps" in text and "killed by SIGKILL" in text
    as_json = json.loads(json.dumps(report.to_dict()))
    assert as_json["num_failed_attempts"] == 1
    assert as_json["parts_sum_s"] == pytest.approx(39.5)


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
    assert sum(report.parts.values()) == pytest.approx(39.5)


def test_stopping_after_a_failure_is_idle(tmp_path):
    d = str(tmp_path)
    launcher = [dict(e) for e in _LAUNCHER]
    launcher[1]["failed_at"] = 1021.0  # Seen at 1021; the other process stopped by 1022.
    _write(os.path.join(d, "events", "process_0.jsonl"), _process_events())
    _write(os.path.join(d, "events", "launcher.jsonl"), launcher)
    report = goodput.compute_goodput(d)
    assert report.wall_s == pytest.approx(39.5)
    assert report.parts["idle"] == pytest.approx(3.0 + 1.0)
    assert report.parts["redone"] == pytest.approx(3.9 - 1.0)
    assert sum(report.parts.values()) == pytest.approx(39.5)


def _launched(d, process_events, launcher_events):
    _write(os.path.join(d, "events", "process_0.jsonl"), process_events)
    if launcher_events is not None:
        _write(os.path.join(d, "events", "launcher.jsonl"), launcher_events)
    report = goodput.compute_goodput(d)
    goodput.check_invariants(report)
    assert all(v >= 0 for v in report.parts.values())
    assert sum(report.parts.values()) == pytest.approx(report.wall_s)
    assert 0 <= report.goodput <= 1
    return report


def test_silent_195_percent_out_of_order_start_step(tmp_path):
    """Silent: an attempt whose START_STEP times are out of order gave 195.0% goodput and
    -99.9 s of input wait; the out-of-order line is now reported by file:line and excluded."""
    events = [
        dict(event="START_JOB", time=1001.0, process_start=1000.5, attempt=1),
        dict(event="START_STEP", time=1004.9, step=1, input_s=0.0, attempt=1),
        dict(event="START_STEP", time=1099.95, step=2, input_s=0.0, attempt=1),
        dict(event="START_STEP", time=1000.05, step=3, input_s=0.0, attempt=1),  # Line 4.
        dict(event="END_JOB", time=1100.0, attempt=1),
    ]
    launcher = [
        dict(event="ATTEMPT_START", time=1000.0, attempt=1),
        dict(event="ATTEMPT_END", time=1100.0, attempt=1, status="ok"),
    ]
    report = _launched(str(tmp_path), events, launcher)
    # Steps 1 (1004.9 -> 1099.95) and 2 (-> END_JOB at 1100) of a 100 s wall.
    assert report.goodput == pytest.approx(0.951)
    assert report.parts["input"] == 0.0
    assert report.parts["startup"] == pytest.approx(4.9)
    assert len(report.warnings) == 1
    assert report.warnings[0].endswith(
        "events/process_0.jsonl:4: excluded: its time is 99.900 s before the previous event's "
        "(the clock stepped back, or lines out of order)"
    )


def test_out_of_order_step_number_is_excluded(tmp_path):
    events = [
        dict(event="START_JOB", time=1001.0),
        dict(event="START_STEP", time=1010.0, step=5),
        dict(event="START_STEP", time=1011.0, step=4),  # Line 3: not after step 5.
        dict(event="START_STEP", time=1012.0, step=6),
        dict(event="END_JOB", time=1013.0),
    ]
    report = _launched(str(tmp_path), events, None)
    assert (report.attempts[0].first_step, report.attempts[0].last_step) == (5, 6)
    assert report.parts["productive"] == pytest.approx(3.0)
    assert [w.split("process_0.jsonl:")[1][:2] for w in report.warnings] == ["3:"]
    assert "START_STEP of step 4 after step 5" in report.warnings[0]


def test_silent_negative_wall_time_when_the_clock_steps_back(tmp_path):
    """Silent: the clock stepping back made the wall time negative (-489.5 s)."""
    events = [
        dict(event="START_JOB", time=2000.0, process_start=1999.5),
        dict(event="START_STEP", time=2010.0, step=1),
        dict(event="START_STEP", time=1500.0, step=2),  # The clock stepped back 510 s.
        dict(event="END_JOB", time=1510.0),
    ]
    report = _launched(str(tmp_path), events, None)
    assert report.wall_s == pytest.approx(10.5)
    assert report.parts["startup"] == pytest.approx(10.5)
    lines = [w.split("process_0.jsonl:")[1].split(":")[0] for w in report.warnings]
    assert lines == ["3", "4"]
    assert all("the clock stepped back" in w for w in report.warnings)


def test_attempt_starting_before_the_previous_end_is_moved(tmp_path):
    events = [
        dict(event="START_JOB", time=1001.0, attempt=1),
        dict(event="START_STEP", time=1010.0, step=1, attempt=1),
        dict(event="START_JOB", time=1030.0, attempt=2),
        dict(event="START_STEP", time=1040.0, step=1, attempt=2),
        dict(event="END_JOB", time=1050.0, attempt=2),
    ]
    launcher = [
        dict(event="ATTEMPT_START", time=1000.0, attempt=1),
        dict(event="ATTEMPT_END", time=1020.0, attempt=1, status="failed", cause="x"),
        # The launcher's clock stepped back 5 s before attempt 2's start.
        dict(event="ATTEMPT_START", time=1015.0, attempt=2),
    ]
    # The launcher file's own order check drops line 3; attempt 2 then has no ATTEMPT_START
    # and starts at its first recorded event.
    report = _launched(str(tmp_path), events, launcher)
    assert report.wall_s == pytest.approx(50.0)
    assert any("launcher.jsonl:3: excluded" in w for w in report.warnings)


def test_silent_97_5_percent_launcher_end_after_the_last_event(tmp_path):
    """Silent: a launcher end 370 s after the attempt's END_JOB was counted as its last step
    (97.5% instead of 66.7%); it is now reported (launcher.jsonl:2) and not counted."""
    events = [
        dict(event="START_JOB", time=1001.0, attempt=1),
        dict(event="START_STEP", time=1010.0, step=1, attempt=1),
        dict(event="START_STEP", time=1020.0, step=2, attempt=1),
        dict(event="END_JOB", time=1030.0, attempt=1),
    ]
    launcher = [
        dict(event="ATTEMPT_START", time=1000.0, attempt=1),
        dict(event="ATTEMPT_END", time=1400.0, attempt=1, status="ok"),
    ]
    report = _launched(str(tmp_path), events, launcher)
    assert report.goodput == pytest.approx(2 / 3)
    assert report.wall_s == pytest.approx(30.0)
    assert len(report.warnings) == 1
    assert "launcher.jsonl:2: excluded: attempt 1's end is 370.0 s after its last event" in (
        report.warnings[0]
    )
    assert "process_0.jsonl:4" in report.warnings[0]


def test_silent_summary_and_goodput_agree(tmp_path):
    """Silent: on a real run the run summary said 1.0% and `axlearn goodput` 6.5%: the summary
    (written by the run before its END_JOB) and the command now make one computation."""
    d = str(tmp_path)
    events = [dict(event="START_JOB", time=1001.0, process_start=1000.5, attempt=1)]
    events += [
        dict(event="START_STEP", time=1200.0 + i, step=i + 1, input_s=0.0, attempt=1)
        for i in range(3)
    ]
    events += [
        dict(event="START_CUSTOM_BADPUT_EVENT", time=1203.0, attempt=1,
             custom_badput_event_type="checkpoint"),
        dict(event="END_CUSTOM_BADPUT_EVENT", time=1290.0, attempt=1,
             custom_badput_event_type="checkpoint"),
    ]  # fmt: skip
    _write(os.path.join(d, "events", "process_0.jsonl"), events)
    # The launcher writes an attempt's two lines when it ends: none yet.
    summary = goodput.goodput_summary(d)  # What run_summary.json holds.
    assert summary["goodput"] == pytest.approx(3.0 / 289.5)  # From the process's start.
    # The run returns, records END_JOB; the process takes 15.8 s to exit.
    events.append(dict(event="END_JOB", time=1290.2, attempt=1))
    launcher = [
        dict(event="ATTEMPT_START", time=1000.0, attempt=1),
        dict(event="ATTEMPT_END", time=1306.0, attempt=1, status="ok"),
    ]
    report = _launched(d, events, launcher)
    assert report.goodput == pytest.approx(3.2 / 290.2)
    assert abs(report.goodput - summary["goodput"]) < 0.01
    assert report.attempts[0].status == "ok"


def test_preempted_attempt_is_its_own_outcome(tmp_path):
    events = [
        dict(event="START_JOB", time=1001.0),
        dict(event="START_STEP", time=1010.0, step=1),
        dict(event="START_STEP", time=1011.0, step=2),
        dict(event="END_JOB", time=1015.0, outcome="preempted"),
        dict(event="START_JOB", time=1020.0),
        dict(event="START_STEP", time=1030.0, step=3),
        dict(event="END_JOB", time=1031.0),
    ]
    report = _launched(str(tmp_path), events, None)
    assert [a.status for a in report.attempts] == ["preempted", "ok"]
    assert report.attempts[0].committed_step == 2 and report.attempts[0].redone_steps == 0
    assert report.failed_attempts == []
    text = goodput.format_goodput(report)
    assert "0 failed, 1 preempted" in text and "preempted (saved its step" in text
    assert "ended without END_JOB" not in text


def test_running_attempt_missing_from_the_launcher_file_counts(tmp_path):
    # The launcher writes an attempt's lines when it ends: while attempt 2 runs, only attempt
    # 1's are there (and a segment without an attempt number is matched by time).
    events = [e for e in _process_events() if e["event"] != "END_JOB"]
    for e in events:
        if e.get("attempt") == 2:
            e.pop("attempt")
    report = _launched(str(tmp_path), events, _LAUNCHER[:2])
    assert [a.status for a in report.attempts] == ["failed", "unknown"]
    assert report.attempts[1].start == pytest.approx(1025.5)  # Its process's start.
    assert report.attempts[1].first_step == 9 and report.attempts[0].committed_step == 8


def _span(kind, t0, t1):
    return [
        dict(event="START_CUSTOM_BADPUT_EVENT", time=t0, custom_badput_event_type=kind),
        dict(event="END_CUSTOM_BADPUT_EVENT", time=t1, custom_badput_event_type=kind),
    ]


def test_productive_parts_split_steps_by_rollout_and_reference(tmp_path):
    # Steps 1-3 at 10, 12, 14 (end 16): each 0.5 s rollout, then 0.25 s reference; a 0.3 s
    # checkpoint in step 2 (badput, not productive); 0.1 s input wait before steps 2 and 3.
    events = [dict(event="START_JOB", time=9.0)]
    for i, step in enumerate([1, 2, 3]):
        t = 10.0 + 2 * i
        events.append(dict(event="START_STEP", time=t, step=step, input_s=0.1 if i else 0.0))
        events += _span("rollout", t + 0.1, t + 0.6) + _span("reference", t + 0.6, t + 0.85)
        if step == 2:
            events += _span("checkpoint", t + 1.5, t + 1.8)
    events.append(dict(event="END_JOB", time=16.0))
    _write(str(tmp_path / "events" / "process_0.jsonl"), events)
    report = goodput.compute_goodput(str(tmp_path))
    parts, sub = report.parts, report.productive_parts
    assert parts["productive"] == pytest.approx(6.0 - 0.3 - 0.2)
    assert parts["checkpoint"] == pytest.approx(0.3) and parts["other_badput"] == 0
    assert sub["rollout"] == pytest.approx(1.5) and sub["reference"] == pytest.approx(0.75)
    assert sub["training"] == pytest.approx(parts["productive"] - 2.25)
    assert sum(sub.values()) == pytest.approx(parts["productive"], abs=1e-9)
    assert report.to_dict()["productive_parts_s"] == sub
    text = goodput.format_goodput(report)
    assert "  rollout" in text and "  reference log-probs" in text and "  training" in text


def test_runs_without_phases_report_no_productive_parts(tmp_path):
    events = [dict(event="START_JOB", time=9.0), dict(event="START_STEP", time=10.0, step=1)]
    events.append(dict(event="END_JOB", time=11.0))
    _write(str(tmp_path / "events" / "process_0.jsonl"), events)
    report = goodput.compute_goodput(str(tmp_path))
    assert report.productive_parts == {} and "productive_parts_s" not in report.to_dict()
    assert "rollout" not in goodput.format_goodput(report)


def test_productive_parts_invariant_is_checked():
    report = goodput.GoodputReport(
        trainer_dir="d",
        wall_s=2.0,
        parts=dict({k: 0.0 for k in goodput.PARTS}, productive=2.0),
        attempts=[],
        num_processes=1,
        warnings=[],
        productive_parts=dict(rollout=1.5, reference=1.0, training=-0.5),
    )
    with pytest.raises(goodput.GoodputInvariantError, match="productive parts"):
        goodput.check_invariants(report)
