"""Tests axlearn/cli/checkpoint.py: `axlearn checkpoint convert`, AXLearn's layout <-> ours."""

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
    # Converting again into the same place is refused; so is a step of ours `--to ours`.
    assert main(["checkpoint", "convert", _TF, dst]) == 1
    ours = os.path.join(dst, "step_00000001")
    assert main(["checkpoint", "convert", ours, str(tmp_path), "--to", "ours"]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and "already in this checkpointer's layout" in err


def _tree_files(step_dir):
    out = {}
    for root, _, names in os.walk(step_dir):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), step_dir)] = f.read()
    return out


def test_convert_back_to_axlearn_reproduces_axlearns_files(tmp_path, capsys):
    """AXLearn's step -> ours -> AXLearn's: the same files as AXLearn wrote, byte for byte."""
    ours = str(tmp_path / "ours")
    assert main(["checkpoint", "convert", _FUJI6, ours]) == 0
    back = str(tmp_path / "back")
    assert main(["checkpoint", "convert", os.path.join(ours, "step_00000006"), back]) == 0
    out = capsys.readouterr().out
    assert "(AXLearn layout): 31 arrays in 31 zstd chunks" in out
    assert "every value equal to the source's" in out
    written, theirs = _tree_files(os.path.join(back, "step_00000006")), _tree_files(_FUJI6)
    assert sorted(written) == sorted(theirs)
    assert all(written[name] == theirs[name] for name in theirs)
    assert main(["checkpoint", "verify", back]) == 0


def test_convert_our_step_to_axlearn_and_refusals(tmp_path, capsys):
    state = {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "prng_key": np.array([3, 4], np.uint32),
    }
    ckptr = Checkpointer.default_config().set(name="c", dir=str(tmp_path / "ours"))
    ckptr = ckptr.instantiate(parent=None)
    ckptr.save(step=2, state=state)
    ckptr.wait_until_finished()
    ckptr.stop()
    src = str(tmp_path / "ours" / "step_00000002")
    dst = str(tmp_path / "ax")
    assert main(["checkpoint", "convert", src, dst, "--to", "axlearn"]) == 0
    index = layout.read_index_file(os.path.join(dst, "step_00000002"))
    assert index["layout"] == "axlearn"
    assert {leaf["path"]: leaf["shape"] for leaf in index["leaves"]}["prng_key"] == [4]  # rbg.
    assert main(["checkpoint", "convert", src, str(tmp_path / "kept"), "--prng_key=as_saved"]) == 0
    kept = layout.read_index_file(str(tmp_path / "kept" / "step_00000002"))
    assert {leaf["path"]: leaf["shape"] for leaf in kept["leaves"]}["prng_key"] == [2]
    capsys.readouterr()
    # The destination step exists; SRC is AXLearn's already; SRC is not committed.
    assert main(["checkpoint", "convert", src, dst]) == 1
    assert main(["checkpoint", "convert", _TF, dst, "--to", "axlearn"]) == 1
    os.remove(os.path.join(src, "index"))
    assert main(["checkpoint", "convert", src, str(tmp_path / "x")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 3
    assert "step_00000002 already exists" in err[0]
    assert "already in AXLearn's layout (--to axlearn)" in err[1]
    assert os.path.join(src, "index") in err[2] and "uncommitted" in err[2]
