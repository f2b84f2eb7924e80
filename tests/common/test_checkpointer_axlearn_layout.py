"""Tests axlearn/common/checkpointer/axlearn_layout.py: reading AXLearn's own checkpoint layout.

The fixtures in tests/testdata/axlearn_checkpoints/ were written by Apple's AXLearn (commit
34aed43c): `fuji-test-v3/checkpoints/step_0000000{3,6}` by its trainer, `tf-iterator/` by its
`Checkpointer.save` of a tf.data iterator at position 2, a bfloat16 `b`, an int32 scalar `n`
and a float32 `w` [3, 4]. Restored values are compared with TensorStore's own zarr reader on
the fixture's files (an independent decoder).
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts

from axlearn.common.checkpointer import layout, tensorstore_restore, tf_iterators
from axlearn.common.checkpointer.tensorstore_restore import CheckpointCorruptionError

_DATA = os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "testdata", "axlearn_checkpoints")
)
_FUJI = os.path.join(_DATA, "fuji-test-v3", "checkpoints")
_TF = os.path.join(_DATA, "tf-iterator", "step_00000001")


def _ts_read(step_dir: str, path: str) -> np.ndarray:
    """The array as TensorStore's zarr driver reads it from the fixture (the reference)."""
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{step_dir}/gda/{path}"}}
    return np.asarray(ts.open(spec, open=True).result().read().result())


def _restore(step_dir, state, validation="EXACT"):
    index = layout.read_index_file(step_dir)
    restored, _ = tensorstore_restore.restore_state(
        ckpt_dir=step_dir,
        index=index,
        state=state,
        budget_bytes=1 << 26,
        timeout_s=30,
        validation=validation,
    )
    return restored


def _copy(tmp_path, src=_TF) -> str:
    dst = str(tmp_path / "ckpt" / os.path.basename(src))
    shutil.copytree(src, dst)
    return dst


def test_index_is_parsed_into_ours():
    index = layout.read_index_file(os.path.join(_FUJI, "step_00000006"))
    assert index["layout"] == "axlearn" and index["step"] == 6
    leaves = {leaf["path"]: leaf for leaf in index["leaves"]}
    assert len(leaves) == 31  # The fixture's README: 31 arrays.
    emb = leaves["model/decoder/emb/token_emb/weight"]
    assert emb["shape"] == [32, 8] and emb["chunk_shape"] == [32, 8]
    assert emb["compressor"] == "zstd" and emb["checksum"] is None
    assert leaves["learner/optimizer/1/0/count"]["shape"] == []
    assert leaves["prng_key"]["dtype"] == "uint32" and leaves["prng_key"]["shape"] == [4]
    assert layout.latest_checkpoint_step(_FUJI) == 6
    assert [layout.parse_step_from_dir(p) for p in layout.checkpoint_paths(_FUJI)] == [3, 6]


def test_restore_values_bf16_scalar_and_tf_iterator():
    tf = pytest.importorskip("tensorflow")
    state = {
        "b": jax.ShapeDtypeStruct((2,), jnp.bfloat16),
        "n": jax.ShapeDtypeStruct((), jnp.int32),
        "w": jax.ShapeDtypeStruct((3, 4), jnp.float32),
        "input_iter": b"",
    }
    out = _restore(_TF, state)
    for name in ("b", "n", "w"):
        want = _ts_read(_TF, name)
        assert out[name].dtype == want.dtype and out[name].shape == want.shape
        np.testing.assert_array_equal(np.asarray(out[name]), want)
    np.testing.assert_array_equal(np.asarray(out["w"]), np.arange(12.0).reshape(3, 4))
    assert out["b"].dtype == jnp.bfloat16
    it = tf_iterators.restore(iter(tf.data.Dataset.range(10)), out["input_iter"])
    assert [int(next(it)) for _ in range(3)] == [2, 3, 4]  # Saved at position 2.


