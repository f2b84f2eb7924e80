"""Tests axlearn/common/goodput_events.py: damaged, hostile and huge event files.

Each case is one warning naming the file and line with a reason and none of the line's bytes,
and the report's invariants hold (parts >= 0, summing to the wall time, goodput in [0, 1]).
"""

import json
import os

import pytest

from axlearn.common import goodput, goodput_events

SECRET = "hunter2-SECRET-do-not-print"
_GOOD = [
    dict(event="START_JOB", time=1001.0, process_start=1000.0),
    dict(event="START_STEP", time=1010.0, step=1),
    dict(event="START_STEP", time=1011.0, step=2),
]
_END = dict(event="END_JOB", time=1012.0)


def _write_lines(d, lines: list[bytes], name="process_0.jsonl") -> str:
    os.makedirs(os.path.join(d, "events"), exist_ok=True)
    path = os.path.join(d, "events", name)
    with open(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    return path


def _good_lines() -> list[bytes]:
    return [json.dumps(e).encode() for e in _GOOD]


def _report(d) -> goodput.GoodputReport:
    report = goodput.compute_goodput(d)
    goodput.check_invariants(report)
    text = goodput.format_goodput(report) + json.dumps(report.to_dict())
    assert SECRET not in text
    return report


@pytest.mark.parametrize(
    "bad,reason",
    [
        (dict(event="START_STEP", time=1011.5, step="7b" + SECRET),
         "field 'step' of START_STEP is a string, not a non-negative integer"),
        (dict(event="START_STEP", time=1011.5, step=-3),
         "field 'step' of START_STEP is out of range, not a non-negative integer"),
        (dict(event="START_STEP", time=1011.5, step=True),
         "field 'step' of START_STEP is a boolean"),
        (dict(event="START_STEP", time=1011.5, step=3, input_s=-99.9),
         "field 'input_s' of START_STEP is out of range"),
        (dict(event="START_STEP", time=SECRET, step=3), "field 'time' of START_STEP is a string"),
        (dict(event="START_STEP", time=1011.5), "START_STEP without its field 'step'"),
        (dict(event="START_JOB", time=1011.5, attempt=[SECRET]),
         "field 'attempt' of START_JOB is a list"),
        (dict(event=SECRET, time=1011.5), "unknown event name (field 'event')"),
        ([SECRET], "the line is a list, not an event object"),
    ],
)  # fmt: skip
def test_wrong_json_types_are_one_line_each(tmp_path, bad, reason):
    d = str(tmp_path)
    _write_lines(d, _good_lines() + [json.dumps(bad).encode(), json.dumps(_END).encode()])
    report = _report(d)
    assert len(report.warnings) == 1, report.warnings
    assert report.warnings[0].startswith(f"{d}/events/process_0.jsonl:4: skipped: {reason}")
    assert report.attempts[0].last_step == 2
    assert report.parts["productive"] == pytest.approx(2.0)


def test_deep_nesting_non_utf8_huge_line_and_torn_tail(tmp_path):
    d = str(tmp_path)
    deep = b"[" * 100_000 + b"]" * 100_000
    shallow_deep = b'{"event": "END_JOB", "time": 1.0, "x": ' + b"[" * 20 + b"]" * 20 + b"}"
    huge = b'{"event": "START_STEP", "step": 3, "pad": "' + SECRET.encode() * 400_000 + b'"}'
    lines = _good_lines() + [
        deep,
        shallow_deep,
        b'{"event": "START_STEP", "time": 1011.5, "step": "\xff\xfe' + SECRET.encode() + b'"}',
        huge,
        b"not json " + SECRET.encode(),
        json.dumps(_END).encode(),
    ]
    path = _write_lines(d, lines)
    with open(path, "ab") as f:
        f.write(b'{"event": "START_STEP", "ti')  # Torn last line.
    report = _report(d)
    reasons = [w.split("process_0.jsonl:", 1)[1] for w in report.warnings]
    assert reasons == [
        "4: skipped: the line is longer than 65536 bytes",
        "5: skipped: the line is JSON nested deeper than 8",
        "6: skipped: the line is not UTF-8",
        "7: skipped: the line is longer than 65536 bytes",
        "8: skipped: the line is not JSON",
        "10: skipped a torn last line (the process died while writing it)",
    ]
    assert report.attempts[0].status == "ok" and report.wall_s == pytest.approx(12.0)


def test_warnings_are_capped_per_file(tmp_path):
    d = str(tmp_path)
    _write_lines(d, _good_lines() + [b"garbage"] * 1000 + [json.dumps(_END).encode()])
    report = _report(d)
    cap = goodput_events.MAX_WARNINGS_PER_FILE
    assert len(report.warnings) == cap + 1
    assert report.warnings[-1].endswith(f"{1000 - cap} more line(s) skipped (only the first "
                                        f"{cap} are listed)")  # fmt: skip


def _sentinel(tmp_path) -> str:
    path = str(tmp_path / "outside.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(dict(event="START_JOB", time=1.0, note=SECRET)) + "\n")
    return path


def test_a_linked_event_file_is_not_read(tmp_path):
    d = str(tmp_path / "run")
    outside = _sentinel(tmp_path)
    before = (open(outside, "rb").read(), os.stat(outside).st_mtime_ns)
    _write_lines(d, _good_lines())
    os.symlink(outside, os.path.join(d, "events", "process_1.jsonl"))
    os.symlink(outside, os.path.join(d, "events", "launcher.jsonl"))
    report = _report(d)
    assert report.num_processes == 2
    assert len(report.warnings) == 2
    assert all("not read" in w and "link" in w for w in report.warnings)
    assert (open(outside, "rb").read(), os.stat(outside).st_mtime_ns) == before


def test_a_linked_events_dir_is_one_error(tmp_path):
    d = str(tmp_path / "run")
    elsewhere = str(tmp_path / "elsewhere")
    _write_lines(elsewhere, _good_lines())
    os.makedirs(d)
    os.symlink(os.path.join(elsewhere, "events"), os.path.join(d, "events"))
    with pytest.raises(goodput.NoEventsError, match="link") as e:
        goodput.compute_goodput(d)
    assert len(str(e.value).splitlines()) == 1
    assert goodput.goodput_summary(d) is None  # The run's own summary does not fail.


def test_fifo_and_directory_do_not_hang(tmp_path):
    d = str(tmp_path)
    _write_lines(d, _good_lines())
    os.mkfifo(os.path.join(d, "events", "launcher.jsonl"))
    os.makedirs(os.path.join(d, "events", "process_1.jsonl"))
    report = _report(d)  # Returns at once (no open of the FIFO for reading blocks).
    assert len(report.warnings) == 2
    assert all("not read" in w for w in report.warnings)


def test_missing_and_empty(tmp_path):
    d = str(tmp_path)
    with pytest.raises(goodput.NoEventsError, match="has no event files"):
        goodput.compute_goodput(d)
    _write_lines(d, [])
    report = _report(d)
    assert report.attempts == [] and report.wall_s == 0.0 and report.goodput is None


def test_summary_never_raises_and_holds_no_content(tmp_path):
    d = str(tmp_path)
    _write_lines(d, _good_lines() + [b"{" * 50_000 + SECRET.encode(), b"\xff" + SECRET.encode()])
    summary = goodput.goodput_summary(d)
    assert summary is not None and SECRET not in json.dumps(summary)
    assert [w.split("process_0.jsonl:", 1)[1] for w in summary["warnings"]] == [
        "4: skipped: the line is JSON nested deeper than 8",
        "5: skipped: the line is not UTF-8",
    ]
