"""Issue 48, "Lost": one owner per checkpoint directory, and a committed step whose index was lost
is never deleted while the keep policy would keep it (axlearn/common/run_lock.py,
axlearn/common/checkpointer/recovery.py and core.py's garbage collection)."""

import os
import socket
import subprocess
import sys

import jax
import pytest

from axlearn.cli.main import main
from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.run_lock import LOCK_FILE, RunLockError, hold_run_dirs
from tests.common.test_checkpointer_recovery import _checkpointer, _files, _state, _target


def _ckpt(ckpt_dir: str, *, keep_last_n: int) -> ckpt_lib.Checkpointer:
    ckpt = _checkpointer(ckpt_dir)
    ckpt._config.keep_last_n = keep_last_n  # pylint: disable=protected-access
    return ckpt


def _holder(trainer_dir: str, ckpt_dir: str) -> subprocess.Popen:
    """A child process that holds the run locks of a run (trainer dir and checkpoint dir)."""
    code = (
        "import time; from axlearn.common.run_lock import hold_run_dirs\n"
        f"with hold_run_dirs({trainer_dir!r}, {ckpt_dir!r}):\n"
        "    print('locked', flush=True); time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.parametrize("how", ["copied_checkpointer_dir", "linked_checkpoints"])
def test_lost_two_runs_sharing_one_checkpoint_dir_are_refused(tmp_path, how):
    """Lost case: a second run whose checkpoints land in the first run's checkpoint dir (a copied
    config keeping `checkpointer.dir`, or a trainer dir whose `checkpoints/` links to the first
    one's) is refused naming the holder; the first run's committed steps keep their bytes."""
    first_dir = str(tmp_path / "first")
    first_ckpt = os.path.join(first_dir, "checkpoints")
    ckpt = _ckpt(first_ckpt, keep_last_n=5)
    for step in (1, 2):
        ckpt.save(step=step, state=_state(step))
    ckpt.stop()
    before = _files(first_ckpt)
    second_dir = str(tmp_path / "second")
    os.makedirs(second_dir)
    if how == "copied_checkpointer_dir":
        second_ckpt = first_ckpt
    else:
        os.symlink(first_ckpt, os.path.join(second_dir, "checkpoints"))
        second_ckpt = os.path.join(second_dir, "checkpoints")
    proc = _holder(first_dir, first_ckpt)
    try:
        with pytest.raises(RunLockError) as e:
            with hold_run_dirs(second_dir, second_ckpt):
                pass
        message = str(e.value)
        assert "Checkpoint dir (checkpointer.dir)" in message and "in use by another run" in message
        assert f"pid {proc.pid}" in message and socket.gethostname() in message
        assert "started 20" in message and "checkpointer.dir" in message
        # The trainer itself refuses the same way, before it restores or writes a step.
        from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

        cfg = tu.bigram_trainer_config(second_dir, max_step=2)
        cfg.checkpointer.dir = second_ckpt
        with pytest.raises(RunLockError, match=f"pid {proc.pid}"):
            cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    finally:
        proc.kill()
        proc.wait()
    after = _files(first_ckpt)
    assert {k: v for k, v in after.items() if k != LOCK_FILE} == {
        k: v for k, v in before.items() if k != LOCK_FILE
    }
    # Once the first run is gone, the second one may take the directory over.
    with hold_run_dirs(second_dir, second_ckpt) as taken:
        assert len(taken) == 2


def test_one_directory_reached_two_ways_is_locked_once(tmp_path):
    """A checkpoint dir that is the trainer dir (by another path) is one lock, not a refusal."""
    trainer_dir = tmp_path / "t"
    trainer_dir.mkdir()
    os.symlink(trainer_dir, tmp_path / "alias")
    with hold_run_dirs(str(trainer_dir), str(tmp_path / "alias")) as taken:
        assert len(taken) == 1


def test_lost_index_of_a_kept_step_is_never_deleted_by_the_next_commit(tmp_path, capsys):
    """Lost case: a committed step whose index is lost is set aside as unindexed, and the next
    commit does not delete it while keep_last_n would keep its step; verify says what it is and
    how to restore it. Once the policy would drop the step, GC removes it."""
    ckpt_dir = str(tmp_path / "ckpt")
    ckpt = _ckpt(ckpt_dir, keep_last_n=3)
    for step in (1, 2, 3):
        ckpt.save(step=step, state=_state(step))
    ckpt.stop()
    os.remove(os.path.join(ckpt_dir, "step_00000003", "index"))
    aside_files = {k: v for k, v in _files(ckpt_dir).items() if k.startswith("step_00000003/")}
    ckpt = _ckpt(ckpt_dir, keep_last_n=3)
    assert ckpt.restore(state=_target())[0] == 2
    (aside,) = ckpt_lib.set_aside_dirs(ckpt_dir)
    assert os.path.basename(aside).startswith("step_00000003.unindexed-")
    ckpt.save(step=4, state=_state(4))  # The commit runs GC: keep_last_n=3 keeps 2, 3, 4.
    ckpt.wait_until_finished()
    assert ckpt_lib.set_aside_dirs(ckpt_dir) == [aside]
    now = {k: v for k, v in _files(ckpt_dir).items() if k.startswith("step_00000003")}
    assert now == {k: v for k, v in aside_files.items()}
    assert main(["checkpoint", "verify", ckpt_dir]) == 0
    out = capsys.readouterr().out
    assert "a save of step 3 whose index was lost" in out
    assert "kept while keep_last_n would keep its step" in out
    assert "--restore_step=3" in out and os.path.join(aside, "index") in out
    ckpt.save(step=5, state=_state(5))
    ckpt.wait_until_finished()
    assert ckpt_lib.set_aside_dirs(ckpt_dir) == [aside]  # Newer committed: 4, 5 (< 3).
    ckpt.save(step=6, state=_state(6))
    ckpt.stop()
    assert ckpt_lib.set_aside_dirs(ckpt_dir) == []  # 4, 5, 6 are newer: the policy drops 3.
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt_dir)] == [4, 5, 6]


def test_kept_as_if_committed_counts_like_keep_last_n():
    kept = ckpt_lib.recovery.kept_as_if_committed
    assert kept(3, [1, 2, 4], keep_last_n=2)
    assert not kept(3, [1, 2, 4, 5], keep_last_n=2)
    assert kept(10, [1, 11, 12, 13], keep_last_n=1, keep_every_n_steps=5)
    assert not kept(9, [11], keep_last_n=1)
