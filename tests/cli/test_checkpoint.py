"""Tests axlearn/cli/checkpoint.py: `axlearn checkpoint convert` of AXLearn's layout."""

import os

import numpy as np
import pytest

from axlearn.cli.main import main
from axlearn.common.checkpointer import Checkpointer, layout, verify

_DATA = os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "testdata", "axlearn_checkpoints")
)
_TF = os.path.join(_DATA, "tf-iterator", "step_00000001")
_FUJI6 = os.path.join(_DATA, "fuji-test-v3", "checkpoints", "step_00000006")


def test_convert_fuji_step_values_equal(tmp_path, capsys):
    dst = str(tmp_path / "ours")
    assert main(["checkpoint", "convert", _FUJI6, dst]) == 0
    assert "verified, 31 leaves, 31 chunks with CRC-32s" in capsys.readouterr().out
    src_spec = verify.read_state_spec(_FUJI6)
    ckptr = Checkpointer.default_config().set(name="c", dir=dst).instantiate(parent=None)
    step, ours = ckptr.restore(state=src_spec)
    ckptr.stop()
    assert step == 6
    src = Checkpointer.default_config().set(name="s", dir=os.path.dirname(_FUJI6))
    src = src.instantiate(parent=None)
    _, theirs = src.restore(step=6, state=verify.read_state_spec(_FUJI6))
    src.stop()
    emb = ours["model"]["decoder"]["emb"]["token_emb"]["weight"]
    np.testing.assert_array_equal(
        np.asarray(emb), np.asarray(theirs["model"]["decoder"]["emb"]["token_emb"]["weight"])
    )
    assert np.asarray(ours["prng_key"]).shape == (4,)  # Kept as saved (rbg).


@pytest.mark.slow  # Imports TensorFlow (~10-30 s on 2 busy cores).
def test_convert_axlearn_step_then_restore_with_iterator(tmp_path, capsys):
    tf = pytest.importorskip("tensorflow")
    dst = str(tmp_path / "ours")
    assert main(["checkpoint", "convert", _TF, dst]) == 0
    out = capsys.readouterr().out
    assert "verified, 4 leaves, 3 chunks with CRC-32s" in out
    index = layout.read_index_file(os.path.join(dst, "step_00000001"))
    assert index.get("layout") is None  # Ours, with checksums.
    assert all(leaf["checksum"] for leaf in index["leaves"] if leaf["kind"] == "array")
    assert verify.verify_checkpoint(os.path.join(dst, "step_00000001")).ok
    ckptr = Checkpointer.default_config().set(name="c", dir=dst).instantiate(parent=None)
    spec = verify.read_state_spec(os.path.join(dst, "step_00000001"))
    fresh = iter(tf.data.Dataset.range(10))
    spec["input_iter"] = fresh
    step, restored = ckptr.restore(state=spec)
    assert step == 1
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(12.0).reshape(3, 4))
    assert int(np.asarray(restored["n"])) == 7
    assert [int(next(fresh)) for _ in range(2)] == [2, 3]  # AXLearn saved it at position 2.
    ckptr.stop()
    # Converting again into the same place is refused; so is a step of our own layout.
    assert main(["checkpoint", "convert", _TF, dst]) == 1
    assert main(["checkpoint", "convert", os.path.join(dst, "step_00000001"), str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and "already in this checkpointer's layout" in err
