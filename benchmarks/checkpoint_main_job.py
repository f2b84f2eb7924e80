"""What saving every 10 steps costs the main job (gpt-tiny on 8 CPU devices), from its own logs.

Runs `python -m axlearn.common.launch_trainer_main --module=text.gpt.tiny --config=gpt-tiny`
(300 steps, evaluation every 100, TensorBoard and metrics.jsonl) as subprocesses with an 8-device
CPU platform, in two arms that differ only in the checkpoint policy:

- save: `--config_override=checkpointer.save_policy.n=10` (a save every 10 steps);
- nosave: `--config_override=checkpointer.save_policy.n=1000000` (only the last step's save,
  which the policy always makes and which is outside the compared steps).

The arms alternate (ABBA) over `--rounds`. From each run's metrics.jsonl:

- non_save_step_s: the median `step_time_s` of steps whose interval holds no compile, eval or
  checkpoint time (`excluded_reason` empty);
- non_save_step_ratio: save arm over nosave arm, per round, and the median over rounds;
- per save (save arm): the checkpoint overhead and its parts (`perf/checkpoint/...`);
- the run summary's `checkpoint` section (totals, saves that waited, end-of-run wait).

    python benchmarks/checkpoint_main_job.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVE_EVERY = 10


def run_arm(*, save: bool, root: str, max_step: int, overrides: tuple = ()) -> dict:
    """One run of the main job; returns its step records and run summary."""
    trainer_dir = tempfile.mkdtemp(prefix="save_" if save else "nosave_", dir=root)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    cmd = [
        sys.executable,
        "-m",
        "axlearn.common.launch_trainer_main",
        "--module=text.gpt.tiny",
        "--config=gpt-tiny",
        f"--trainer_dir={trainer_dir}",
        "--jax_backend=cpu",
        f"--config_override=max_step={max_step}",
        f"--config_override=checkpointer.save_policy.n={SAVE_EVERY if save else 1000000}",
    ] + [f"--config_override={o}" for o in overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(trainer_dir, "run_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    shutil.rmtree(trainer_dir, ignore_errors=True)
    return dict(records=records, summary=summary)


def _non_save_steps(records: list) -> list:
    return [r["perf/step_time_s"] for r in records if not r.get("excluded_reason")]


def _median_step(records: list) -> float:
    return statistics.median(_non_save_steps(records))


def _mean_step(records: list) -> float:
    return statistics.mean(_non_save_steps(records))


def _by_offset(records: list) -> dict:
    """Median non-save step time by steps since the last multiple of SAVE_EVERY (1 = the step
    right after a save in the save arm), to show where a slowdown sits."""
    groups: dict = {}
    for r in records:
        if not r.get("excluded_reason"):
            groups.setdefault(r["step"] % SAVE_EVERY, []).append(r["perf/step_time_s"])
    return {k: round(statistics.median(v), 4) for k, v in sorted(groups.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max_step", type=int, default=300)
    parser.add_argument(
        "--config_override",
        action="append",
        default=[],
        help="Applied to both arms, e.g. checkpointer.storage.writer_niceness=0.",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    root = tempfile.mkdtemp(prefix="checkpoint_main_job_")
    rounds = []
    try:
        for i in range(args.rounds):
            order = (True, False) if i % 2 == 0 else (False, True)
            arms = {}
            for save in order:
                arms["save" if save else "nosave"] = run_arm(
                    save=save,
                    root=root,
                    max_step=args.max_step,
                    overrides=tuple(args.config_override),
                )
            rounds.append(arms)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_round = []
    for arms in rounds:
        save, nosave = arms["save"], arms["nosave"]
        saves = [
            r
            for r in save["records"]
            if "perf/overhead/checkpoint" in r and r["step"] < args.max_step
        ]
        per_round.append(
            dict(
                save_non_save_step_s=_median_step(save["records"]),
                nosave_non_save_step_s=_median_step(nosave["records"]),
                non_save_step_ratio=_median_step(save["records"]) / _median_step(nosave["records"]),
                non_save_step_mean_ratio=(
                    _mean_step(save["records"]) / _mean_step(nosave["records"])
                ),
                save_step_s_by_offset=_by_offset(save["records"]),
                nosave_step_s_by_offset=_by_offset(nosave["records"]),
                saves=len(saves),
                blocking_per_save_s=statistics.median(r["perf/overhead/checkpoint"] for r in saves),
                snapshot_per_save_s=statistics.median(
                    r["perf/checkpoint/snapshot_s"] for r in saves
                ),
                wait_for_previous_per_save_s=statistics.median(
                    r["perf/checkpoint/wait_for_previous_s"] for r in saves
                ),
                rest_per_save_s=statistics.median(r["perf/checkpoint/other_s"] for r in saves),
                input_position_per_save_s=statistics.median(
                    r["perf/checkpoint/input_position_s"] for r in saves
                ),
                snapshot=sorted({r["checkpoint_snapshot"] for r in saves}),
                run_summary_checkpoint=save["summary"]["checkpoint"],
                run_summary_snapshot_choice=save["summary"].get("checkpoint_snapshot"),
            )
        )
    example = next(r for r in rounds[0]["save"]["records"] if "perf/overhead/checkpoint" in r)
    print(
        json.dumps(
            dict(
                job="gpt-tiny (README main job), 8 CPU devices",
                save_every=SAVE_EVERY,
                config_overrides=args.config_override,
                max_step=args.max_step,
                rounds=args.rounds,
                non_save_step_ratio=statistics.median(r["non_save_step_ratio"] for r in per_round),
                per_round=per_round,
                example_save_record={
                    k: v for k, v in example.items() if "checkpoint" in k or k == "step"
                },
                load_average_before=load_before,
                load_average_after=os.getloadavg(),
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
