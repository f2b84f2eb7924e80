"""Tests for axlearn/common/checkpointer/thread_priority.py and the storage's writer niceness."""

from __future__ import annotations

import os
import threading

import jax
import jax.numpy as jnp
import pytest

from axlearn.common.checkpointer import Checkpointer, TensorStoreStateStorage, thread_priority

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="per-thread niceness is read from /proc (Linux)"
)


def _niceness(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_lower_current_thread_priority_renices_only_the_calling_thread():
    main_before = _niceness(threading.get_native_id())
    seen = {}

    def worker():
        seen["changed"] = thread_priority.lower_current_thread_priority(7)
        seen["tid"] = threading.get_native_id()
        seen["nice"] = _niceness(seen["tid"])
        # Already there: no change.
        seen["again"] = thread_priority.lower_current_thread_priority(7)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["changed"] is (main_before < 7) and seen["nice"] == max(7, main_before)
    assert seen["again"] is False
    assert _niceness(threading.get_native_id()) == main_before
    assert thread_priority.lower_current_thread_priority(0) is False


def test_async_save_writes_at_the_configured_niceness_and_never_renices_the_caller(tmp_path):
    seen = []

    def precondition():  # Runs in the writer thread, after the renice.
        seen.append(_niceness(threading.get_native_id()))

    caller_before = _niceness(threading.get_native_id())
    for async_save, expected in ((True, max(5, caller_before)), (False, caller_before)):
        storage = TensorStoreStateStorage.default_config().set(writer_niceness=5)
        ckpt = (
            Checkpointer.default_config()
            .set(name="c", dir=str(tmp_path / str(async_save)), storage=storage)
            .set(async_save=async_save)
            .instantiate(parent=None)
        )
        with ckpt:
            ckpt.save(step=1, state=dict(x=jnp.ones(4)), force=True, precondition=precondition)
            ckpt.wait_until_finished()
        assert seen[-1] == expected
        assert _niceness(threading.get_native_id()) == caller_before


def test_writer_niceness_is_validated():
    with pytest.raises(ValueError, match=r"writer_niceness must be in \[0, 19\], got 20"):
        TensorStoreStateStorage.default_config().set(writer_niceness=20).instantiate()
    assert jax.default_backend() == "cpu"
    storage = TensorStoreStateStorage.default_config().instantiate()
    assert storage._writer_niceness() == 19  # pylint: disable=protected-access
