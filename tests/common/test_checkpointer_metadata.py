"""Tests axlearn/common/checkpointer/metadata.py and its users: a step whose metadata (index vs
tree, `.zarray` vs index) disagrees is reported by verify, refused or set aside by restore, never
removed by GC; a step whose index was lost with its chunks intact is set aside, never deleted.
Every intact step stays byte-identical and restorable."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.cli.main import main
from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.checkpointer import (
    Checkpointer,
    CorruptCheckpointError,
    every_n_steps_policy,
    metadata,
)
from axlearn.common.config import config_for_function
from tests.common.checkpointer_test_utils import edit_our_index


def _checkpointer(ckpt_dir: str, *, keep_last_n: int = 3, **kwargs) -> Checkpointer:
    return (
        Checkpointer.default_config()
        .set(
            name="ckpt",
            dir=ckpt_dir,
            keep_last_n=keep_last_n,
            save_policy=config_for_function(every_n_steps_policy).set(n=1),
            **kwargs,
        )
        .instantiate(parent=None)
    )


def _state(step: int) -> dict:
    return dict(w=jnp.full((8, 4), float(step)), b=jnp.arange(3.0) + step, it=f"p{step}".encode())


def _target() -> dict:
    return dict(
        w=jax.ShapeDtypeStruct((8, 4), jnp.float32),
        b=jax.ShapeDtypeStruct((3,), jnp.float32),
        it=b"",
    )


def _files(root: str) -> dict[str, bytes]:
    """{path relative to root, set-aside suffix dropped: content} of every file under root."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            path = os.path.join(d, n)
            rel = os.path.relpath(path, root).split(os.sep)
            rel[0] = rel[0][: len("step_00000000")]
            with open(path, "rb") as f:
                out["/".join(rel)] = f.read()
    return out


def _step_files(files: dict[str, bytes], step: int) -> dict[str, bytes]:
    prefix = f"step_{step:08d}/"
    return {k: v for k, v in files.items() if k.startswith(prefix)}


@pytest.fixture(name="ckpt_dir")
def fixture_ckpt_dir(tmp_path):
    """Steps 1, 2, 3 committed."""
    ckpt_dir = str(tmp_path / "ckpt")
    ckpt = _checkpointer(ckpt_dir)
    for step in (1, 2, 3):
        ckpt.save(step=step, state=_state(step))
    ckpt.stop()
    return ckpt_dir


def _edit_json(path: str, fn) -> None:
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    fn(value)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)


def _zarray(step_dir: str) -> str:
    return os.path.join(step_dir, "gda", "w", ".zarray")


def _delete_zarray(step_dir: str):
    os.remove(_zarray(step_dir))


def _garbage_zarray(step_dir: str):
    with open(_zarray(step_dir), "wb") as f:
        f.write(b"\x00garbage{")


def _dtype_zarray(step_dir: str):
    _edit_json(_zarray(step_dir), lambda z: z.update(dtype="<i4"))


def _shape_zarray(step_dir: str):
    _edit_json(_zarray(step_dir), lambda z: z.update(shape=[4, 8], chunks=[4, 8]))


def _index_leaf_removed(step_dir: str):
    def drop(index):
        index["leaves"] = [leaf for leaf in index["leaves"] if leaf["path"] != "b"]

    edit_our_index(step_dir, drop)


def _index_shape_edited(step_dir: str):
    def reshape(index):
        for leaf in index["leaves"]:
            if leaf["path"] == "w":
                leaf["shape"], leaf["chunk_shape"] = [4, 8], [4, 8]

    edit_our_index(step_dir, reshape)


_DAMAGES = [
    _delete_zarray,
    _garbage_zarray,
    _dtype_zarray,
    _shape_zarray,
    _index_leaf_removed,
    _index_shape_edited,
]


