"""benchmarks/gpu_sweep.py --tiny on CPU, in Pythons (the sweep and its cells) without TensorFlow.

A `sitecustomize` on PYTHONPATH makes tensorflow (and seqio, tensorflow_datasets, tensorboard)
unimportable in every process the sweep starts, as on a bare accelerator machine.
"""

import gzip
import json
import os
import subprocess
import sys

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tests.benchmarks.no_tensorflow import REPO_ROOT, env_without_tensorflow


@pytest.mark.slow
def test_tiny_sweep_without_tensorflow(tmp_path):
    env = env_without_tensorflow(str(tmp_path / "site"))
    script = os.path.join(REPO_ROOT, "benchmarks", "gpu_sweep.py")
    args = ["--tiny", "--batches", "2", "--remats", "none,bogus"]
    bad = subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert bad.returncode != 0
    assert "--remats='bogus' is not a remat choice; choose one of none, save_matmuls" in bad.stderr
    trace_dir = tmp_path / "traces"
    args = ["--tiny", "--batches", "2", "--remats", "full", "--chunks", "none,16", "--steps", "8"]
    args += ["--trace_dir", str(trace_dir)]
    proc = subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(proc.stdout)
    assert result["device"] == "cpu" and result["seq_len"] == 64
    assert [(r["batch"], r["remat"], r["chunk"], r["flag_set"]) for r in result["grid"]] == [
        (2, "full", None, "none"),
        (2, "full", 16, "none"),
    ]
    for row in result["grid"]:
        assert row["fits"] is True, row
        assert row["s_per_step"] > 0 and row["peak_memory_bytes"] > 0
        assert row["tokens_per_s"] == pytest.approx(2 * 64 / row["s_per_step"])
        assert 0 < row["mfu"] and row["compiled_temp_bytes"] > 0
        # The trainer printed the compiled memory and the layers' remat choice at start.
        assert row["trainer_log"].startswith("Compiled memory per device: total ")
        assert row["trainer_log"].endswith("[remat: model.decoder.transformer.layer=full]")
        # Each grid cell's profiler trace, copied out gzipped and named after the cell.
        chunk = row["chunk"] or "none"
        assert row["trace"] == str(trace_dir / f"trace_b2_full_c{chunk}_none.xplane.pb.gz")
        with gzip.open(row["trace"], "rb") as f:
            space = xplane_pb2.XSpace.FromString(f.read())
        assert "/host:CPU" in [p.name for p in space.planes]
    comparison = result["fastest_vs_plain_jax"]
    fastest = max(result["grid"], key=lambda r: r["tokens_per_s"])
    assert comparison["config"] == {k: fastest[k] for k in ("batch", "remat", "chunk", "flag_set")}
    assert comparison["ratio_trainer_over_plain"] == pytest.approx(
        comparison["trainer_s_per_step"] / comparison["plain_jax_s_per_step"]
    )
    (only,) = comparison["rounds"]
    # Same model, same batches, same first losses up to bf16 noise; different initial weights.
    assert abs(only["trainer"]["loss_last"] - only["plain_jax"]["loss_last"]) < 0.5
