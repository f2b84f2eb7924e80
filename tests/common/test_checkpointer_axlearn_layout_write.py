"""Tests axlearn/common/checkpointer/axlearn_layout_write.py: writing AXLearn's own layout.

The format is compared with the fixture in tests/testdata/axlearn_checkpoints/tf-iterator/
(written by Apple's AXLearn, commit 34aed43c): rewriting its values gives the same files, byte
for byte. Values are read back with our AXLearn-layout reader and with TensorStore's own zarr
driver on the written files (an independent decoder).
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from axlearn.common import file_access
from axlearn.common.checkpointer import axlearn_layout_write as writer
from axlearn.common.checkpointer import layout, tensorstore_restore, tf_iterators

_DATA = os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "testdata", "axlearn_checkpoints")
)
_TF = os.path.join(_DATA, "tf-iterator", "step_00000001")


def _ts_read(step_dir: str, path: str) -> np.ndarray:
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{step_dir}/gda/{path}"}}
    return np.asarray(ts.open(spec, open=True).result().read().result())


def _restore(step_dir: str, state: dict) -> dict:
    restored, _ = tensorstore_restore.restore_state(
        ckpt_dir=step_dir,
        index=layout.read_index_file(step_dir),
        state=state,
        budget_bytes=1 << 26,
        timeout_s=30,
    )
    return restored


def _files(step_dir: str) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(step_dir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, step_dir)] = f.read()
    return out


def _one_line(excinfo, *needles):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message


def _state():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    w[0, 0], w[0, 1], w[0, 2] = np.nan, -0.0, np.finfo(np.float32).tiny / 2  # Bits, not values.
    return {
        "model": {
            "w": w,
            "b": jnp.asarray([1.5, -2.25, 3e-3], jnp.bfloat16),
            "z": np.zeros((4, 2), np.float32),  # All zero: every chunk is still stored.
            "flag": np.array([True, False]),
        },
        "count": np.int32(-7),
        "prng_key": np.array([0xDEADBEEF, 17], np.uint32),  # Threefry: written as rbg.
    }


def test_round_trip_is_bit_exact(tmp_path):
    state = _state()
    result = writer.write_step(
        str(tmp_path), step=12, state=state, chunk_shapes={"model/z": (2, 2)}
    )
    step_dir = str(tmp_path / "step_00000012")
    assert result.step_dir == step_dir and result.num_arrays == 6 and result.num_chunks == 7
    assert sorted(os.listdir(os.path.join(step_dir, "gda", "model", "z"))) == [
        ".zarray",
        "0.0",
        "1.0",
    ]
    index = layout.read_index_file(step_dir)
    assert index["layout"] == "axlearn" and index["step"] == 12
    target = jax.tree.map(lambda x: np.zeros(np.shape(x), np.asarray(x).dtype), state)
    out = _restore(step_dir, target)  # prng_key target uint32[2]: mapped back to threefry.
    for (path, want), got in zip(
        jax.tree_util.tree_flatten_with_path(state)[0], jax.tree_util.tree_leaves(out)
    ):
        want, got = np.asarray(want), np.asarray(got)
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert got.tobytes() == want.tobytes(), path
    # On disk: the rbg key [a, b, a, b], as AXLearn's launcher runs; TensorStore reads the same.
    np.testing.assert_array_equal(_ts_read(step_dir, "prng_key"), [0xDEADBEEF, 17] * 2)
    rbg = _restore(step_dir, {**target, "prng_key": np.zeros(4, np.uint32)})
    np.testing.assert_array_equal(rbg["prng_key"], [0xDEADBEEF, 17] * 2)
    assert _ts_read(step_dir, "model/b").tobytes() == np.asarray(state["model"]["b"]).tobytes()
    assert _ts_read(step_dir, "count").dtype == np.int32 and _ts_read(step_dir, "count") == -7


def test_prng_key_as_saved(tmp_path):
    writer.write_step(
        str(tmp_path), step=1, state={"prng_key": np.array([1, 2], np.uint32)}, rbg_prng_key=False
    )
    np.testing.assert_array_equal(_ts_read(str(tmp_path / "step_00000001"), "prng_key"), [1, 2])


def test_rewriting_axlearn_fixture_gives_the_same_files(tmp_path):
    """The values of AXLearn's own save, written again: index, .zarray, chunks, tf files equal."""
    tf_files = {}
    for name in os.listdir(os.path.join(_TF, "tf_0")):
        with open(os.path.join(_TF, "tf_0", name), "rb") as f:
            tf_files[tf_iterators.AXLEARN_PREFIX + name[len("input_iter") :]] = f.read()
    state = {
        "b": _ts_read(_TF, "b"),
        "n": _ts_read(_TF, "n"),
        "w": _ts_read(_TF, "w"),
        "input_iter": tf_iterators.pack_files(tf_files),
    }
    writer.write_step(str(tmp_path), step=1, state=state)
    ours, theirs = _files(str(tmp_path / "step_00000001")), _files(_TF)
    assert sorted(ours) == sorted(theirs)  # Same chunk names (`0`, `0.0`), same tf_0 files.
    for name in theirs:
        assert ours[name] == theirs[name], name
    index = json.loads(ours["index"])
    assert index[0] == ["step", 1] and dict(index)["input_iter"].startswith("<class 'tensorflow.")


