"""Tests axlearn/common/run_lock.py: one run per trainer dir, stale locks taken over."""

import json
import os
import socket
import subprocess
import sys

import jax
import pytest

from axlearn.common.run_lock import LOCK_FILE, RunLock, RunLockError


def test_second_lock_fails_naming_the_owner(tmp_path):
    with RunLock(str(tmp_path)) as first:
        with pytest.raises(RunLockError) as e:
            RunLock(str(tmp_path)).acquire()
        message = str(e.value)
        assert f"pid {os.getpid()}" in message and socket.gethostname() in message
        assert first.path in message and "--trainer_dir" in message
    # Released: the next run takes it.
    with RunLock(str(tmp_path)):
        pass


def _holder(directory: str) -> subprocess.Popen:
    """A child process that holds the run lock of `directory` until killed."""
    code = (
        "import sys, time; from axlearn.common.run_lock import RunLock; "
        f"RunLock({directory!r}).acquire(); print('locked', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_of_a_killed_owner_is_stale(tmp_path):
    proc = _holder(str(tmp_path))
    try:
        with pytest.raises(RunLockError, match=f"pid {proc.pid}"):
            RunLock(str(tmp_path)).acquire()
    finally:
        proc.kill()
        proc.wait()
    # SIGKILLed owner: the kernel dropped its lock; the record says who held it.
    with open(os.path.join(tmp_path, LOCK_FILE), encoding="utf-8") as f:
        assert json.load(f)["pid"] == proc.pid
    with RunLock(str(tmp_path)):
        with open(os.path.join(tmp_path, LOCK_FILE), encoding="utf-8") as f:
            assert json.load(f)["pid"] == os.getpid()


def test_two_trainers_on_one_dir(tmp_path):
    """A second trainer (or launcher) on a busy trainer dir fails at once, writing nothing."""
    from axlearn.common import launch_trainer  # pylint: disable=import-outside-toplevel
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=2)
    proc = _holder(str(tmp_path))  # Stands for a first trainer.
    try:
        with pytest.raises(RunLockError, match="is in use by another run"):
            cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
        with pytest.raises(RunLockError, match=f"pid {proc.pid}"):
            launch_trainer.run_trainer(cfg)
        # (Instantiating the trainer opened its TensorBoard writer; nothing else was written.)
        assert set(os.listdir(tmp_path)) - {"summaries"} == {LOCK_FILE}
    finally:
        proc.kill()
        proc.wait()
    assert launch_trainer.run_trainer(cfg)["step"] == 2


def test_a_trainer_dir_that_is_a_file_is_one_line(tmp_path):
    """Issue 38: a trainer dir that is a file is a RunLockError saying so (not FileExistsError)."""
    path = tmp_path / "a_file"
    path.write_text("data")
    with pytest.raises(RunLockError, match="is a file, not a directory: pass a directory"):
        RunLock(str(path)).acquire()
    assert path.read_text() == "data"


def test_a_fifo_planted_as_run_lock_is_refused_without_blocking(tmp_path):
    """Issue 48: `run.lock` planted as a FIFO: one RunLockError naming it, no hang."""
    os.mkfifo(tmp_path / LOCK_FILE)
    with pytest.raises(RunLockError, match=r"run.lock: only regular files .* a FIFO"):
        RunLock(str(tmp_path)).acquire()