def test_restore_fuji_step_maps_rbg_key_to_threefry():
    step_dir = os.path.join(_FUJI, "step_00000006")
    index = layout.read_index_file(step_dir)
    state = {}
    for leaf in index["leaves"]:
        shape = tuple(leaf["shape"])
        if leaf["path"] == "prng_key":
            shape = (2,)  # The threefry key of this trainer.
        state[leaf["path"]] = jax.ShapeDtypeStruct(shape, jnp.dtype(leaf["dtype"]))
    out = _restore(step_dir, state)
    for path, value in out.items():
        want = _ts_read(step_dir, path)
        if path == "prng_key":
            np.testing.assert_array_equal(want[:2], want[2:])  # rbg: [a, b, a, b].
            want = want[:2]
        np.testing.assert_array_equal(np.asarray(value), want, err_msg=path)


def test_non_duplicated_rbg_key_is_refused(tmp_path):
    step_dir = _copy(tmp_path, os.path.join(_FUJI, "step_00000006"))
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": f"{step_dir}/gda/prng_key"}}
    store = ts.open(spec, open=True).result()
    store.write(np.array([1, 2, 3, 4], np.uint32)).result()
    with pytest.raises(tensorstore_restore.StateMismatchError, match=r"not of the form"):
        _restore(
            step_dir,
            {"prng_key": jax.ShapeDtypeStruct((2,), jnp.uint32)},
            validation="CONTAINS_STATE",
        )


