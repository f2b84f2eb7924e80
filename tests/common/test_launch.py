"""Tests axlearn/common/launch.py's start-up checks."""

import logging

from axlearn.common import launch


def test_a_peer_connecting_to_the_coordinator_logs_an_info_line_not_a_warning(caplog):
    """Issue 55 case 6: process 1 of every healthy 2-process start printed this as a W-line."""
    with caplog.at_level(logging.INFO):
        launch.check_coordinator(
            "127.0.0.1:12345", num_processes=2, process_id=1, initialization_timeout=10
        )
    (record,) = [r for r in caplog.records if "connecting to the coordinator" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith(
        "Process 1 of 2: connecting to the coordinator at 127.0.0.1:12345 (process 0's)."
    )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