@pytest.mark.parametrize("damage", _DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_verify_reports_damaged_metadata(ckpt_dir, damage, capsys):
    """Cases 3 and 4: verify checks the index against the tree and each .zarray against it."""
    step_dir = os.path.join(ckpt_dir, "step_00000003")
    assert ckpt_lib.verify_checkpoint(step_dir).ok
    damage(step_dir)
    result = ckpt_lib.verify_checkpoint(step_dir)
    assert not result.ok
    leaf = "gda/b" if damage is _index_leaf_removed else "gda/w"
    assert any(os.path.join(step_dir, leaf) in e for e in result.errors), result.errors
    assert main(["checkpoint", "verify", ckpt_dir]) == 1
    out = capsys.readouterr().out
    assert "step        3  committed  FAILED" in out and "step        2  committed  OK" in out


@pytest.mark.parametrize("damage", _DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_restore_refuses_damaged_metadata_or_sets_it_aside(ckpt_dir, damage):
    """Cases 4 and 12: restore refuses a step whose metadata disagrees (naming the file and
    --restore_fallback, not a model mismatch); with fallback it sets it aside and restores step
    2; steps 1 and 2 stay byte-identical."""
    before = _files(ckpt_dir)
    damage(os.path.join(ckpt_dir, "step_00000003"))
    damaged = _step_files(_files(ckpt_dir), 3)
    with pytest.raises(CorruptCheckpointError, match="--restore_fallback=previous") as e:
        _checkpointer(ckpt_dir).restore(state=_target())
    assert "step_00000003" in str(e.value) and "StateMismatch" not in str(e.value)
    assert _files(ckpt_dir) == {**_step_files(before, 1), **_step_files(before, 2), **damaged}
    step, restored = _checkpointer(ckpt_dir, restore_fallback="previous").restore(state=_target())
    assert step == 2
    np.testing.assert_array_equal(restored["w"], np.full((8, 4), 2.0, np.float32))
    np.testing.assert_array_equal(restored["b"], np.arange(3.0, dtype=np.float32) + 2)
    assert restored["it"] == b"p2"
    aside = ckpt_lib.set_aside_dirs(ckpt_dir)
    assert [os.path.basename(p)[:22] for p in aside] == ["step_00000003.corrupt-"]
    # Nothing deleted: the damaged step is kept as it was, the intact ones unchanged.
    assert _files(ckpt_dir) == {**_step_files(before, 1), **_step_files(before, 2), **damaged}


def test_gc_sets_a_step_that_fails_verification_aside(tmp_path):
    """Case 5: GC never deletes a step it could not verify; it moves it aside and says so. The
    intact steps it keeps are byte-identical and restore."""
    ckpt_dir = str(tmp_path / "ckpt")
    ckpt = _checkpointer(ckpt_dir, keep_last_n=2)
    for step in (1, 2):
        ckpt.save(step=step, state=_state(step))
    ckpt.wait_until_finished()
    chunk = os.path.join(ckpt_dir, "step_00000001", "gda", "w", "0.0")
    with open(chunk, "r+b") as f:
        f.seek(5)
        byte = f.read(1)
        f.seek(5)
        f.write(bytes([byte[0] ^ 0x10]))
    damaged = _step_files(_files(ckpt_dir), 1)
    kept = _step_files(_files(ckpt_dir), 2)
    ckpt.save(step=3, state=_state(3))  # GC after this commit would remove step 1.
    ckpt.stop()
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt_dir)] == [2, 3]
    aside = ckpt_lib.set_aside_dirs(ckpt_dir)
    assert [os.path.basename(p)[:22] for p in aside] == ["step_00000001.corrupt-"]
    files = _files(ckpt_dir)
    assert _step_files(files, 1) == damaged and _step_files(files, 2) == kept
    # An intact step is still removed by GC as before.
    ckpt = _checkpointer(ckpt_dir, keep_last_n=1)
    assert ckpt.run_garbage_collection() == [os.path.join(ckpt_dir, "step_00000002")]
    step, restored = ckpt.restore(state=_target())
    assert step == 3 and restored["it"] == b"p3"


def test_lost_index_with_intact_chunks_is_set_aside_never_deleted(ckpt_dir, capsys):
    """Case 10: only the index of step 3 deleted: restore resumes from 2 and sets step 3 aside
    (the next save of step 3 cannot delete it); verify does not call it OK."""
    before = _files(ckpt_dir)
    os.remove(os.path.join(ckpt_dir, "step_00000003", "index"))
    assert metadata.chunks_complete(os.path.join(ckpt_dir, "step_00000003"))
    assert main(["checkpoint", "verify", ckpt_dir]) == 1
    assert "index is missing but every chunk" in capsys.readouterr().out
    ckpt = _checkpointer(ckpt_dir, keep_last_n=1)
    step, _ = ckpt.restore(state=_target())
    assert step == 2
    aside = ckpt_lib.set_aside_dirs(ckpt_dir)
    assert [os.path.basename(p)[:24] for p in aside] == ["step_00000003.unindexed-"]
    ckpt.save(step=3, state=_state(3))
    ckpt.stop()
    expected = {
        k[len("step_00000003/") :]: v
        for k, v in _step_files(before, 3).items()
        if not k.endswith("/index")
    }
    assert _aside_files(aside[0]) == expected
    assert ckpt_lib.latest_checkpoint_step(ckpt_dir) == 3
    # An interrupted save (chunks missing) is still an uncommitted directory, not set aside.
    partial = os.path.join(ckpt_dir, "step_00000009")
    os.makedirs(os.path.join(partial, "gda", "w"))
    with open(os.path.join(partial, "gda", "w", ".zarray"), "wb") as f:
        with open(os.path.join(aside[0], "gda", "w", ".zarray"), "rb") as src:
            f.write(src.read())
    assert not metadata.chunks_complete(partial)


def _aside_files(path: str) -> dict[str, bytes]:
    out = {}
    for d, _, names in os.walk(path):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), path).replace(os.sep, "/")] = f.read()
    return out


def test_fallback_with_nothing_left_is_an_error_naming_what_was_set_aside(tmp_path):
    """Case 9: every step corrupt with restore_fallback='previous': an error naming the set-aside
    steps instead of starting over from step 0; it stays an error on the next start."""
    ckpt_dir = str(tmp_path / "ckpt")
    ckpt = _checkpointer(ckpt_dir)
    for step in (1, 2):
        ckpt.save(step=step, state=_state(step))
    ckpt.stop()
    for step in (1, 2):
        _garbage_zarray(os.path.join(ckpt_dir, f"step_{step:08d}"))
    for _ in range(2):
        with pytest.raises(CorruptCheckpointError, match="No intact checkpoint is left") as e:
            _checkpointer(ckpt_dir, restore_fallback="previous").restore(state=_target())
        assert "step_00000001.corrupt-" in str(e.value) and "step_00000002.corrupt-" in str(e.value)
        assert "move those directories out" in str(e.value)
    # Moving them out is the explicit choice to start over.
    for path in ckpt_lib.set_aside_dirs(ckpt_dir):
        os.rename(path, os.path.join(str(tmp_path), os.path.basename(path)))
    assert _checkpointer(ckpt_dir).restore(state=_target())[0] is None
