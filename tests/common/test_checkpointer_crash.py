"""Crash safety of axlearn/common/checkpointer: a process SIGKILLed at each fault point."""

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

_SAVER = """
import sys
import jax.numpy as jnp
from axlearn.common.checkpointer import Checkpointer
ckpt = Checkpointer.default_config().set(name="checkpointer", dir=sys.argv[1], keep_last_n=5
    ).instantiate(parent=None)
for step in (1, 2):
    ckpt.save(step=step, state=dict(x=jnp.arange(16.0).reshape(8, 2) + step, it=b"it%d" % step))
    ckpt.wait_until_finished()
print("FINISHED")
"""


@pytest.mark.slow
@pytest.mark.parametrize("point", ckpt_lib.FAULT_POINTS)
def test_kill_at_fault_point_then_resume(tmp_path, point):
    ckpt_dir = str(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    env[ckpt_lib.FAULT_ENV] = f"{point}@2"
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
    assert "FINISHED" not in proc.stdout
    committed = 2 if point == "after_index" else 1
    assert ckpt_lib.latest_checkpoint_step(ckpt_dir) == committed
    # The next start restores the newest committed step...
    ckpt = (
        Checkpointer.default_config()
        .set(name="checkpointer", dir=ckpt_dir, keep_last_n=5)
        .instantiate(parent=None)
    )
    target = dict(x=jnp.zeros((8, 2)), it=b"")
    step, restored = ckpt.restore(state=target)
    assert step == committed
    np.testing.assert_array_equal(np.asarray(restored["x"]), np.arange(16.0).reshape(8, 2) + step)
    assert restored["it"] == b"it%d" % step
    # ... and once a newer step commits, GC has removed the partial directory.
    ckpt.save(step=3, state=restored)
    ckpt.stop()
    assert [s for s, _ in ckpt_lib.step_dirs(ckpt_dir)] == list(range(1, committed + 1)) + [3]
    assert all(ckpt_lib.is_committed(p) for _, p in ckpt_lib.step_dirs(ckpt_dir))
