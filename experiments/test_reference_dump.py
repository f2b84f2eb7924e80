"""The honeycrisp-3B experiment rebuilds the reference trainer dump line for line.

The reference dump (a real 3B trainer config of the library we model ourselves on) is kept in
`tests/testdata/trainer/honeycrisp_trainer_config.txt` so tests never read shared files.
"""

from __future__ import annotations

import difflib
import os

from axlearn.experiments.text.gpt.honeycrisp import honeycrisp_trainer_config

REFERENCE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "tests",
    "testdata",
    "trainer",
    "honeycrisp_trainer_config.txt",
)


def test_honeycrisp_dump_equals_reference():
    with open(REFERENCE, encoding="utf-8") as f:
        expected = f.read().splitlines()
    actual = honeycrisp_trainer_config().debug_string().splitlines()
    diff = "\n".join(difflib.unified_diff(expected, actual, "reference", "honeycrisp-3B", n=0))
    assert actual == expected, diff
    assert len(actual) == 289
