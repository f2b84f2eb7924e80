"""Sweep of G1 (the 1B yardstick) through the trainer: batch x remat x chunked loss x XLA flags.

For every cell of the grid (`--batches` x `--remats` x `--chunks` x `--flag_sets`) a fresh process
trains `g1_config.g1_trainer_config` for `--steps` steps on one accelerator, with the flag set's
XLA_FLAGS (`compiler_options.GPU_XLA_FLAG_SETS`, applied before JAX starts, hence one process per
cell). A cell that runs out of device memory is reported as not fitting. For the fastest fitting
cell, `--rounds` interleaved rounds then run the trainer again and the same configuration written
in plain JAX (`benchmarks/plain_jax_g1.py`), each in its own process.

Per run: s/step (median of the trainer's `perf/step_time_s` after `SKIP` steps; plain JAX: the
median interval between host syncs on the loss, the same definition), MFU (model FLOPs of
`axlearn.common.flops.lm_training_flops` over the device's bf16 peak of
`axlearn.common.device_peak`; the CPU: a measured matmul probe), tokens/s, the device's peak
memory (`device_memory.live_memory_per_device`; the CPU: host RSS), XLA's compiled temp bytes,
and whether it fit. Prints one JSON object. TensorFlow is not needed (no summaries are written).

`--tiny` runs the few-MB model on CPU (seq 64; grid batch 2,4 x remat none,full x chunks none,16
x flag sets none) to check the script; its numbers say nothing about a GPU.

With `--trace_dir DIR` every grid cell also records a 3-step `jax.profiler` trace of its last steps
(left out of its step time) and copies it to DIR, gzipped; `trace_summary.py` says where the
device's time went.

Usage: python benchmarks/gpu_sweep.py [--batches 8,16,32] [--remats none,save_context,full]
    [--chunks none,512] [--flag_sets none,llm_recipe] [--steps 20] [--rounds 3] [--tiny]
    [--trace_dir DIR]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

SKIP = 3
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM")


def _parse_chunks(text: str) -> list[Optional[int]]:
    return [None if c == "none" else int(c) for c in text.split(",") if c]


def _median_step(times: list[float]) -> float:
    kept = times[SKIP:] if len(times) > SKIP else times
    return statistics.median(kept)


def _peak_memory_bytes() -> Optional[int]:
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.device_memory import live_memory_per_device

    memory = live_memory_per_device()
    return memory[0].peak_bytes_in_use if memory else None


def run_trainer_cell(cell: dict) -> dict:
    """Trains one cell's trainer config; returns its step time and memory (in this process)."""
    # pylint: disable=import-outside-toplevel
    import jax
    import numpy as np
    from absl import logging
    from g1_config import g1_trainer_config

    from axlearn.common.summary_writer import NoOpWriter

    logging.set_verbosity(logging.INFO)  # The trainer's start-up lines, as launch_trainer_main.

    trainer_dir = tempfile.mkdtemp(prefix="gpu_sweep_")
    try:
        cfg = g1_trainer_config(
            trainer_dir,
            tiny=cell["tiny"],
            batch=cell["batch"],
            seq=cell["seq"],
            max_step=cell["steps"],
            remat=cell["remat"],
            logits_chunk_size=cell["chunk"],
            peak_flops_per_device=cell["peak_flops"],
        )
        cfg.summary_writer = NoOpWriter.default_config()
        traced = ()
        if cell.get("trace_dir"):
            # The trainer's 3-step profiler trace over the last steps, left out of the median.
            start = max(SKIP + 1, cell["steps"] - 3)
            cfg.start_trace_steps = [start]
            traced = range(start, start + 4)  # The step that stops the trace pays for it.
        device = jax.devices()[0]
        trainer = cfg.instantiate(parent=None, devices=np.array([device]).reshape(1, 1, 1))
        trainer.run(jax.random.PRNGKey(0))
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(trainer_dir, "run_summary.json"), encoding="utf-8") as f:
            compiled = json.load(f).get("compiled_memory")  # CompiledMemory.to_dict() or None.
        trace = _copy_trace(trainer_dir, cell) if traced else None
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    times = [
        r["perf/step_time_s"]
        for r in records
        if "perf/step_time_s" in r and r.get("step") not in traced
    ]
    return dict(
        trace=trace,
        s_per_step=_median_step(times),
        loss_last=records[-1]["loss"],
        peak_memory_bytes=_peak_memory_bytes(),
        compiled_temp_bytes=compiled["temp_bytes"] if compiled is not None else None,
        device=device.device_kind,
    )


