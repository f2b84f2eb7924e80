"""Durability of committed checkpoints beyond the killed process's page cache.

A writer child is SIGKILLed in the middle of its second save; before the restart the test drops
the kernel's page cache (`echo 1 > /proc/sys/vm/drop_caches`, root only), so the restore and the
checksum verification read the committed step from the storage device, not from pages the dead
writer left in memory. Where dropping the cache is not permitted the test is skipped with that
reason. (Dirty pages are never dropped by the kernel, so this does not simulate a power loss of
unsynced data; saves `syncfs` their files before writing the `index`, which this test relies on:
the committed step is clean, hence dropped and re-read.)
"""

import os
import signal
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.checkpointer import Checkpointer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DROP_CACHES = "/proc/sys/vm/drop_caches"

_SAVER = """
import sys
import numpy as np
import jax.numpy as jnp
from axlearn.common.checkpointer import Checkpointer
ckpt = Checkpointer.default_config().set(name="checkpointer", dir=sys.argv[1], keep_last_n=5
    ).instantiate(parent=None)
for step in (1, 2):
    x = jnp.asarray(np.random.default_rng(step).standard_normal((256, 256), dtype=np.float32))
    ckpt.save(step=step, state=dict(x=x, it=b"it%d" % step))
    ckpt.wait_until_finished()
print("FINISHED")
"""


def _drop_page_cache() -> None:
    with open(_DROP_CACHES, "w", encoding="ascii") as f:
        f.write("1\n")


def _can_drop_page_cache() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, f"dropping the page cache needs root (euid {os.geteuid()})"
    try:
        _drop_page_cache()
    except OSError as e:
        return False, f"writing {_DROP_CACHES} is not permitted here: {e}"
    return True, ""


def test_committed_step_restores_after_kill_and_page_cache_drop(tmp_path):
    ok, reason = _can_drop_page_cache()
    if not ok:
        pytest.skip(reason)
    ckpt_dir = str(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    env[ckpt_lib.FAULT_ENV] = "mid_arrays@2"
    env[ckpt_lib.FAULT_ACTION_ENV] = "kill"
    proc = subprocess.run(
        [sys.executable, "-c", _SAVER, ckpt_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    _drop_page_cache()
    result = ckpt_lib.verify_checkpoint(os.path.join(ckpt_dir, "step_00000001"))
    assert result.ok, result.errors
    ckpt = (
        Checkpointer.default_config()
        .set(name="checkpointer", dir=ckpt_dir, keep_last_n=5)
        .instantiate(parent=None)
    )
    _drop_page_cache()
    step, restored = ckpt.restore(state=dict(x=jnp.zeros((256, 256)), it=b""))
    ckpt.stop()
    assert step == 1 and restored["it"] == b"it1"
    expected = np.random.default_rng(1).standard_normal((256, 256), dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(restored["x"]), expected)
