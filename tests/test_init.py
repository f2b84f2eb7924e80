"""Tests axlearn/__init__.py: importing axlearn from Python quiets the accelerator probes.

Issue 55 case 6: `trainer.run()` or `InferenceRunner` from a Python script (no CLI) printed
libtpu's `E0000 ... unexpected worker hostname` line on a machine without a TPU, and a TF input
imported before the launcher's set-up printed `failed call to cuInit`.
"""

import os
import subprocess
import sys

import pytest

from axlearn.common.accelerator_probe import has_gpu_device, has_tpu_device

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROBE_VARIABLES = (
    "JAX_PLATFORMS",
    "TPU_SKIP_MDS_QUERY",
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "TPU_WORKER_ID",
    "TF_CPP_MIN_LOG_LEVEL",
)


@pytest.mark.slow  # A subprocess importing JAX and TensorFlow (~35 s on the shared machine).
@pytest.mark.skipif(has_tpu_device() or has_gpu_device(), reason="probes find the accelerator")
def test_python_entry_points_print_no_error_looking_lines():
    env = {k: v for k, v in os.environ.items() if k not in _PROBE_VARIABLES}
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    script = (
        "import axlearn.common.inference\n"
        "import jax, tensorflow as tf\n"
        "print(jax.devices()[0].platform, len(tf.config.list_physical_devices('GPU')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["cpu", "0"]
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("E0")]
    assert error_lines == [], proc.stderr[-3000:]
    for misleading in ("unexpected worker hostname", "Failed to find host bounds", "cuInit"):
        assert misleading not in proc.stderr, proc.stderr[-3000:]