def _copy_trace(trainer_dir: str, cell: dict) -> Optional[str]:
    """Copies the trainer's profiler trace (`*.xplane.pb`) into `cell["trace_dir"]`, gzipped,
    named after the cell; returns its path (None if the trace is missing)."""
    found = glob.glob(os.path.join(trainer_dir, "**", "*.xplane.pb"), recursive=True)
    if not found:
        return None
    chunk = cell["chunk"] or "none"
    name = f"trace_b{cell['batch']}_{cell['remat']}_c{chunk}_{cell['flag_set']}.xplane.pb.gz"
    os.makedirs(cell["trace_dir"], exist_ok=True)
    path = os.path.join(cell["trace_dir"], name)
    with open(found[0], "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def run_plain_cell(cell: dict) -> dict:
    """The same configuration in plain JAX: pipelined steps, timed between syncs on the loss."""
    # pylint: disable=import-outside-toplevel
    import jax
    from g1_config import g1_dims
    from plain_jax_g1 import make_plain_g1

    step, state, batches = make_plain_g1(
        g1_dims(cell["tiny"]),
        batch=cell["batch"],
        seq=cell["seq"],
        remat=cell["remat"],
        chunk=cell["chunk"],
    )
    device = jax.devices()[0]
    compiled = step.lower(state, jax.device_put(next(batches), device)).compile()
    memory = compiled.memory_analysis()
    times, pending, last = [], None, time.perf_counter()
    for _ in range(cell["steps"]):
        state, loss = compiled(state, jax.device_put(next(batches), device))
        if pending is not None:
            float(pending)
            now = time.perf_counter()
            times.append(now - last)
            last = now
        pending = loss
    loss_last = float(pending)
    times.append(time.perf_counter() - last)
    return dict(
        s_per_step=_median_step(times),
        loss_last=loss_last,
        peak_memory_bytes=_peak_memory_bytes(),
        compiled_temp_bytes=int(memory.temp_size_in_bytes) if memory is not None else None,
        device=device.device_kind,
    )


def run_cell_in_subprocess(cell: dict, *, timeout_s: float) -> dict:
    """Runs a cell in a fresh process with the flag set's XLA_FLAGS; never raises."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.compiler_options import gpu_xla_flags
    from axlearn.common.gpu_memory import set_default_memory_fraction

    env = dict(os.environ)
    # As the trainer's launch does on a GPU: XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 unless set.
    set_default_memory_fraction(env.get("JAX_PLATFORMS") or None, env)
    flags = gpu_xla_flags(cell["flag_set"])
    env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), flags) if f)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), env.get("PYTHONPATH", "")) if p
    )
    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--cell", json.dumps(cell)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return dict(fits=None, error=f"timed out after {timeout_s:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        result = dict(json.loads(lines[-1]), fits=True)
        # The trainer's own line at start: compiled memory and each layer's remat choice.
        logged = [line for line in proc.stderr.splitlines() if "Compiled memory per device" in line]
        if logged:
            result["trainer_log"] = logged[-1][logged[-1].index("Compiled memory") :]
        return result
    tail = (proc.stderr or proc.stdout)[-1500:]
    if any(marker in tail for marker in OOM_MARKERS):
        return dict(fits=False, error="out of device memory: " + tail.strip().splitlines()[-1])
    return dict(fits=None, error=f"exit {proc.returncode}: {tail.strip()[-600:]}")


def _throughput(result: dict, *, flops: float, tokens: int, peak: float) -> dict:
    step = result.get("s_per_step")
    if not step:
        return result
    return dict(result, mfu=flops / step / peak, tokens_per_s=tokens / step)


def main() -> None:
    """Runs the grid and the plain-JAX comparison; prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tiny", action="store_true", help="The few-MB model on CPU.")
    parser.add_argument("--batches", default=None)
    parser.add_argument("--remats", default=None)
    parser.add_argument("--chunks", default=None, help="Loss chunk sizes; 'none': full logits.")
    parser.add_argument("--flag_sets", default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--rounds", type=int, default=None, help="Trainer vs plain JAX rounds (0: none)."
    )
    parser.add_argument("--timeout_s", type=float, default=1800.0, help="Per process.")
    parser.add_argument(
        "--trace_dir",
        default=None,
        help="Where each grid cell's 3-step profiler trace goes (gzipped .xplane.pb; read it "
        "with trace_summary.py). The traced steps are left out of the step time.",
    )
    args = parser.parse_args()
    if args.cell is not None:
        cell = json.loads(args.cell)
        runner = run_plain_cell if cell["kind"] == "plain" else run_trainer_cell
        print(json.dumps(runner(cell)), flush=True)
        return

    tiny = args.tiny
    batches = [int(b) for b in (args.batches or ("2,4" if tiny else "8,16,32")).split(",")]
    remats = (args.remats or ("none,full" if tiny else "none,save_context,full")).split(",")
    chunks = _parse_chunks(args.chunks or ("none,16" if tiny else "none,512"))
    flag_sets = (args.flag_sets or ("none" if tiny else "none,llm_recipe")).split(",")
    seq = args.seq or (64 if tiny else 2048)
    steps = args.steps or (8 if tiny else 20)
    rounds = args.rounds if args.rounds is not None else (1 if tiny else 3)

    # pylint: disable=import-outside-toplevel
    import jax
    import jax.numpy as jnp
    from g1_config import g1_dims, g1_trainer_config

    from axlearn.common.attention import remat_spec_by_name
    from axlearn.common.compiler_options import gpu_xla_flags
    from axlearn.common.device_peak import device_peak_flops
    from axlearn.common.flops import lm_training_flops, matmul_param_count

    for remat in remats:
        remat_spec_by_name(remat, config_path="--remats")
    for flag_set in flag_sets:
        gpu_xla_flags(flag_set)
    dims = g1_dims(tiny)
    peak = device_peak_flops(jax.devices()[:1], dtype=jnp.bfloat16)
    model = g1_trainer_config("/tmp/unused", tiny=tiny).model.set(name="model")
    specs = model.instantiate(parent=None).create_parameter_specs_recursively()
    base = dict(tiny=tiny, seq=seq, steps=steps, peak_flops=peak.flops_per_s)
    if args.trace_dir and steps < SKIP + 5:
        raise SystemExit(f"--trace_dir needs --steps >= {SKIP + 5} (got {steps}).")

    def flops_of(batch):
        return lm_training_flops(
            matmul_params=matmul_param_count(specs),
            num_layers=dims["num_layers"],
            num_heads=dims["num_heads"],
            per_head_dim=dims["dim"] // dims["num_heads"],
            seq_len=seq,
            global_batch_size=batch,
        ).total_flops

    def run(cell):
        result = run_cell_in_subprocess(cell, timeout_s=args.timeout_s)
        print(json.dumps(dict(cell=cell, **result)), file=sys.stderr, flush=True)
        return _throughput(
            result, flops=flops_of(cell["batch"]), tokens=cell["batch"] * seq, peak=peak.flops_per_s
        )

    grid = []
    for batch, remat, chunk, flag_set in itertools.product(batches, remats, chunks, flag_sets):
        cell = dict(base, kind="trainer", batch=batch, remat=remat, chunk=chunk, flag_set=flag_set)
        if args.trace_dir:
            cell["trace_dir"] = os.path.abspath(args.trace_dir)
        grid.append(dict(batch=batch, remat=remat, chunk=chunk, flag_set=flag_set, **run(cell)))
    fitting = [r for r in grid if r.get("fits") and r.get("s_per_step")]
    comparison = None
    if fitting:
        best = max(fitting, key=lambda r: r["tokens_per_s"])
        cell = dict(base, **{k: best[k] for k in ("batch", "remat", "chunk", "flag_set")})
        pairs = [
            (run(dict(cell, kind="trainer")), run(dict(cell, kind="plain"))) for _ in range(rounds)
        ]
        ok = [(t, p) for t, p in pairs if t.get("s_per_step") and p.get("s_per_step")]
        comparison = dict(
            config={k: best[k] for k in ("batch", "remat", "chunk", "flag_set")},
            rounds=[dict(trainer=t, plain_jax=p) for t, p in pairs],
        )
        if ok:
            trainer_s = statistics.median(t["s_per_step"] for t, _ in ok)
            plain_s = statistics.median(p["s_per_step"] for _, p in ok)
            comparison.update(
                trainer_s_per_step=trainer_s,
                plain_jax_s_per_step=plain_s,
                ratio_trainer_over_plain=trainer_s / plain_s,
                trainer_mfu=flops_of(best["batch"]) / trainer_s / peak.flops_per_s,
                plain_jax_mfu=flops_of(best["batch"]) / plain_s / peak.flops_per_s,
            )
    print(
        json.dumps(
            dict(
                workload="G1" + (" tiny" if tiny else ""),
                device=jax.devices()[0].device_kind,
                peak_tflops=peak.flops_per_s / 1e12,
                peak_source=peak.describe(),
                seq_len=seq,
                steps=steps,
                grid=grid,
                fastest_vs_plain_jax=comparison,
                load_average=os.getloadavg(),
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
