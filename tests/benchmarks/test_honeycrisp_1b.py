"""benchmarks/honeycrisp_1b.py: --tiny with --save_every on CPU, in a Python without TensorFlow.

A bare accelerator machine has jax, optax and tensorstore but no TensorFlow; the subprocess
here gets an import hook that makes tensorflow (and seqio, tensorflow_datasets, tensorboard)
unimportable, so the script must run on that path.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.benchmarks.no_tensorflow import REPO_ROOT, env_without_tensorflow


@pytest.mark.slow
def test_tiny_with_saves_without_tensorflow(tmp_path):
    env = env_without_tensorflow(str(tmp_path / "site"))
    runs = tmp_path / "runs"
    runs.mkdir()
    script = os.path.join(REPO_ROOT, "benchmarks", "honeycrisp_1b.py")
    args = ["--tiny", "--steps", "9", "--save_every", "3", "--dir", str(runs)]
    proc = subprocess.run(
        [sys.executable, script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    notices = [line for line in proc.stderr.splitlines() if "TensorFlow is not installed" in line]
    assert notices == [
        "honeycrisp_1b: TensorFlow is not installed; summaries go to metrics.jsonl only."
    ]
    result = json.loads(proc.stdout)
    assert result["xla_python_client_mem_fraction"] == "0.9"
    ckpt = result["checkpoint"]
    # Saves at steps 6 and 9 (after the 3 warm-up steps); the snapshot chosen from numbers.
    assert ckpt["save_every"] == 3 and ckpt["saves"] == 2
    assert ckpt["snapshot"]["mode"] == "device"
    assert ckpt["snapshot"]["chosen"].startswith("checkpoint snapshot: device")
    assert ckpt["snapshot"]["state_bytes"] > 0 and ckpt["snapshot"]["peak_bytes"] > 0
    for key in ("blocking_per_save_s", "snapshot_per_save_s", "wait_for_previous_per_save_s"):
        assert 0 <= ckpt[key]["median"] <= ckpt[key]["max"], key
    # The blocking time is made of its parts.
    assert ckpt["snapshot_per_save_s"]["max"] <= ckpt["blocking_per_save_s"]["max"]
    assert ckpt["non_save_step_ratio"] == pytest.approx(
        ckpt["non_save_step_s_with_saves"] / ckpt["non_save_step_s_without_saves"]
    )
    assert ckpt["end_of_run_wait_s"]["max"] >= 0
    assert ckpt["write_gb_per_s"]["median"] > 0
    # Only the trainer dirs' temporary parent remains, empty.
    assert os.listdir(runs) == []
