"""Tests axlearn/cli/local.py: the documented `axlearn local launch` command, for real.

    axlearn local launch --num_processes=2 -- python -m axlearn.common.launch_trainer_main \\
        --module=text.gpt.tiny --config=gpt-tiny --trainer_dir=DIR --data_dir=FAKE \\
        --jax_backend=cpu

runs two `jax.distributed` processes that find each other only through the environment the
launcher sets (the JobSet pods' contract), and trains the same losses as one process with two
devices (the tolerance of tests/common/test_launch_trainer.py). `--config_override=max_step=4`
keeps it short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.common import trainer_test_utils as tu

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 4


def _trainer_command(trainer_dir: str) -> list[str]:
    return [
        sys.executable, "-m", "axlearn.common.launch_trainer_main",
        "--module=text.gpt.tiny", "--config=gpt-tiny", f"--trainer_dir={trainer_dir}",
        "--data_dir=FAKE", "--jax_backend=cpu", f"--config_override=max_step={STEPS}",
    ]  # fmt: skip


def _env(devices: int) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISTRIBUTED_COORDINATOR", "NUM_PROCESSES", "PROCESS_ID")
    }
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.slow
def test_documented_two_process_command_matches_one_process(tmp_path):
    two_dir, one_dir = str(tmp_path / "two"), str(tmp_path / "one")
    launched = subprocess.run(
        [sys.executable, "-m", "axlearn.cli.main", "local", "launch", "--num_processes=2", "--"]
        + _trainer_command(two_dir),
        env=_env(1),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = launched.stdout
    assert launched.returncode == 0, (out + launched.stderr)[-6000:]
    # Every line is prefixed with its process index; both processes trained.
    assert any(line.startswith("[0] ") for line in out.splitlines())
    assert any(line.startswith("[1] ") for line in out.splitlines())
    one = subprocess.run(
        _trainer_command(one_dir), env=_env(2), cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert one.returncode == 0, (one.stdout + one.stderr)[-6000:]
    two_losses = [r["loss"] for r in tu.read_metrics(two_dir)]
    one_losses = [r["loss"] for r in tu.read_metrics(one_dir)]
    assert len(one_losses) == len(two_losses) == STEPS
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-4)
    # The processes took their rank and count from the environment, not from flags.
    with open(os.path.join(two_dir, "launch_trainer_flags"), encoding="utf-8") as f:
        flags = json.load(f)
    assert flags["num_processes"] == 2 and flags["process_id"] == 0
    assert flags["distributed_coordinator"].startswith("127.0.0.1:")
    with open(os.path.join(two_dir, "run_summary.json"), encoding="utf-8") as f:
        assert json.load(f)["environment"]["process_count"] == 2


def test_failing_command_exit_code(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "axlearn.cli.main", "local", "launch", "--num_processes=2", "--"]
        + [sys.executable, "-c", "import os, sys; sys.exit(int(os.environ['PROCESS_ID']) + 4)"],
        env=_env(1),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Process 0 exits 4, process 1 exits 5: whichever is seen first is named with its code.
    assert proc.returncode in (4, 5)
    index = proc.returncode - 4
    assert f"process {index} of 2 exited with code {proc.returncode}" in proc.stderr


def test_gcp_launch_run_runs_the_command_here():
    code = "import os; print('rank', os.environ['PROCESS_ID'], 'of', os.environ['NUM_PROCESSES'])"
    proc = subprocess.run(
        [sys.executable, "-m", "axlearn.cli.main", "gcp", "launch", "run", "--num_processes=2"]
        + ["--", sys.executable, "-c", code],
        env=_env(1),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[0] rank 0 of 2", "[1] rank 1 of 2"]


def test_trainer_dir_of_the_command():
    from axlearn.cli.local import trainer_dir_of

    assert trainer_dir_of(["python", "-m", "x", "--trainer_dir=/tmp/a", "--b=1"]) == "/tmp/a"
    assert trainer_dir_of(["python", "--trainer_dir", "/tmp/b"]) == "/tmp/b"
    assert trainer_dir_of(["python", "-m", "x"]) is None
