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

With `--fp8` each round also trains the fastest cell with fp8 matmuls
(`g1_trainer_config(fp8=True)`: `FP8ConfigModifier`, amax history 128), right after its bf16
trainer and plain-JAX runs, and the JSON gains `fp8_vs_bf16`: per round the s/step, tokens/s, peak
memory and the losses of the measured steps (those whose time is counted) of both; the fp8/bf16
tokens/s ratio (median of the rounds' ratios); and how many matmuls ran in fp8 (`fp8_matmuls`: the
`input_scale` parameters in the trained state, one per layer and repeat; `fp8_matmuls_with_amax`:
those whose newest input amax is nonzero after training, i.e. the fp8 dot really ran). An fp8 run
that fails (no fp8 support, out of memory) is reported with its error; the sweep goes on.

`--budget_s S` bounds the whole sweep: each process's timeout is cut to what is left of S and a
process that would start with under 10 s left is skipped (reported as such), so the JSON is
printed before an outer time limit (`gpu_checks.sh`) kills the sweep.

With `--trace_dir DIR` every grid cell also records a 3-step `jax.profiler` trace of its last steps
(left out of its step time) and copies it to DIR, gzipped; `trace_summary.py` says where the
device's time went.

Usage: python benchmarks/gpu_sweep.py [--batches 8,16,32] [--remats none,save_context,full]
    [--chunks none,512] [--flag_sets none,llm_recipe] [--steps 20] [--rounds 3] [--tiny]
    [--trace_dir DIR] [--fp8] [--budget_s S]
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


def _measured(items: list) -> list:
    """The items (per step, in step order) whose time counts: all but the first `SKIP`."""
    return items[SKIP:] if len(items) > SKIP else items


def _median_step(times: list[float]) -> float:
    return statistics.median(_measured(times))