def _one_line(excinfo, *needles):
    message = str(excinfo.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_truncated_index(tmp_path):
    step_dir = _copy(tmp_path)
    with open(os.path.join(step_dir, "index"), "rb") as f:
        data = f.read()
    with open(os.path.join(step_dir, "index"), "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(layout.CheckpointIndexError) as e:
        layout.read_index_file(step_dir)
    _one_line(e, os.path.join(step_dir, "index"), "JSON")


def test_zarray_shape_disagrees_with_index(tmp_path):
    step_dir = _copy(tmp_path)
    zarray = os.path.join(step_dir, "gda", "w", ".zarray")
    with open(zarray, encoding="utf-8") as f:
        meta = json.load(f)
    meta["shape"] = [4, 3]
    with open(zarray, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    with pytest.raises(layout.CheckpointIndexError) as e:
        layout.read_index_file(step_dir)
    _one_line(e, zarray, "shape [4, 3] disagrees with the index's [3, 4]")


def test_missing_and_undecodable_chunk(tmp_path):
    step_dir = _copy(tmp_path)
    state = {"w": jax.ShapeDtypeStruct((3, 4), jnp.float32)}
    chunk = os.path.join(step_dir, "gda", "w", "0.0")
    with open(chunk, "rb") as f:
        data = f.read()
    with open(chunk, "wb") as f:
        f.write(data[:-3])
    with pytest.raises(CheckpointCorruptionError) as e:
        _restore(step_dir, state, validation="CONTAINS_STATE")
    _one_line(e, chunk, "not a valid zstd chunk")
    os.remove(chunk)
    with pytest.raises(CheckpointCorruptionError) as e:
        _restore(step_dir, state, validation="CONTAINS_STATE")
    _one_line(e, chunk, "is missing")


def test_unknown_savable_class(tmp_path):
    step_dir = _copy(tmp_path)
    with open(os.path.join(step_dir, "index"), encoding="utf-8") as f:
        index = json.load(f)
    index.append(["grain_iter", "<class 'grain.DatasetIterator'>"])
    with open(os.path.join(step_dir, "index"), "w", encoding="utf-8") as f:
        json.dump(index, f)
    with pytest.raises(layout.CheckpointIndexError) as e:
        layout.read_index_file(step_dir)
    _one_line(e, os.path.join(step_dir, "index"), "'grain.DatasetIterator'", "cannot restore")


def test_zarray_link_fifo_huge_and_wrong_types(tmp_path):
    step_dir = _copy(tmp_path)
    zarray = os.path.join(step_dir, "gda", "n", ".zarray")
    os.remove(zarray)
    os.symlink(os.path.join(_TF, "gda", "n", ".zarray"), zarray)
    with pytest.raises(layout.CheckpointIndexError, match=r"gda/n/\.zarray"):
        layout.read_index_file(step_dir)
    os.remove(zarray)
    os.mkfifo(zarray)
    with pytest.raises(layout.CheckpointIndexError, match=r"gda/n/\.zarray"):
        layout.read_index_file(step_dir)  # Refused unopened: no hang.
    os.remove(zarray)
    with open(zarray, "w", encoding="utf-8") as f:
        f.write(" " * (1 << 17))
    with pytest.raises(layout.CheckpointIndexError, match=r"gda/n/\.zarray"):
        layout.read_index_file(step_dir)
    for bad in ("[" * 100 + "]" * 100, '["a"]', '{"zarr_format": 2, "shape": "()"}'):
        with open(zarray, "w", encoding="utf-8") as f:
            f.write(bad)
        with pytest.raises(layout.CheckpointIndexError, match=r"gda/n/\.zarray"):
            layout.read_index_file(step_dir)
    with open(os.path.join(step_dir, "index"), "w", encoding="utf-8") as f:
        f.write('[["step", 1], ["w", {"dtype": "float32", "shape": [3, 4]}]]')
    with pytest.raises(layout.CheckpointIndexError, match="Python tuple of ints"):
        layout.read_index_file(step_dir)


def _fuji_state(step_dir: str) -> dict:
    index = layout.read_index_file(step_dir)
    return {
        leaf["path"]: jax.ShapeDtypeStruct(tuple(leaf["shape"]), jnp.dtype(leaf["dtype"]))
        for leaf in index["leaves"]
    }


def test_checkpointer_restores_axlearn_steps_then_ours_and_gc_counts_them(tmp_path):
    from axlearn.common.checkpointer import Checkpointer  # pylint: disable=import-outside-toplevel

    base = str(tmp_path / "checkpoints")
    shutil.copytree(_FUJI, base)
    cfg = Checkpointer.default_config().set(name="ckptr", dir=base, keep_last_n=3)
    ckptr = cfg.instantiate(parent=None)
    target = _fuji_state(os.path.join(base, "step_00000006"))
    step, restored = ckptr.restore(state=target)
    assert step == 6
    for path in ("model/decoder/output_norm/scale", "prng_key"):
        np.testing.assert_array_equal(
            np.asarray(restored[path]), _ts_read(os.path.join(_FUJI, "step_00000006"), path)
        )
    # Our steps after AXLearn's: keep_last_n=3 counts both layouts.
    ckptr.save(step=7, state=restored)
    ckptr.save(step=8, state=restored)
    ckptr.wait_until_finished()
    ckptr.run_garbage_collection()
    assert [s for s, _ in layout.step_dirs(base)] == [6, 7, 8]
    assert layout.read_index_file(os.path.join(base, "step_00000006"))["layout"] == "axlearn"
    step, again = ckptr.restore(state=target)
    assert step == 8
    np.testing.assert_array_equal(np.asarray(again["prng_key"]), np.asarray(restored["prng_key"]))
    ckptr.stop()


def test_verify_and_list_name_the_layout():
    from axlearn.common.checkpointer import verify  # pylint: disable=import-outside-toplevel

    step_dir = os.path.join(_FUJI, "step_00000006")
    result = verify.verify_checkpoint(step_dir)
    assert result.ok and result.layout == "axlearn", result.errors
    index = layout.read_index_file(step_dir)
    # Invariant: one chunk per array here, and the bytes decoded equal the index's sizes.
    arrays = [leaf for leaf in index["leaves"] if leaf["kind"] == "array"]
    assert result.num_chunks == len(arrays) == 31
    want = sum(int(np.prod(a["shape"])) * jnp.dtype(a["dtype"]).itemsize for a in arrays)
    assert result.num_bytes == want
    infos = verify.list_checkpoints(_FUJI)
    assert [(i.step, i.committed, i.layout, i.error) for i in infos] == [
        (3, True, "axlearn", None),
        (6, True, "axlearn", None),
    ]


def test_verify_reports_missing_and_undecodable_chunks(tmp_path):
    from axlearn.common.checkpointer import verify  # pylint: disable=import-outside-toplevel

    step_dir = _copy(tmp_path)
    os.remove(os.path.join(step_dir, "gda", "w", "0.0"))
    with open(os.path.join(step_dir, "gda", "b", "0"), "wb") as f:
        f.write(b"garbage")
    result = verify.verify_checkpoint(step_dir)
    assert not result.ok
    assert sorted(result.errors) == [
        f"{step_dir}/gda/b/0 (leaf 'b'): not a valid zstd chunk of bfloat16[2] (7 bytes)",
        f"{step_dir}/gda/w/0.0 (leaf 'w'): missing",
    ]


@pytest.mark.slow
def test_launch_trainer_main_continues_axlearn_trainer_dir(tmp_path):
    """AXLearn's fuji-test-v3 trainer dir: restores step 6, trains 7-9, saves step 9 (ours)."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    trainer_dir = str(tmp_path / "run")
    shutil.copytree(os.path.join(_DATA, "fuji-test-v3"), trainer_dir)
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "axlearn.common.launch_trainer_main",
            "--module=text.gpt.c4_trainer",
            "--config=fuji-test-v3",
            "--data_dir=FAKE",
            f"--trainer_dir={trainer_dir}",
            "--jax_backend=cpu",
            "--config_override=max_step=9",
            "--config_override=checkpointer.save_policy.n=3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Restored checkpoint at step 6" in proc.stderr
    base = os.path.join(trainer_dir, "checkpoints")
    assert [s for s, _ in layout.step_dirs(base)][-1] == 9
    index = layout.read_index_file(os.path.join(base, "step_00000009"))
    assert index["step"] == 9 and index.get("layout") is None  # Ours, beside AXLearn's.
    assert layout.read_index_file(os.path.join(base, "step_00000006"))["layout"] == "axlearn"
    # Trained on: the parameters moved from the restored step 6.
    path = "model/decoder/emb/token_emb/weight"
    after = _restore(
        os.path.join(base, "step_00000009"),
        {path: jax.ShapeDtypeStruct((32, 8), jnp.float32)},
        validation="CONTAINS_STATE",
    )[path]
    assert not np.array_equal(
        np.asarray(after), _ts_read(os.path.join(_FUJI, "step_00000006"), path)
    )


def test_our_threefry_key_restores_into_an_rbg_trainer(tmp_path):
    """A checkpoint of ours saved before the trainer selected rbg (its `prng_key` uint32[2])
    restores into an rbg trainer's uint32[4] key as `[a, b, a, b]`; other leaves are unmapped."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.checkpointer import Checkpointer, every_n_steps_policy
    from axlearn.common.config import config_for_function

    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=str(tmp_path / "ckpt"),
        save_policy=config_for_function(every_n_steps_policy).set(n=1),
    )
    key = np.array([7, 11], np.uint32)
    other = np.array([1, 2], np.uint32)  # Not the key: never mapped.
    ckpt = cfg.instantiate(parent=None)
    ckpt.save(step=1, state=dict(prng_key=jnp.asarray(key), other=jnp.asarray(other)))
    ckpt.stop()
    ckpt = cfg.instantiate(parent=None)
    step, out = ckpt.restore(
        state=dict(prng_key=jnp.zeros(4, jnp.uint32), other=jnp.zeros(2, jnp.uint32))
    )
    ckpt.stop()
    assert step == 1
    np.testing.assert_array_equal(np.asarray(out["prng_key"]), [7, 11, 7, 11])
    np.testing.assert_array_equal(np.asarray(out["other"]), other)
    ckpt = cfg.instantiate(parent=None)
    with pytest.raises(tensorstore_restore.StateMismatchError):
        ckpt.restore(state=dict(prng_key=jnp.zeros(2, jnp.uint32), other=jnp.zeros(4, jnp.uint32)))
    ckpt.stop()
