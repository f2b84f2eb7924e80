"""Tests axlearn/common/post_training_data.py: the shipped toy sets are the generators' output."""

import json
import os

import pytest

from axlearn.common import post_training_data as data


def test_shipped_sets_match_generators():
    with open(data.resolve_data_path(data.INSTRUCTIONS_PATH), encoding="utf-8") as f:
        assert json.load(f) == data.instruction_records()
    with open(data.resolve_data_path(data.PREFERENCES_PATH), encoding="utf-8") as f:
        assert json.load(f) == data.preference_records()


def test_resolve_data_path():
    # Config values name shipped files independently of where the package is installed.
    assert not os.path.isabs(data.INSTRUCTIONS_PATH)
    assert data.resolve_data_path(data.INSTRUCTIONS_PATH) == os.path.join(
        data.DATA_DIR, "post_training", "instructions.json"
    )
    assert data.resolve_data_path("/tmp/x.json") == "/tmp/x.json"
    assert data.resolve_data_path("rel/x.json") == "rel/x.json"
    for bad in ("", "/etc/passwd", "../x.json", "a/../../x", "a//b", "./a"):
        with pytest.raises(ValueError, match="shipped data path"):
            data.resolve_data_path(data.PACKAGE_DATA_PREFIX + bad)


def test_records_are_right():
    records = data.instruction_records()
    assert len(records) == 400
    for r in records:
        task, word = r["prompt"].split(" ")
        expected = {
            "reverse": word[::-1],
            "sort": "".join(sorted(word)),
            "upper": word.upper(),
            "double": "".join(c * 2 for c in word),
        }[task]
        assert r["response"] == expected and 3 <= len(word) <= 6
    prefs = data.preference_records()
    assert len(prefs) == 400
    for i, r in enumerate(prefs):
        task, word = r["prompt"].split(" ")
        assert r["chosen"] == data.TASKS[task](word) != r["rejected"]
        # Blocks of four: the input copied, then the answer to another instruction.
        wrong = data.TASKS[data.WRONG_INSTRUCTION[task]](word)
        assert r["rejected"] == (word if i % 8 < 4 else wrong), (i, r)
