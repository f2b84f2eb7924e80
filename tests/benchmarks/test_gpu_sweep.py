"""benchmarks/gpu_sweep.py --tiny on CPU, in Pythons (the sweep and its cells) without TensorFlow,
and its fp8-vs-bf16 section and fp8 count on hand-built results.

A `sitecustomize` on PYTHONPATH makes tensorflow (and seqio, tensorflow_datasets, tensorboard)
unimportable in every process the sweep starts, as on a bare accelerator machine.
"""

import gzip
import json
import math
import os
import statistics
import subprocess
import sys

import numpy as np
import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tests.benchmarks.no_tensorflow import REPO_ROOT, env_without_tensorflow

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import gpu_sweep  # noqa: E402  pylint: disable=wrong-import-position


def _run(tokens_per_s: float, losses: list, **extra) -> dict:
    """A trainer result as `gpu_sweep.run` returns it (tokens/s of a batch of 128 tokens)."""
    return dict(
        s_per_step=128 / tokens_per_s,
        tokens_per_s=tokens_per_s,
        mfu=0.1,
        peak_memory_bytes=extra.pop("peak", 1000),
        compiled_temp_bytes=10,
        steps_measured=list(range(4, 4 + len(losses))),
        losses_measured=losses,
        loss_mean_measured=sum(losses) / len(losses),
        fits=True,
        **extra,
    )


def test_fp8_vs_bf16_section():
    fp8_info = dict(fp8_layers=["a/linear2"], fp8_matmuls=2, fp8_matmuls_with_amax=2)
    pairs = [
        (_run(100.0, [6.0, 5.0]), _run(150.0, [6.1, 5.1], peak=3000, **fp8_info)),
        (_run(100.0, [6.0, 5.0]), dict(fits=False, error="out of device memory: fp8")),
        (_run(200.0, [4.0, 3.0]), _run(260.0, [4.0, 3.2], peak=2000, **fp8_info)),
    ]
    section = gpu_sweep.fp8_vs_bf16(pairs, amax_history_length=128)
    # The failed fp8 round is reported with its error and left out of the medians.
    assert section["rounds"][1]["fp8"] == dict(fits=False, error="out of device memory: fp8")
    assert section["fp8_errors"] == ["out of device memory: fp8"]
    assert section["rounds"][0]["fp8"]["losses_measured"] == [6.1, 5.1]
    assert section["rounds"][2]["bf16"]["steps_measured"] == [4, 5]
    # Median of the rounds' ratios (1.5 and 1.3), medians of tokens/s and means of loss means.
    assert section["ratio_fp8_over_bf16_tokens_per_s"] == pytest.approx(1.4)
    assert section["fp8_tokens_per_s"] == pytest.approx(205.0)
    assert section["bf16_tokens_per_s"] == pytest.approx(150.0)
    assert section["fp8_s_per_step"] == pytest.approx(statistics.median([128 / 150, 128 / 260]))
    assert section["fp8_loss_mean_measured"] == pytest.approx((5.6 + 3.6) / 2)
    assert section["bf16_loss_mean_measured"] == pytest.approx((5.5 + 3.5) / 2)
    assert section["fp8_peak_memory_bytes"] == 3000 and section["bf16_peak_memory_bytes"] == 1000
    assert section["fp8_matmuls"] == 2 and section["fp8_layers"] == ["a/linear2"]
    assert section["fp8_amax_history_length"] == 128
    # No fp8 run at all: the errors, no ratio.
    failed = gpu_sweep.fp8_vs_bf16(
        [(_run(100.0, [6.0]), dict(fits=None, error="exit 1: no fp8"))], amax_history_length=128
    )
    assert failed["ratio_fp8_over_bf16_tokens_per_s"] is None
    assert failed["fp8_errors"] == ["exit 1: no fp8"] and "fp8_matmuls" not in failed


