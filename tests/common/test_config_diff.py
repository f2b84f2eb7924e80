"""Tests axlearn/common/config_diff.py."""

import pytest

from axlearn.common.config_diff import (
    ConfigDumpFormatError,
    diff_config_dumps,
    format_config_diff,
    parse_config_dump,
    subtree_of,
)

A = """\
learner.optimizer.learning_rate: 0.003
max_step: 300
mesh_rules[0][0]: 'cpu-fsdp'
model.decoder.dim: 128
model.decoder.vocab_size: 4096
"""
B = """\
learner.optimizer.learning_rate: 0.001
max_step: 300
model.decoder.dim: 128
model.decoder.vocab_size: 4096
model.decoder.transformer.num_layers: 4
"""


def test_parse_and_diff():
    assert parse_config_dump(A)["mesh_rules[0][0]"] == "'cpu-fsdp'"
    diff = diff_config_dumps(A, B)
    assert diff.changed == [("learner.optimizer.learning_rate", "0.003", "0.001")]
    assert diff.added == [("model.decoder.transformer.num_layers", "4")]
    assert diff.removed == [("mesh_rules[0][0]", "'cpu-fsdp'")]
    assert bool(diff)
    assert not diff_config_dumps(A, A)
    assert diff.to_dict()["changed"][0] == {
        "path": "learner.optimizer.learning_rate",
        "a": "0.003",
        "b": "0.001",
    }


def test_values_with_colons_and_spaces():
    text = "name: 'a: b c'\nfn: 'axlearn.common.schedule.polynomial'\n"
    assert parse_config_dump(text) == {
        "name": "'a: b c'",
        "fn": "'axlearn.common.schedule.polynomial'",
    }


@pytest.mark.parametrize(
    "text,match",
    [
        ("no separator here\n", r"<dump>:1: not a config dump line"),
        ("a: 1\na: 2\n", r"<dump>:2: path 'a' appears twice"),
    ],
)
def test_bad_dump(text, match):
    with pytest.raises(ConfigDumpFormatError, match=match):
        parse_config_dump(text)


def test_lenient_parse_skips_continuation_lines_and_keeps_the_last_value():
    text = "w: array([[1, 2],\n       [3, 4]])\na: 1\na: 2\n"
    assert parse_config_dump(text, strict=False) == {"w": "array([[1, 2],", "a": "2"}


def test_subtree_of():
    assert subtree_of("model.decoder.transformer.num_layers") == "model.decoder"
    assert subtree_of("model.dtype") == "model"
    assert subtree_of("max_step") == "(top level)"
    assert subtree_of("mesh_rules[1][0]") == "mesh_rules"
    assert subtree_of("evalers['validation'].input.batch_size") == "evalers['validation'].input"


def test_format_groups_by_subtree():
    text = format_config_diff(diff_config_dumps(A, B), label_a="a", label_b="b")
    assert text.splitlines()[:3] == [
        "--- a",
        "+++ b",
        "1 changed (~), 1 only in b (+), 1 only in a (-)",
    ]
    assert "[learner.optimizer]\n  ~ learner.optimizer.learning_rate: 0.003 -> 0.001" in text
    assert "[mesh_rules]\n  - mesh_rules[0][0]: 'cpu-fsdp'" in text
    assert "[model.decoder]\n  + model.decoder.transformer.num_layers: 4" in text
    assert format_config_diff(diff_config_dumps(A, A)) == ""
