"""A Grain input resumes through the trainer on another process count (2 -> 1, 1 -> 2).

Real launches of `launch_trainer_main` (jax.distributed on 127.0.0.1). The run saves at step 4
with N processes and resumes to step 8 with M; the step-8 checkpoint's input states show the
elastic rule was applied: the new feeds start at global position 4 steps x 8 rows = 32 of the
saved run and read on from there (a process of the bigger run that had no state of its own read
process 0's, as the checkpointer does for every per-process bytes leaf).
"""

from __future__ import annotations

import json
import os

import pytest

from axlearn.common.checkpointer import read_index_file
from tests.common.test_launch_trainer import REPO_ROOT, _free_port, _wait

MODULE = "tests.common.grain_mp_experiment"


def _launch_run(trainer_dir: str, config: str, num_processes: int):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    port = _free_port()
    procs = []
    for i in range(num_processes):
        extra = (
            [f"--distributed_coordinator=127.0.0.1:{port}", f"--num_processes={num_processes}"]
            + [f"--process_id={i}"]
            if num_processes > 1
            else []
        )
        cmd = [sys.executable, "-m", "axlearn.common.launch_trainer_main", f"--module={MODULE}"]
        cmd += [f"--config={config}", f"--trainer_dir={trainer_dir}", "--data_dir=FAKE"]
        cmd += ["--jax_backend=cpu", *extra]
        procs.append(
            subprocess.Popen(
                cmd,
                env=env,
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return _wait(procs)


def _input_states(trainer_dir: str, step: int) -> dict:
    step_dir = os.path.join(trainer_dir, "checkpoints", f"step_{step:08d}")
    (leaf,) = [x for x in read_index_file(step_dir)["leaves"] if x["path"] == "input_iter"]
    states = {}
    for process, info in leaf["per_process"].items():
        with open(os.path.join(step_dir, info["file"]), encoding="utf-8") as f:
            states[int(process)] = json.load(f)
    return states


@pytest.mark.slow
@pytest.mark.parametrize("old,new", [(2, 1), (1, 2)])
def test_grain_input_resumes_on_another_process_count(tmp_path, old, new):
    trainer_dir = str(tmp_path / "run")
    _launch_run(trainer_dir, "grain-elastic-4", old)
    saved = _input_states(trainer_dir, 4)
    assert sorted(saved) == list(range(old))
    assert all(s["num_shards"] == old and s["num_batches"] == 4 for s in saved.values())
    assert all(s["rows_per_batch"] == 8 // old for s in saved.values())
    outs = _launch_run(trainer_dir, "grain-elastic-8", new)
    assert "Restored checkpoint at step 4" in outs[0]
    resumed = _input_states(trainer_dir, 8)
    assert sorted(resumed) == list(range(new))
    for process, state in resumed.items():
        # Global positions [0, 32) were read by the saved run; feed p of `new` continues at 32.
        assert state["num_shards"] == new and state["shard_index"] == process
        assert state["start_index"] == 32 and state["batches_since_start"] == 4
        assert state["num_batches"] == 8
