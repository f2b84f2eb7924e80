"""A small trained run shared by the inference, eval, generate and Hugging Face tests.

`trained_dir` (a session fixture, registered in tests/conftest.py) trains
`tests.common.trainer_mp_experiment:gpt-tiny-eval` once per test process with
`launch_trainer_main` in a subprocess; `axlearn(...)` runs the `axlearn` command the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = "tests.common.trainer_mp_experiment"
_ATTENTION = "model.decoder.transformer.layer.self_attention.attention"
# Without QK-norm the model is a Llama (exportable to Hugging Face).
LLAMA_OVERRIDES = [
    f"--config_override={_ATTENTION}.query_scale.norm=None",
    f"--config_override={_ATTENTION}.key_scale.norm=None",
]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _run(args: list[str], *, devices: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *args],
        env=_env(devices),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc


def axlearn(*args: str, devices: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    """Runs `axlearn ARGS...` in a subprocess."""
    return _run(["-m", "axlearn.cli.main", *args], devices=devices, check=check)


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory) -> str:
    """The trainer dir of a finished 6-step run with a checkpoint and an eval at step 6.

    The run uses `--config_override` to drop QK-norm (a Llama architecture).
    """
    trainer_dir = str(tmp_path_factory.mktemp("run") / "gpt")
    _run(
        [
            "-m",
            "axlearn.common.launch_trainer_main",
            f"--module={MODULE}",
            "--config=gpt-tiny-eval",
            f"--trainer_dir={trainer_dir}",
            "--jax_backend=cpu",
            *LLAMA_OVERRIDES,
        ]
    )
    return trainer_dir
