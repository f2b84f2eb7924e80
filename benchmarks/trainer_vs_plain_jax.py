"""Workload P1 through the full SpmdTrainer vs the same math in a plain-JAX loop.

P1 (docs/performance.md): decoder, 2 layers, d=256, 4 heads of 64 (4 KV heads), RoPE theta 5e5,
QK-norm, SwiGLU hidden 1024, tied embedding, vocab 32768, sequence 128, global batch 4, AdamW, fp32,
one device, summaries every step.

- trainer: `SpmdTrainer` with FakeLmInput, TensorBoard summaries and metrics.jsonl every step,
  no eval, no checkpoints. Its step time is measured two ways: the trainer's own report (median
  of `perf/step_time_s`, the interval between host syncs on the loss) and, independently, the
  mean interval between the wall-clock timestamps of consecutive metrics.jsonl records.
- plain: `benchmarks/plain_jax_lm.py` (the same model, written directly in JAX) with
  `optax.adamw`, fed the same FakeLmInput batches, in a loop that reads step N-1's loss while
  step N runs (pipelined, like the trainer); and the same loop blocking on every step's loss.

Interleaved: each round runs the trainer, then plain JAX; the first 2 steps of each run (compile,
warm-up) are dropped; each side's time is the median over rounds of its per-round median step
time. Also reports the gap to the 0.33 s/step target and the MFU against a CPU matmul probe
measured here.

Prints one JSON object. Usage: python benchmarks/trainer_vs_plain_jax.py [--rounds 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plain_jax_lm  # noqa: E402  pylint: disable=wrong-import-position
from p1 import (  # noqa: E402  pylint: disable=wrong-import-position
    B1,
    B2,
    BATCH,
    EPS,
    LR,
    MESH_SHAPE,
    SEQ,
    VOCAB,
    WD,
    p1_model_config,
    p1_plain_config,
    p1_trainer_config,
)

from axlearn.common.device_peak import device_peak_flops  # noqa: E402
from axlearn.common.flops import lm_training_flops, matmul_param_count  # noqa: E402
from axlearn.common.input_fake import FakeLmInput  # noqa: E402

TARGET_S = 0.33
SKIP = 2


def run_trainer(steps: int, peak: float) -> dict:
    """One fresh trainer run; its reported and its externally timed step times."""
    trainer_dir = tempfile.mkdtemp(prefix="p1_trainer_")
    try:
        cfg = p1_trainer_config(trainer_dir, max_step=steps, peak_flops_per_device=peak)
        trainer = cfg.instantiate(
            parent=None, devices=np.array(jax.devices()[:1]).reshape(MESH_SHAPE)
        )
        trainer.run(jax.random.PRNGKey(0))
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    kept = [r for r in records if r["step"] > SKIP]
    stamps = [r["time"] for r in records if r["step"] >= SKIP]
    intervals = [b - a for a, b in zip(stamps, stamps[1:])]
    return dict(
        reported_median_s=statistics.median(r["perf/step_time_s"] for r in kept),
        external_median_s=statistics.median(intervals),
        loss_first=records[0]["loss"],
        loss_last=records[-1]["loss"],
    )


def run_plain(steps: int, *, pipelined: bool) -> dict:
    """The plain-JAX loop on the same batches: per-step times between host syncs on the loss."""
    cfg = p1_plain_config()
    params = plain_jax_lm.init_params(jax.random.PRNGKey(0), cfg)
    optimizer = optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD)
    opt_state = optimizer.init(params)
    step_fn = plain_jax_lm.make_train_step(cfg, optimizer)
    batches = iter(
        FakeLmInput.default_config()
        .set(
            name="input",
            is_training=True,
            global_batch_size=BATCH,
            source_length=SEQ,
            max_token_id=VOCAB,
        )
        .instantiate(parent=None)
    )
    device = jax.devices()[0]
    times, losses = [], []
    last = time.perf_counter()
    pending = None
    for _ in range(steps):
        batch = jax.device_put(next(batches), device)
        params, opt_state, loss, _ = step_fn(params, opt_state, batch)
        if not pipelined:
            pending = loss
        if pending is not None:
            losses.append(float(pending))
            now = time.perf_counter()
            times.append(now - last)
            last = now
        pending = loss
    if pipelined:
        losses.append(float(pending))
        times.append(time.perf_counter() - last)
    return dict(median_s=statistics.median(times[SKIP:]), loss_last=losses[-1])


def main() -> None:
    """Runs the interleaved rounds and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    load_before = os.getloadavg()
    peak = device_peak_flops(jax.devices()[:1], dtype="float32")
    rounds = []
    for _ in range(args.rounds):
        trainer = run_trainer(args.steps, peak.flops_per_s)
        plain = run_plain(args.steps, pipelined=True)
        plain_sync = run_plain(args.steps, pipelined=False)
        rounds.append(dict(trainer=trainer, plain=plain, plain_blocking=plain_sync))

    def med(key, sub):
        return statistics.median(r[key][sub] for r in rounds)

    trainer_s = med("trainer", "reported_median_s")
    trainer_ext_s = med("trainer", "external_median_s")
    plain_s = med("plain", "median_s")
    plain_sync_s = med("plain_blocking", "median_s")
    model = p1_model_config().set(name="model").instantiate(parent=None)
    flops = lm_training_flops(
        matmul_params=matmul_param_count(model.create_parameter_specs_recursively()),
        num_layers=2,
        num_heads=4,
        per_head_dim=64,
        seq_len=SEQ,
        global_batch_size=BATCH,
    )
    print(
        json.dumps(
            dict(
                workload="P1",
                trainer_s_per_step=trainer_s,
                trainer_external_s_per_step=trainer_ext_s,
                plain_jax_s_per_step=plain_s,
                plain_jax_blocking_s_per_step=plain_sync_s,
                ratio_trainer_over_plain=trainer_s / plain_s,
                ratio_external_over_plain=trainer_ext_s / plain_s,
                # The trainer's reported (pipelined) step time vs plain JAX blocking every step.
                ratio_trainer_over_plain_blocking=trainer_s / plain_sync_s,
                ratio_plain_pipelined_over_blocking=plain_s / plain_sync_s,
                target_s_per_step=TARGET_S,
                gap_to_target_s=trainer_s - TARGET_S,
                model_gflops_per_step=flops.total_flops / 1e9,
                cpu_probe_gflops=peak.flops_per_s / 1e9,
                mfu_trainer=flops.total_flops / trainer_s / peak.flops_per_s,
                mfu_plain=flops.total_flops / plain_s / peak.flops_per_s,
                rounds=rounds,
                load_average_before=load_before,
                load_average_after=os.getloadavg(),
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