def fp8_usage(params) -> dict:
    """How many matmuls of a trained model ran in fp8, from its parameters.

    Args:
        params: The model's parameter tree (nested dicts of arrays) after training.

    Returns:
        `fp8_layers`: the paths of the layers with fp8 state (one `input_scale` each);
        `fp8_matmuls`: their number counting each repeat of a repeated (scanned) layer;
        `fp8_matmuls_with_amax`: of those, how many recorded a nonzero newest input amax (only the
        fp8 dot writes the amax history, so a count below `fp8_matmuls` means some never ran).
    """
    # pylint: disable-next=import-outside-toplevel
    import numpy as np

    from axlearn.common.utils import flatten_items

    suffix = "/quantized_dot_general/"
    flat = dict(flatten_items(params))
    layers, matmuls, with_amax = [], 0, 0
    for path, value in flat.items():
        if not path.endswith(suffix + "input_scale"):
            continue
        layer = path[: -len(suffix + "input_scale")]
        layers.append(layer)
        matmuls += int(np.size(value))
        history = flat.get(layer + suffix + "input_amax_history")
        if history is not None:  # [..., length], newest first.
            with_amax += int(np.sum(np.asarray(history, np.float32)[..., 0] > 0))
    return dict(fp8_layers=layers, fp8_matmuls=matmuls, fp8_matmuls_with_amax=with_amax)


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
            fp8=cell.get("fp8", False),
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
        fp8 = fp8_usage(trainer.trainer_state.model) if cell.get("fp8") else {}
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(trainer_dir, "run_summary.json"), encoding="utf-8") as f:
            compiled = json.load(f).get("compiled_memory")  # CompiledMemory.to_dict() or None.
        trace = _copy_trace(trainer_dir, cell) if traced else None
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    timed = [r for r in records if "perf/step_time_s" in r and r.get("step") not in traced]
    measured = _measured(timed)
    losses = [r["loss"] for r in measured]
    return dict(
        trace=trace,
        s_per_step=statistics.median(r["perf/step_time_s"] for r in measured),
        loss_last=records[-1]["loss"],
        steps_measured=[r["step"] for r in measured],
        losses_measured=losses,
        loss_mean_measured=statistics.fmean(losses),
        **fp8,
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


def fp8_vs_bf16(pairs: list[tuple[dict, dict]], *, amax_history_length: int) -> dict:
    """The fp8-vs-bf16 section of the sweep's JSON, from the rounds' trainer results.

    Args:
        pairs: Per round, the bf16 and the fp8 trainer result of the same cell (as `run` returns:
            with `s_per_step`, `tokens_per_s`, ... or with `error` where the run failed).
        amax_history_length: The fp8 runs' amax history length (recorded).

    Returns:
        `rounds` (per round, each run's s/step, tokens/s, MFU, peak memory, per-step losses and
        their mean over the measured steps, or its error); over the rounds where both ran: the
        median s/step and tokens/s of each, `ratio_fp8_over_bf16_tokens_per_s` (the median of the
        rounds' ratios; None where no round has both), the mean of each run's measured-loss mean,
        and the fp8 run's peak memory (max) and fp8 usage (`fp8_usage`); `fp8_errors` if any.
    """
    keys = ("s_per_step", "tokens_per_s", "mfu", "peak_memory_bytes", "compiled_temp_bytes")
    keys += ("steps_measured", "losses_measured", "loss_mean_measured")

    def summary(result: dict) -> dict:
        if not result.get("s_per_step"):
            return dict(fits=result.get("fits"), error=result.get("error", "no step time"))
        return {k: result.get(k) for k in keys}

    section = dict(
        fp8_amax_history_length=amax_history_length,
        rounds=[dict(bf16=summary(b), fp8=summary(f)) for b, f in pairs],
        ratio_fp8_over_bf16_tokens_per_s=None,
    )
    errors = [summary(f)["error"] for _, f in pairs if not f.get("s_per_step")]
    if errors:
        section["fp8_errors"] = errors
    fp8_ran = [f for _, f in pairs if f.get("s_per_step")]
    if fp8_ran:
        section.update(
            fp8_layers=fp8_ran[-1].get("fp8_layers"),
            fp8_matmuls=fp8_ran[-1].get("fp8_matmuls"),
            fp8_matmuls_with_amax=min(f.get("fp8_matmuls_with_amax", 0) for f in fp8_ran),
            fp8_peak_memory_bytes=max((f.get("peak_memory_bytes") or 0) for f in fp8_ran),
        )
    ok = [(b, f) for b, f in pairs if b.get("s_per_step") and f.get("s_per_step")]
    if ok:
        for name, runs in (("bf16", [b for b, _ in ok]), ("fp8", [f for _, f in ok])):
            section[f"{name}_s_per_step"] = statistics.median(r["s_per_step"] for r in runs)
            section[f"{name}_tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in runs)
            section[f"{name}_loss_mean_measured"] = statistics.fmean(
                r["loss_mean_measured"] for r in runs
            )
        section["bf16_peak_memory_bytes"] = max((b.get("peak_memory_bytes") or 0) for b, _ in ok)
        section["ratio_fp8_over_bf16_tokens_per_s"] = statistics.median(
            f["tokens_per_s"] / b["tokens_per_s"] for b, f in ok
        )
    return section


def main() -> None:
    """Runs the grid and the plain-JAX comparison; prints the JSON result."""
    started = time.monotonic()
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
        "--budget_s",
        type=float,
        default=None,
        help="Seconds for the whole sweep: each process's timeout is cut to what is left and a "
        "process that would start with under 10 s left is skipped, so the JSON is printed in time.",
    )
    parser.add_argument(
        "--trace_dir",
        default=None,
        help="Where each grid cell's 3-step profiler trace goes (gzipped .xplane.pb; read it "
        "with trace_summary.py). The traced steps are left out of the step time.",
    )
    parser.add_argument(
        "--fp8",
        action="store_true",
        help="Each round also trains the fastest cell with fp8 matmuls (JSON: fp8_vs_bf16).",
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
    from g1_config import FP8_AMAX_HISTORY_LENGTH, g1_dims, g1_trainer_config

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
    base = dict(tiny=tiny, seq=seq, steps=steps, peak_flops=peak.flops_per_s, fp8=False)
    if args.trace_dir and steps < SKIP + 5:
        raise SystemExit(f"--trace_dir needs --steps >= {SKIP + 5} (got {steps}).")
    if args.fp8 and rounds < 1:
        raise SystemExit(f"--fp8 runs in the comparison rounds: set --rounds >= 1 (got {rounds}).")

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
        left = None if args.budget_s is None else args.budget_s - (time.monotonic() - started)
        if left is not None and left < 10:
            result = dict(fits=None, error=f"skipped: --budget_s={args.budget_s:g} spent")
        else:
            timeout_s = args.timeout_s if left is None else min(args.timeout_s, left)
            result = run_cell_in_subprocess(cell, timeout_s=timeout_s)
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
    comparison = fp8_section = None
    if fitting:
        best = max(fitting, key=lambda r: r["tokens_per_s"])
        config = {k: best[k] for k in ("batch", "remat", "chunk", "flag_set")}
        cell = dict(base, **config)
        pairs, fp8_pairs = [], []
        for _ in range(rounds):  # Alternating: bf16 trainer, plain JAX, fp8 trainer.
            pairs.append((run(dict(cell, kind="trainer")), run(dict(cell, kind="plain"))))
            if args.fp8:
                fp8_pairs.append((pairs[-1][0], run(dict(cell, kind="trainer", fp8=True))))
        if args.fp8:
            fp8_section = dict(
                config=config,
                **fp8_vs_bf16(fp8_pairs, amax_history_length=FP8_AMAX_HISTORY_LENGTH),
            )
        ok = [(t, p) for t, p in pairs if t.get("s_per_step") and p.get("s_per_step")]
        comparison = dict(
            config=config,
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
                **(dict(fp8_vs_bf16=fp8_section) if args.fp8 else {}),
                load_average=os.getloadavg(),
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
