"""P1's trainer step time: this checkout vs a baseline checkout, interleaved in one run.

Each round runs P1 (`benchmarks/p1.py`: SpmdTrainer, FakeLmInput, summaries and metrics.jsonl
every step, no eval, no checkpoint saves) in a fresh subprocess whose PYTHONPATH points at one
tree, alternating current, baseline, current, baseline, ... so both sides see the same machine
load. The first 2 steps of each run (compile, warm-up) are dropped. Per run it records the
trainer's reported step time (median of `perf/step_time_s`, the interval between host syncs on
the loss) and, independently, the median interval between consecutive metrics.jsonl records'
wall-clock stamps. Each side's time is the median over its runs; the ratios are current/baseline
of those medians and the median over rounds of each back-to-back pair's ratio (the least noisy
on a shared machine).

Usage:
    git worktree add /tmp/p1base <baseline-commit>
    python benchmarks/p1_vs_baseline.py --baseline /tmp/p1base [--rounds 3] [--steps 40]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SKIP = 2


def _worker(steps: int) -> None:
    """Runs P1 once in this process (axlearn from PYTHONPATH) and prints its times as JSON."""
    # pylint: disable=import-outside-toplevel
    import shutil
    import tempfile

    import jax
    import numpy as np

    sys.path.insert(0, HERE)
    from p1 import MESH_SHAPE, p1_trainer_config

    import axlearn

    trainer_dir = tempfile.mkdtemp(prefix="p1_ab_")
    try:
        # A fixed MFU denominator: skips the start-up matmul probe (the same in both trees).
        cfg = p1_trainer_config(trainer_dir, max_step=steps, peak_flops_per_device=250e9)
        trainer = cfg.instantiate(
            parent=None, devices=np.array(jax.devices()[:1]).reshape(MESH_SHAPE)
        )
        start = time.perf_counter()
        trainer.run(jax.random.PRNGKey(0))
        run_s = time.perf_counter() - start
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    kept = [r for r in records if r["step"] > SKIP]
    stamps = [r["time"] for r in records if r["step"] >= SKIP]
    intervals = [b - a for a, b in zip(stamps, stamps[1:])]
    print(
        json.dumps(
            dict(
                axlearn_file=axlearn.__file__,
                steps=len(records),
                reported_median_s=statistics.median(r["perf/step_time_s"] for r in kept),
                external_median_s=statistics.median(intervals),
                run_wall_s=run_s,
                loss_last=records[-1]["loss"],
            )
        )
    )


def _run_side(tree: str, steps: int) -> dict:
    """One P1 run in a subprocess importing axlearn from `tree`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = tree
    env.setdefault("JAX_PLATFORMS", "cpu")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", "--steps", str(steps)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if out.returncode != 0:
        raise SystemExit(f"P1 run in {tree} failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["axlearn_file"].startswith(os.path.realpath(tree)) and not result[
        "axlearn_file"
    ].startswith(tree):
        raise SystemExit(f"run for {tree} imported axlearn from {result['axlearn_file']}")
    if result["steps"] != steps:
        raise SystemExit(f"run for {tree} wrote {result['steps']} records, expected {steps}")
    return result


def _git_head(tree: str) -> str:
    out = subprocess.run(
        ["git", "-C", tree, "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def main() -> None:
    """Runs the interleaved rounds and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--baseline", help="the baseline checkout's root")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.steps)
        return
    if not args.baseline or not os.path.isdir(os.path.join(args.baseline, "axlearn")):
        raise SystemExit(
            f"--baseline={args.baseline!r} is not a checkout (no axlearn/ in it); make one with "
            "`git worktree add /tmp/p1base <commit>`"
        )
    if args.rounds < 3:
        raise SystemExit(f"--rounds={args.rounds}: use at least 3 (medians of 3)")
    baseline = os.path.abspath(args.baseline)
    load_before = os.getloadavg()
    runs = dict(current=[], baseline=[])
    order = []
    for i in range(args.rounds):
        for side, tree in (("current", REPO), ("baseline", baseline)):
            runs[side].append(_run_side(tree, args.steps))
            order.append(side)
            print(
                f"round {i + 1} {side}: {runs[side][-1]['reported_median_s']:.4f} s/step "
                f"(load {os.getloadavg()[0]:.1f})",
                file=sys.stderr,
                flush=True,
            )
    result = dict(
        workload="P1",
        current_commit=_git_head(REPO),
        baseline_commit=_git_head(baseline),
        steps_per_run=args.steps,
        rounds=args.rounds,
        order=order,
        **summarize(runs),
    )
    result.update(runs=runs, load_average_before=load_before, load_average_after=os.getloadavg())
    print(json.dumps(result, indent=1))


def summarize(runs: dict[str, list[dict]]) -> dict[str, float]:
    """Medians and ratios of interleaved runs.

    Args:
        runs: {"current": [...], "baseline": [...]}, one dict per run (round i of each side ran
            back to back) with "reported_median_s" and "external_median_s".

    Returns:
        Each side's median over its runs of both step times, current/baseline of those medians,
        and the median over rounds of each round's current/baseline ratio (the pair that ran
        back to back shares the machine's load, so this ratio is the least noisy).
    """
    if len(runs["current"]) != len(runs["baseline"]) or not runs["current"]:
        raise ValueError(
            f"runs: {len(runs['current'])} current and {len(runs['baseline'])} baseline runs; "
            "interleaved rounds have one of each"
        )
    out = {}
    for kind in ("reported", "external"):
        key = f"{kind}_median_s"
        for side in ("current", "baseline"):
            out[f"{side}_{key}"] = statistics.median(r[key] for r in runs[side])
        out[f"ratio_{kind}_current_over_baseline"] = (
            out[f"current_{key}"] / out[f"baseline_{key}"]
        )
        out[f"ratio_{kind}_median_of_rounds"] = statistics.median(
            c[key] / b[key] for c, b in zip(runs["current"], runs["baseline"])
        )
    return out


if __name__ == "__main__":
    main()
