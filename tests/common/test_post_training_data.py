"""Tests axlearn/common/post_training_data.py: the shipped toy sets are the generators' output."""

import json

from axlearn.common import post_training_data as data


def test_shipped_sets_match_generators():
    with open(data.INSTRUCTIONS_PATH, encoding="utf-8") as f:
        assert json.load(f) == data.instruction_records()
    with open(data.PREFERENCES_PATH, encoding="utf-8") as f:
        assert json.load(f) == data.preference_records()


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
    for r in prefs:
        word = r["prompt"].split(" ")[1]
        assert r["rejected"] == word and r["chosen"] != word
