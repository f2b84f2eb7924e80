"""Grain vs tf.data inputs of the main job (gpt-tiny's batch, 16 x 128 tokens); prints JSON.

For each pipeline (tf.data `gpt-tiny`, Grain `gpt-tiny-grain` in-process, and Grain with 2
prefetch worker processes) a fresh subprocess builds the main job's training input and measures:

- `first_batch_s`: building the input and reading its first batch;
- `batches_per_s`: over the next `--batches` batches, and `cpu_ms_per_batch`: the CPU time of
  the process and its worker processes over them (comparable on a loaded machine);
- `position_save_ms`: the input-position part of a checkpoint save, `input.iterator_state(it)`
  (what the trainer calls before each save), median of `--saves` calls, one batch apart.

Trials are interleaved (tf, grain, grain_2_workers, tf, ...) and medians of `--trials` (>= 3) are
reported, with the Grain/tf.data ratios. Run on a quiet machine; the JSON records `uptime`.

Usage: python benchmarks/input_grain.py [--trials 3] [--batches 500] [--saves 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("tf_data", "grain", "grain_2_workers")


def _input_config(mode: str):
    # pylint: disable=import-outside-toplevel,protected-access
    from axlearn.experiments.text.gpt import tiny

    if mode == "tf_data":
        cfg = tiny._input(is_training=True, split="train", global_batch_size=16, seq_len=128)
    else:
        cfg = tiny._grain_input(is_training=True, split="train", global_batch_size=16, seq_len=128)
        cfg.source.num_workers = 2 if mode == "grain_2_workers" else 0
    return cfg.set(name="input")


def _descendants(pid: int) -> list[int]:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its live descendants (Linux /proc)."""
    t = os.times()
    total = t.user + t.system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def _trial(mode: str, batches: int, saves: int) -> dict:
    cfg = _input_config(mode)
    t0 = time.perf_counter()
    inp = cfg.instantiate(parent=None)
    it = iter(inp)
    next(it)
    first = time.perf_counter() - t0
    t1, c1 = time.perf_counter(), _cpu_seconds()
    for _ in range(batches):
        next(it)
    rate = batches / (time.perf_counter() - t1)
    cpu_ms = (_cpu_seconds() - c1) / batches * 1e3
    save_s, size = [], 0
    for _ in range(saves):
        next(it)
        t = time.perf_counter()
        state = inp.iterator_state(it)
        save_s.append(time.perf_counter() - t)
        size = len(state)
    return {
        "first_batch_s": first,
        "batches_per_s": rate,
        "cpu_ms_per_batch": cpu_ms,
        "position_save_ms": statistics.median(save_s) * 1e3,
        "state_bytes": size,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--trial", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        print(json.dumps(_trial(args.trial, args.batches, args.saves)))
        return
    # Build both copies of the embedded data once so no trial pays for it.
    # pylint: disable=import-outside-toplevel
    from axlearn.common import embedded_array_record, embedded_data

    embedded_data.prepare()
    embedded_array_record.prepare_array_record("train")
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    results: dict[str, list] = {mode: [] for mode in MODES}
    for _ in range(args.trials):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--trial", mode, "--batches", str(args.batches)]
                + ["--saves", str(args.saves)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    report = {
        "workload": "gpt-tiny's training input: global batch 16 x 128 tokens, 1 process",
        "trials": args.trials,
        "batches": args.batches,
        "uptime_before": uptime_before,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    keys = ("first_batch_s", "batches_per_s", "cpu_ms_per_batch", "position_save_ms", "state_bytes")
    for mode, runs in results.items():
        report[mode] = {
            f"median_{k}": round(statistics.median(r[k] for r in runs), 4) for k in keys
        }
        report[mode]["all_batches_per_s"] = [round(r["batches_per_s"], 1) for r in runs]
        report[mode]["all_position_save_ms"] = [round(r["position_save_ms"], 4) for r in runs]
    tf_rate = report["tf_data"]["median_batches_per_s"]
    tf_save = report["tf_data"]["median_position_save_ms"]
    for mode in ("grain", "grain_2_workers"):
        report[mode]["batches_per_s_vs_tf_data"] = round(
            report[mode]["median_batches_per_s"] / tf_rate, 2
        )
        report[mode]["cpu_per_batch_vs_tf_data"] = round(
            report[mode]["median_cpu_ms_per_batch"] / report["tf_data"]["median_cpu_ms_per_batch"],
            2,
        )
        report[mode]["position_save_vs_tf_data"] = round(
            report[mode]["median_position_save_ms"] / tf_save, 5
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
