"""Tests axlearn/cli/goodput.py (`axlearn goodput TRAINER_DIR`)."""

import json
import os

import pytest

from axlearn.cli.main import main
from tests.common.test_goodput import _LAUNCHER, _process_events, _write


def _run_dir(tmp_path) -> str:
    d = str(tmp_path)
    _write(os.path.join(d, "events", "process_0.jsonl"), _process_events(), tail='{"ev')
    _write(os.path.join(d, "events", "launcher.jsonl"), _LAUNCHER)
    return d


def test_table(tmp_path, capsys):
    d = _run_dir(tmp_path)
    assert main(["goodput", d]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"Goodput of {d}: 39.0% (15.4 s productive of 39.5 s wall time; ")
    assert "2 attempt(s), 1 failed" in out
    assert "idle between attempts" in out and "total" in out
    assert "failed: process 1 was killed by SIGKILL (exit code 137) (resumed from step 8)" in out
    assert "torn last line" in err and "process_0.jsonl" in err


def test_json(tmp_path, capsys):
    d = _run_dir(tmp_path)
    assert main(["goodput", d, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["goodput"] == pytest.approx(15.4 / 39.5)
    assert report["parts_s"]["redone"] == pytest.approx(3.9)
    assert report["attempts"][0]["redone_steps"] == 2


def test_no_events_is_one_line(tmp_path, capsys):
    assert main(["goodput", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "recorded no events" in err


def test_damaged_lines_are_one_line_each_on_stderr(tmp_path, capsys):
    d = str(tmp_path)
    events = _process_events()
    lines = [json.dumps(e).encode() for e in events]
    lines.insert(3, b'{"event": "START_STEP", "time": 1011.5, "step": "7b-SECRET"}')
    lines.insert(5, b"[" * 100_000 + b"]" * 100_000)
    lines.insert(7, b"\xff\xfeSECRET")
    os.makedirs(os.path.join(d, "events"))
    with open(os.path.join(d, "events", "process_0.jsonl"), "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    _write(os.path.join(d, "events", "launcher.jsonl"), _LAUNCHER)
    assert main(["goodput", d]) == 0
    out, err = capsys.readouterr()
    warnings = err.strip().splitlines()
    assert [w.split("process_0.jsonl:")[1].split(":")[0] for w in warnings] == ["4", "6", "8"]
    assert all(w.startswith("axlearn goodput: warning: ") for w in warnings)
    assert "SECRET" not in out + err and "Traceback" not in err
    assert out.startswith(f"Goodput of {d}: 39.0% ")  # The damaged lines change nothing.