def test_existing_destination_is_refused(tmp_path):
    os.makedirs(tmp_path / "step_00000003")
    with pytest.raises(writer.AXLearnWriteError) as e:
        writer.write_step(str(tmp_path), step=3, state={"x": np.ones(2)})
    _one_line(e, str(tmp_path / "step_00000003"), "already exists")
    assert os.listdir(tmp_path / "step_00000003") == []


def test_link_at_destination_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "ckpt"
    base.mkdir()
    os.symlink(elsewhere, base / "step_00000003")
    with pytest.raises(writer.AXLearnWriteError) as e:
        writer.write_step(str(base), step=3, state={"x": np.ones(2)})
    _one_line(e, str(base / "step_00000003"), "already exists")
    assert os.listdir(elsewhere) == []  # Nothing written through the link.


def test_link_inside_the_step_is_not_followed(tmp_path, monkeypatch):
    """A link planted at `gda/` while the step is written is refused, its target untouched."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = file_access.makedirs

    def plant(root, relpath, **kwargs):
        if relpath == "step_00000003":
            real(root, relpath, **kwargs)
            os.symlink(elsewhere, tmp_path / "ckpt" / "step_00000003" / "gda")
            return
        real(root, relpath, **kwargs)

    monkeypatch.setattr(file_access, "makedirs", plant)
    with pytest.raises(writer.AXLearnWriteError) as e:
        writer.write_step(str(tmp_path / "ckpt"), step=3, state={"x": np.ones(2)})
    _one_line(e, "gda", "link")
    assert os.listdir(elsewhere) == []
    assert not os.path.exists(tmp_path / "ckpt" / "step_00000003" / "index")


@pytest.mark.parametrize(
    "state,needles",
    [
        ({"step": np.ones(2)}, ("'step'", "holds the step")),
        ({"f": object()}, ("'f'", "is a object", "JSON values")),
        ({"it": b"not a tar"}, ("'it'", "not a tf.data iterator archive")),
        (
            {"it": tf_iterators.pack_files({"iterator.index": b"x"})},
            ("'it'", "saved by this checkpointer", "Drop this leaf"),
        ),
    ],
)
def test_leaves_that_cannot_be_written(tmp_path, state, needles):
    with pytest.raises(writer.AXLearnWriteError) as e:
        writer.write_step(str(tmp_path), step=1, state=state)
    _one_line(e, *needles)
    assert not os.path.exists(tmp_path / "step_00000001")  # Refused before writing.


def test_failed_verification_leaves_the_step_uncommitted(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "verify_written", lambda *a, **k: ["x"])
    with pytest.raises(writer.AXLearnWriteError) as e:
        writer.write_step(str(tmp_path), step=2, state={"x": np.ones(2)})
    _one_line(e, str(tmp_path / "step_00000002"), "['x'] differ", "uncommitted")
    assert not layout.is_committed(str(tmp_path / "step_00000002"))


def _save_ours(base: str, step: int, state) -> str:
    from axlearn.common.checkpointer import Checkpointer  # pylint: disable=import-outside-toplevel

    ckptr = Checkpointer.default_config().set(name="c", dir=base).instantiate(parent=None)
    ckptr.save(step=step, state=state)
    ckptr.wait_until_finished()
    ckptr.stop()
    return os.path.join(base, layout.step_dir_name(step))


def test_convert_step_dir_of_ours(tmp_path):
    state = _state()
    src = _save_ours(str(tmp_path / "ours"), 5, state)
    result = writer.convert_step_dir(src, str(tmp_path / "ax"))
    assert result.num_arrays == 6 and result.raw_bytes > 0
    out = _restore(
        result.step_dir, jax.tree.map(lambda x: np.zeros(np.shape(x), np.asarray(x).dtype), state)
    )
    for want, got in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(out)):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def test_convert_refuses_uncommitted_and_axlearn_sources(tmp_path):
    src = _save_ours(str(tmp_path / "ours"), 5, {"x": np.ones(2)})
    os.remove(os.path.join(src, "index"))
    with pytest.raises(writer.AXLearnWriteError) as e:
        writer.convert_step_dir(src, str(tmp_path / "ax"))
    _one_line(e, os.path.join(src, "index"), "uncommitted")
    copy = str(tmp_path / "theirs" / "step_00000001")
    shutil.copytree(_TF, copy)
    with pytest.raises(writer.AXLearnWriteError) as e:
        writer.convert_step_dir(copy, str(tmp_path / "ax"))
    _one_line(e, copy, "already in AXLearn's layout")