def test_fp8_usage():
    history = np.zeros((3, 4), np.float32)
    history[:2, 0] = [1.5, 0.25]  # Repeats 0 and 1 recorded an amax, repeat 2 did not.
    params = {
        "decoder": {
            "repeat": {
                "linear2": {
                    "weight": np.ones((3, 8, 8)),
                    "quantized_dot_general": {
                        "input_scale": np.ones(3),
                        "input_amax_history": history,
                    },
                }
            },
            "head": {"quantized_dot_general": {"input_scale": np.ones(())}},
        },
        "other": {"input_scale_like": np.ones(2)},
    }
    assert gpu_sweep.fp8_usage(params) == dict(
        fp8_layers=["decoder/head", "decoder/repeat/linear2"],  # Sorted, as flatten_items.
        fp8_matmuls=4,
        fp8_matmuls_with_amax=2,
    )


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
    args += ["--trace_dir", str(trace_dir), "--fp8"]
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
    # fp8 vs bf16: the fastest cell trained again with fp8 matmuls in the same round.
    fp8 = result["fp8_vs_bf16"]
    assert fp8["config"] == comparison["config"] and fp8["fp8_amax_history_length"] == 128
    (fp8_round,) = fp8["rounds"]
    assert fp8_round["bf16"]["s_per_step"] == only["trainer"]["s_per_step"]
    for key in ("ratio_fp8_over_bf16_tokens_per_s", "fp8_tokens_per_s", "bf16_tokens_per_s"):
        assert math.isfinite(fp8[key]) and fp8[key] > 0, (key, fp8)
    assert fp8["ratio_fp8_over_bf16_tokens_per_s"] == pytest.approx(
        fp8["fp8_tokens_per_s"] / fp8["bf16_tokens_per_s"]
    )
    assert fp8["fp8_peak_memory_bytes"] > 0 and "fp8_errors" not in fp8
    # It really ran in fp8: the three feed-forward and two attention matmuls (fused q/k/v, output)
    # of each of the 2 layers have fp8 state, and every one recorded an input amax (only the fp8
    # dot writes it).
    layer = "decoder/transformer/repeat/layer/"
    assert fp8["fp8_layers"] == [
        layer + "feed_forward/linear1_0",
        layer + "feed_forward/linear1_1",
        layer + "feed_forward/linear2",
        layer + "self_attention/attention/i_proj/i_proj/qkv_proj",
        layer + "self_attention/attention/o_proj",
    ]
    assert fp8["fp8_matmuls"] == 2 * 5
    assert fp8["fp8_matmuls_with_amax"] == fp8["fp8_matmuls"]
    # The losses of the measured steps (steps 4-8 of 8, after SKIP=3): the same initial weights
    # and batches, so they differ only by fp8 rounding. e4m3 keeps 3 mantissa bits (relative
    # error up to 2**-4 per element); averaged over the 64-128-term contractions and the 128
    # tokens of the loss that is far below 1% of the loss (0.25% at most was seen; 0.07% with
    # the feed-forward alone in fp8), while the losses do differ (fp8 changed the arithmetic).
    bf16_losses, fp8_losses = (
        fp8_round["bf16"]["losses_measured"],
        fp8_round["fp8"]["losses_measured"],
    )
    assert (
        fp8_round["fp8"]["steps_measured"] == fp8_round["bf16"]["steps_measured"] == [4, 5, 6, 7, 8]
    )
    assert fp8_losses == pytest.approx(bf16_losses, rel=0.01)
    assert fp8_losses != bf16_losses
    assert fp8["fp8_loss_mean_measured"] == pytest.approx(statistics.fmean(fp8_losses))
    assert fp8["bf16_loss_mean_measured"] == pytest.approx(statistics.fmean(bf16_losses))


@pytest.mark.slow
def test_budget_skips_runs(tmp_path):
    """With the budget spent before the first cell, every run is skipped and the JSON printed."""
    env = env_without_tensorflow(str(tmp_path / "site"))
    script = os.path.join(REPO_ROOT, "benchmarks", "gpu_sweep.py")
    args = ["--tiny", "--batches", "2", "--remats", "none", "--chunks", "none", "--fp8"]
    proc = subprocess.run(
        [sys.executable, script, *args, "--budget_s", "0.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    (row,) = result["grid"]
    assert row["fits"] is None and row["error"] == "skipped: --budget_s=0.5 spent"
    assert result["fastest_vs_plain_jax"] is None and result["fp8_vs_bf16"] is None
