"""Tests axlearn/common/trainer_watchdog.py: a hang exits with the hang code."""

import threading

import pytest

from axlearn.common import trainer_watchdog
from axlearn.common.exit_codes import HANG_EXIT_CODE


# The fake exit ends the watchdog thread with SystemExit, which pytest reports as a warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_hang_exits_with_the_hang_code(monkeypatch):
    exited = []
    done = threading.Event()

    def fake_exit(code):
        exited.append(code)
        done.set()
        raise SystemExit(code)  # Ends the watchdog thread instead of the test process.

    monkeypatch.setattr(trainer_watchdog.os, "_exit", fake_exit)
    watchdog = trainer_watchdog.Watchdog(
        current_step=lambda: 7,  # Never advances.
        timeout_seconds=None,
        crash_timeout_seconds=0.05,
        name="test.watchdog",
    )
    with watchdog.running():
        assert done.wait(5.0)
    assert exited == [HANG_EXIT_CODE] == [75]


def test_advancing_steps_do_not_exit(monkeypatch):
    exited = []
    monkeypatch.setattr(trainer_watchdog.os, "_exit", exited.append)
    steps = iter(range(10**6))
    watchdog = trainer_watchdog.Watchdog(
        current_step=lambda: next(steps),  # A new step at every check.
        timeout_seconds=None,
        crash_timeout_seconds=0.05,
        name="test.watchdog",
    )
    with watchdog.running():
        threading.Event().wait(0.3)
    assert exited == []
