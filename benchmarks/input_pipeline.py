"""Input pipeline speed on the embedded data vs workload P1's training speed; prints JSON.

Each trial runs in a fresh subprocess (so imports and the first batch are timed as a new run
sees them): import time, time to the first batch (building the Input, opening TFDS, filling
shuffle buffers), then tokens/s over the next `--batches` batches of P1's shape (global batch 4 x
128 tokens), for concatenate-and-split and for packing. Trials are interleaved across modes and
medians of `--trials` (>= 3) are reported.

P1's training throughput: 4 x 128 tokens per step at `--p1_step_seconds` (default 0.25 s, the
middle of the 0.2-0.3 s/step of docs/performance.md for this machine; pass a measured value from the
trainer or plain-JAX benchmark when available). The target is a ratio >= 5.

Usage: python benchmarks/input_pipeline.py [--trials 3] [--batches 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCH, SEQ = 4, 128


def _trial(packing: bool, batches: int) -> dict:
    t0 = time.perf_counter()
    # pylint: disable=import-outside-toplevel
    import tensorflow  # noqa: F401

    from axlearn.common import input_tf_data
    from axlearn.common.config import config_for_function
    from axlearn.experiments.text.common import embedded_vocab_config
    from axlearn.experiments.text.gpt.common import tfds_input

    # pylint: enable=import-outside-toplevel
    t_import = time.perf_counter() - t0
    cfg = input_tf_data.Input.default_config().set(
        name="input",
        is_training=True,
        source=config_for_function(tfds_input).set(
            is_training=True,
            dataset_name="python_docs:1.0.0",
            split="train",
            vocab_cfg=embedded_vocab_config(),
            max_sequence_length=SEQ,
            replace_newlines_with="<n>",
            packing=packing,
        ),
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=BATCH, pad_example_fn=input_tf_data.default_pad_example_fn
        ),
    )
    t1 = time.perf_counter()
    it = iter(cfg.instantiate(parent=None))
    next(it)
    t_first = time.perf_counter() - t1
    t2 = time.perf_counter()
    tokens = 0
    for _ in range(batches):
        b = next(it)
        tokens += b["input_ids"].size
    dt = time.perf_counter() - t2
    return {
        "import_s": t_import,
        "first_batch_s": t_first,
        "tokens_per_s": tokens / dt,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--p1_step_seconds", type=float, default=0.25)
    parser.add_argument("--trial", choices=["concat", "packing"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        print(json.dumps(_trial(args.trial == "packing", args.batches)))
        return
    # Build the embedded data once so no trial pays for it.
    from axlearn.common import embedded_data  # pylint: disable=import-outside-toplevel

    embedded_data.prepare()
    results: dict[str, list] = {"concat": [], "packing": []}
    for _ in range(args.trials):
        for mode in results:
            out = subprocess.run(
                [sys.executable, __file__, "--trial", mode, "--batches", str(args.batches)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    p1_tokens_per_s = BATCH * SEQ / args.p1_step_seconds
    report = {
        "workload": f"embedded python_docs, global batch {BATCH} x {SEQ} tokens, 1 process",
        "p1_step_seconds": args.p1_step_seconds,
        "p1_train_tokens_per_s": p1_tokens_per_s,
        "trials": args.trials,
    }
    for mode, runs in results.items():
        med = {
            k: statistics.median(r[k] for r in runs)
            for k in ("import_s", "first_batch_s", "tokens_per_s")
        }
        report[mode] = {
            "median_tokens_per_s": round(med["tokens_per_s"]),
            "ratio_vs_p1": round(med["tokens_per_s"] / p1_tokens_per_s, 1),
            "median_time_to_first_batch_s": round(med["first_batch_s"], 2),
            "median_import_s": round(med["import_s"], 2),
            "all_tokens_per_s": [round(r["tokens_per_s"]) for r in runs],
            "all_first_batch_s": [round(r["first_batch_s"], 2) for r in runs],
        }
    report["target_ratio"] = 5
    report["meets_target"] = all(report[m]["ratio_vs_p1"] >= 5 for m in results)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
