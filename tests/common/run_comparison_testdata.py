"""Recorded runs for the `axlearn compare` tests (tests/testdata/runs/, see its README.md)."""

import os

RUNS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata", "runs")


def run_path(name: str) -> str:
    """Returns the path of a recorded run directory."""
    return os.path.join(RUNS_DIR, name)
