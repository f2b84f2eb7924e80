"""Tests axlearn/common/input_iterator.py (the tf.data state format is in test_input_tf_data.py)."""

from __future__ import annotations

import pytest

from axlearn.common import input_state_check
from axlearn.common.input_iterator import foreign_state_message, saved_input_kind

_FAKE = b'{"format": "axlearn.fake_input_state", "num_batches": 1'
_UNKNOWN = "an unknown input ("


@pytest.mark.parametrize(
    "state, kind",
    [
        (_FAKE + b"}", "FakeLmInput (a run with --data_dir=FAKE)"),
        (b'\n {"format": "axlearn.grain_input_state"}', "a Grain input reading real data"),
        (b"AXINPUT1\x00\x00", "a tf.data input reading real data"),
        (b'{"format": "tf_data"}', _UNKNOWN),
        (b'{"format": ["axlearn.fake_input_state"]}', _UNKNOWN),  # Wrong JSON type.
        (b'["axlearn.fake_input_state"]', "an unknown input"),
        (_FAKE, _UNKNOWN),  # Truncated.
        (b"{\xff}", _UNKNOWN),  # Not UTF-8.
    ],
)
def test_saved_input_kind(state, kind):
    assert saved_input_kind(state).startswith(kind)


def test_saved_input_kind_is_bounded():
    """Huge and deeply nested states are refused by the bounded parser, not decoded."""
    huge = _FAKE + b', "pad": "' + b"s" * input_state_check.MAX_STATE_BYTES + b'"}'
    assert saved_input_kind(huge) == f"{_UNKNOWN}{len(huge)} bytes that no axlearn input writes)"
    # Plain json.loads decodes this (depth 65, well under Python's recursion limit): the bound
    # is input_state_check's, not the interpreter's.
    deep = _FAKE + b', "x": ' + b"[" * 64 + b"]" * 64 + b"}"
    assert saved_input_kind(deep).startswith(_UNKNOWN)
    shallow = _FAKE + b', "x": ' + b"[" * 60 + b"]" * 60 + b"}"
    assert saved_input_kind(shallow).startswith("FakeLmInput")
    deeper = _FAKE + b', "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert saved_input_kind(deeper).startswith(_UNKNOWN)
    msg = foreign_state_message(deeper, name="input", reader="a Grain input of real data")
    assert "saved by an unknown input (" in msg and "[[" not in msg and "\n" not in msg
