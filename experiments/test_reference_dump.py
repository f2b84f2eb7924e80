"""The honeycrisp-3B experiment rebuilds the reference trainer dump line for line.

The reference dump (a real 3B trainer config of the library we model ourselves on) is kept in
`tests/testdata/trainer/honeycrisp_trainer_config.txt` so tests never read shared files. It
predates fields newer AXLearn dumps show (`golden_config.NEWER_AXLEARN_LINES`); those lines of
ours are dropped before comparing.
"""

from __future__ import annotations

import difflib
import os
import re

from axlearn.common.golden_config import drop_newer_axlearn_lines
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
    full = honeycrisp_trainer_config().debug_string().splitlines()
    actual = drop_newer_axlearn_lines(full)
    assert len(full) - len(actual) == 2  # learner.ignore_undefined_loss, attention's KVCache.
    diff = "\n".join(difflib.unified_diff(expected, actual, "reference", "honeycrisp-3B", n=0))
    assert actual == expected, diff
    assert len(actual) == 289


def test_named_honeycrisp_is_the_reference_plus_launch_rules():
    """The named config honeycrisp-3B adds mesh rules for the docs' launch targets, after the
    reference's five: the reference lines are all there, unchanged; the rest are those rules."""
    from axlearn.experiments.text.gpt import honeycrisp

    with open(REFERENCE, encoding="utf-8") as f:
        expected = f.read().splitlines()
    named = drop_newer_axlearn_lines(
        honeycrisp.named_trainer_configs()["honeycrisp-3B"]().debug_string().splitlines()
    )
    added = [line for line in named if line not in expected]
    assert [line for line in named if line in expected] == expected
    regexes = [
        line.split(": ", 1)[1]
        for line in added
        if re.fullmatch(r"mesh_rules\[\d+\]\[0\]", line.split(": ")[0])
    ]
    assert regexes == [repr(r) for r, _ in honeycrisp.LAUNCH_MESH_RULES]
    num = len(honeycrisp.LAUNCH_MESH_RULES)
    assert all(line.startswith(tuple(f"mesh_rules[{5 + i}]" for i in range(num))) for line in added)
    assert len(added) == num * 7  # Each rule: its regex and the 6 axes of its mesh shape.
