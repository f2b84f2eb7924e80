"""Tests axlearn/common/checkpointer/recovery.py: corrupt checkpoints are never deleted; the
restore refuses (naming the file and flags) or falls back / restores a chosen step on request."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.cli.main import main
from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.checkpointer import Checkpointer, CorruptCheckpointError, every_n_steps_policy
from axlearn.common.config import config_for_function
from tests.common.checkpointer_test_utils import edit_our_index


def _checkpointer(ckpt_dir: str, **kwargs) -> Checkpointer:
    return (
        Checkpointer.default_config()
        .set(
            name="ckpt",
            dir=ckpt_dir,
            keep_last_n=1,
            save_policy=config_for_function(every_n_steps_policy).set(n=1),
            **kwargs,
        )
        .instantiate(parent=None)
    )


def _state(step: int) -> dict:
    return dict(w=jnp.full((8, 4), float(step)), it=f"pos{step}".encode())


def _target() -> dict:
    return dict(w=jax.ShapeDtypeStruct((8, 4), jnp.float32), it=b"")


def _files(root: str) -> dict[str, bytes]:
    """{relative path: content} of every file under root (step dirs renamed: step part kept).

    The run lock (`run.lock`, a trainer's lock on its checkpoint dir) is not checkpoint data.
    """
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            if d == root and n == "run.lock":
                continue
            path = os.path.join(d, n)
            rel = os.path.relpath(path, root).split(os.sep)
            rel[0] = rel[0][: len("step_00000000")]  # A set-aside dir keeps its step prefix.
            with open(path, "rb") as f:
                out["/".join(rel)] = f.read()
    return out


@pytest.fixture(name="ckpt_dir")
def fixture_ckpt_dir(tmp_path):
    """Steps 1, 2, 3 committed (keep_last_n=3 while saving)."""
    ckpt_dir = str(tmp_path / "ckpt")
    ckpt = _checkpointer(ckpt_dir)
    ckpt._config.keep_last_n = 3  # pylint: disable=protected-access
    for step in (1, 2, 3):
        ckpt.save(step=step, state=_state(step))
    ckpt.stop()
    return ckpt_dir


def _truncate_index(step_dir: str):
    path = os.path.join(step_dir, "index")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def _drop_checksum(step_dir: str):
    def drop(index):
        for leaf in index["leaves"]:
            leaf.pop("checksum", None)

    edit_our_index(step_dir, drop)


def _flip_bit(step_dir: str):
    chunk = os.path.join(step_dir, "gda", "w", "0.0")
    with open(chunk, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 1]))


@pytest.mark.parametrize("damage", [_truncate_index, _drop_checksum, _flip_bit])
def test_corrupt_newest_is_refused_and_nothing_deleted(ckpt_dir, damage, capsys):
    step_dir = os.path.join(ckpt_dir, "step_00000003")
    damage(step_dir)
    before = _files(ckpt_dir)
    ckpt = _checkpointer(ckpt_dir)
    with pytest.raises(CorruptCheckpointError) as e:
        ckpt.restore(state=_target())
    message = str(e.value)
    assert step_dir in message and "--restore_fallback=previous" in message
    assert "--restore_step=N" in message and "Nothing was deleted" in message
    if damage is not _flip_bit:
        # Garbage collection (keep_last_n=1) must not count an unreadable newest index as the
        # checkpoint to keep. (Chunk damage is only seen by reading: a refused restore stops
        # the run before any garbage collection.)
        assert ckpt.run_garbage_collection() == []
    ckpt.stop()
    assert _files(ckpt_dir) == before
    # `verify` calls it corrupt (not uncommitted) and exits non-zero.
    result = ckpt_lib.verify_checkpoint(step_dir)
    assert result.committed and not result.ok
    assert main(["checkpoint", "verify", ckpt_dir, "--step", "3"]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("damage", [_truncate_index, _flip_bit])
def test_fallback_previous_sets_the_corrupt_step_aside(ckpt_dir, damage, capsys):
    damage(os.path.join(ckpt_dir, "step_00000003"))
    before = _files(ckpt_dir)
    ckpt = _checkpointer(ckpt_dir, restore_fallback="previous")
    step, restored = ckpt.restore(state=_target())
    assert step == 2
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((8, 4), 2.0))
    assert restored["it"] == b"pos2"
    # Every file is still there; step 3 only moved.
    assert _files(ckpt_dir) == before
    aside = ckpt_lib.set_aside_dirs(ckpt_dir)
    assert len(aside) == 1 and os.path.basename(aside[0]).startswith("step_00000003.corrupt-")
    # Training goes on: step 3 is saved again and GC leaves the set-aside directory alone.
    ckpt.save(step=3, state=_state(3))
    ckpt.save(step=4, state=_state(4))
    ckpt.stop()
    assert ckpt_lib.set_aside_dirs(ckpt_dir) == aside
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt_dir)] == [4]
    assert main(["checkpoint", "list", ckpt_dir]) == 0
    assert f"set aside (never restored or removed): {aside[0]}" in capsys.readouterr().out


def test_restore_fallback_value_is_checked(tmp_path):
    with pytest.raises(ValueError, match=r"restore_fallback must be one of \('none', 'previous'\)"):
        _checkpointer(str(tmp_path), restore_fallback="older")


def test_cli_select_sets_newer_steps_aside(ckpt_dir, capsys):
    assert main(["checkpoint", "select", ckpt_dir, "--step", "2"]) == 0
    assert "resumes from step 2" in capsys.readouterr().out
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt_dir)] == [1, 2]
    ckpt = _checkpointer(ckpt_dir)
    assert ckpt.restore(state=_target())[0] == 2
    ckpt.stop()
    # A damaged step cannot be selected, and nothing changes.
    _flip_bit(os.path.join(ckpt_dir, "step_00000001"))
    assert main(["checkpoint", "select", ckpt_dir, "--step", "1"]) == 1
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt_dir)] == [1, 2]


def test_trainer_refuses_corrupt_index_and_restore_step_chooses(tmp_path):
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    trainer_dir = str(tmp_path)
    ckpt_dir = os.path.join(trainer_dir, "checkpoints")

    def run(max_step, **kwargs):
        cfg = tu.bigram_trainer_config(trainer_dir, max_step=max_step, checkpoint_every=2)
        cfg.checkpointer.keep_last_n = 2
        cfg.set(**kwargs)
        return cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))

    run(6)
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt_dir)] == [4, 6]
    _truncate_index(os.path.join(ckpt_dir, "step_00000006"))
    before = _files(ckpt_dir)
    with pytest.raises(CorruptCheckpointError, match="step_00000006"):
        run(8)
    assert _files(ckpt_dir) == before  # Refused; nothing deleted or moved.
    with pytest.raises(ValueError, match=r"restore_step=5 \(--restore_step\).*\[4, 6\]"):
        run(8, restore_step=5)
    assert _files(ckpt_dir) == before
    # The user chooses step 4: step 6 is set aside (its files intact), training resumes at 4.
    assert run(8, restore_step=4)["step"] == 8
    aside = ckpt_lib.set_aside_dirs(ckpt_dir)
    assert len(aside) == 1 and ".superseded-" in aside[0]
    assert _files(aside[0]) == {
        k[len("step_00000006/") :]: v for k, v in before.items() if k.startswith("step_00000006/")
    }
    # A restart with the same flag resumes from the newest step (8), not 4 again.
    assert run(10, restore_step=4)["step"] == 10
    assert ckpt_lib.set_aside_dirs(ckpt_dir) == aside
    # Issue 38: --restore_step of the set-aside step names its copy and how to bring it back.
    with pytest.raises(ckpt_lib.RestoreStepError) as e:
        run(12, restore_step=6)
    assert f"it was set aside by an earlier --restore_step of an older step as {aside[0]}" in str(
        e.value
    )
    assert f"mv {aside[0]} {os.path.join(ckpt_dir, 'step_00000006')}" in str(e.value)


def test_select_logs_no_error_for_the_steps_it_sets_aside(ckpt_dir, caplog):
    """Issue 29 case 14: a successful `checkpoint select` logs its set-aside steps as info, not as
    ERROR lines; a corrupt step set aside is still an error."""
    with caplog.at_level("INFO"):
        assert main(["checkpoint", "select", ckpt_dir, "--step", "1"]) == 0
    aside = [r for r in caplog.records if "set aside as" in r.getMessage()]
    assert len(aside) == 2 and all(r.levelname == "INFO" for r in aside)
    caplog.clear()
    with caplog.at_level("INFO"):
        ckpt_lib.recovery.set_aside(ckpt_lib.step_dirs(ckpt_dir)[0][1], reason="corrupt")
    assert [r.levelname for r in caplog.records if "set aside as" in r.getMessage()] == ["ERROR"]
