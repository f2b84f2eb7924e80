"""What checkpointing costs a training run: workload P1 through SpmdTrainer, saves vs no saves.

P1 (docs/performance.md): decoder, 2 layers, d=256, 4 heads of 64 (4 KV heads), RoPE theta 5e5,
QK-norm, SwiGLU hidden 1024, tied embedding, vocab 32768, sequence 128, global batch 4, AdamW, fp32,
one device, summaries every step (TensorBoard and metrics.jsonl). About 10.5M parameters: the
checkpointed state (parameters + two AdamW moments + PRNG key + input position) is ~126 MB.

Two arms, each a fresh trainer run of `--steps` steps in a fresh directory, interleaved in ABBA
order over `--rounds` rounds (so drift in the machine's load hits both arms alike):

- save: the checkpointer's default async save every 10 steps (`every_n_steps_policy(n=10)`);
- nosave: the same trainer whose policy never fires.

Numbers, over the window of steps (SKIP, steps - SKIP] (SKIP=5: past the compile, and the
last save's write not cut off by the end of the run; with 60 steps the window holds the saves of
steps 10..50):

- blocking_s_per_save: the trainer's "checkpoint" overhead on save steps (metrics.jsonl), i.e.
  everything the training loop waited for in a save: dispatching the finiteness check (on CPU
  the next step computes it), the input position, the checkpointer's snapshot (on CPU none: the
  save references the state and the next step runs without donation), waiting for the previous
  save. blocking_pct_of_step: that over the median step time of the nosave arm (target < 1%).
  checkpointer_blocking_s / snapshot_s: the checkpointer's own account of the same (SaveStats).
- inflation_pct: wall time of the window, save arm over nosave arm, minus 1 (save steps and any
  step slowed by the background write included; target < 5%). On a shared machine this swings
  with other processes' load; see the per-round values.
- cpu_inflation_pct: process CPU time (all threads) of the window, save arm over nosave arm, minus
  1: the CPU the saves cost (snapshot copy, finiteness reduction, CRC-32s, writes). Stable under
  load; an upper bound of the wall-time inflation on a machine with no idle core.
- non_save_step_ratio: median time of steps that did not save, save arm / nosave arm.
- end_of_run_wait_s: extra seconds `run()` spent after the last step (the last save's write).
- save_cpu_by_thread_s / nosave_cpu_by_thread_s (per round): each arm's window CPU by thread
  name (XLA's compute threads vary by a few % run to run, which is why the wall-time inflation
  needs several rounds).

Every figure is a median over the rounds. Prints one JSON object.

    python benchmarks/checkpoint_in_training.py --rounds 3 --steps 60
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from p1 import p1_trainer_config  # noqa: E402  pylint: disable=wrong-import-position

from axlearn.common.checkpointer import (  # noqa: E402
    Checkpointer,
    checkpoint_paths,
    every_n_steps_policy,
    parse_step_from_dir,
)
from axlearn.common.config import config_for_function  # noqa: E402
from axlearn.common.summary_writer import (  # noqa: E402
    BaseWriter,
    CompositeWriter,
    SummaryWriter,
)
from axlearn.common.trainer import SpmdTrainer  # noqa: E402

SAVE_EVERY = 10
# Steps excluded at each end of a run from the measurement window.
SKIP = 5


class RecordingCheckpointer(Checkpointer):
    """A Checkpointer that keeps the SaveStats of every save (the checkpointer's own account)."""

    def save(self, **kwargs):
        stats = super().save(**kwargs)
        if stats is not None:
            if not hasattr(self, "save_stats"):
                self.save_stats = []
            self.save_stats.append(stats)
        return stats


def thread_cpu_by_name() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads, summed by thread name (Linux).

    XLA's CPU compute threads are "tf_XLAEigen"; Python threads (the loop, the checkpoint
    writer and its chunk writers) are all "python".
    """
    ticks = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # The thread exited meanwhile.
            continue
        totals[name] += (int(fields[11]) + int(fields[12])) / ticks  # utime + stime.
    return dict(totals)


class ClockWriter(BaseWriter):
    """Records (step, process CPU seconds, wall seconds) at each step's summaries (in memory),
    and CPU seconds by thread name at the steps in `thread_steps` (set after instantiation)."""

    thread_steps: frozenset = frozenset()

    def log_config(self, config, step: int = 0) -> None:
        del config, step

    def __call__(self, step: int, values: dict) -> None:
        del values
        if not hasattr(self, "clock"):
            self.clock, self.threads = {}, {}
        self.clock[int(step)] = (time.process_time(), time.perf_counter())
        if int(step) in self.thread_steps:
            self.threads[int(step)] = thread_cpu_by_name()


def p1_saving_trainer_config(trainer_dir: str, *, max_step: int, save: bool) -> SpmdTrainer.Config:
    """The P1 trainer; `save`: checkpoint every SAVE_EVERY steps, else never."""
    # docs/performance.md's measured fp32 matmul peak of this machine; skips the start-up probe.
    cfg = p1_trainer_config(trainer_dir, max_step=max_step, peak_flops_per_device=250e9)
    cfg.save_input_iterator = True
    cfg.summary_writer = CompositeWriter.default_config().set(
        writers=dict(
            tensorboard=SummaryWriter.default_config().set(write_every_n_steps=1),
            clock=ClockWriter.default_config(),
        )
    )
    cfg.checkpointer.save_policy = config_for_function(every_n_steps_policy).set(
        n=SAVE_EVERY if save else 10**8
    )
    cfg.checkpointer.keep_last_n = 1
    cfg.checkpointer.klass = RecordingCheckpointer
    return cfg


def _records(trainer_dir: str) -> list[dict]:
    with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_arm(*, save: bool, steps: int, root: str) -> dict:
    """One fresh run of one arm; returns its measurements over the window (SKIP, steps - SKIP]."""
    trainer_dir = tempfile.mkdtemp(prefix="save_" if save else "nosave_", dir=root)
    cfg = p1_saving_trainer_config(trainer_dir, max_step=steps, save=save)
    trainer = cfg.instantiate(
        parent=None, devices=np.array(jax.devices()[:1]).reshape(cfg.mesh_shape)
    )
    first, last = SKIP, steps - SKIP
    trainer.summary_writer.writers[1].thread_steps = frozenset((first, last))
    trainer.run(jax.random.PRNGKey(0))
    end_wall = time.perf_counter()
    clock = trainer.summary_writer.writers[1].clock
    threads = trainer.summary_writer.writers[1].threads
    records = [r for r in _records(trainer_dir) if first < r["step"] <= last]
    saved = [r for r in records if save and r["step"] % SAVE_EVERY == 0]
    others = [r for r in records if r not in saved]
    stats = [s for s in getattr(trainer.checkpointer, "save_stats", []) if first < s.step <= last]
    result = dict(
        window_wall_s=clock[last][1] - clock[first][1],
        window_cpu_s=clock[last][0] - clock[first][0],
        window_cpu_by_thread_s={
            name: round(cpu - threads[first].get(name, 0.0), 3)
            for name, cpu in threads[last].items()
            if cpu - threads[first].get(name, 0.0) > 0
        },
        median_step_s=statistics.median(r["perf/step_time_s"] for r in records),
        median_non_save_step_s=statistics.median(r["perf/step_time_s"] for r in others),
        blocking_s=[r.get("perf/overhead/checkpoint", 0.0) for r in saved],
        checkpointer_blocking_s=[s.blocking_s for s in stats],
        snapshot_s=[s.snapshot_s for s in stats],
        wait_for_previous_s=[s.wait_for_previous_s for s in stats],
        # From the last step's summaries to the end of run(): the last save's write (if any).
        end_of_run_s=end_wall - clock[steps][1],
        checkpoints=[
            parse_step_from_dir(p)
            for p in checkpoint_paths(os.path.join(trainer_dir, "checkpoints"))
        ],
    )
    shutil.rmtree(trainer_dir, ignore_errors=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    if args.steps < 2 * SKIP + 2 * SAVE_EVERY:
        sys.exit(f"--steps must be >= {2 * SKIP + 2 * SAVE_EVERY}")
    load_before = os.getloadavg()
    root = tempfile.mkdtemp(prefix="checkpoint_in_training_")
    rounds = []
    try:
        for i in range(args.rounds):
            order = (True, False) if i % 2 == 0 else (False, True)
            arms = {}
            for save in order:
                arms["save" if save else "nosave"] = run_arm(save=save, steps=args.steps, root=root)
            rounds.append(arms)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def median(values):
        return statistics.median(values)

    per_round = []
    for arms in rounds:
        save, nosave = arms["save"], arms["nosave"]
        blocking = median(save["blocking_s"])
        per_round.append(
            dict(
                nosave_median_step_s=nosave["median_step_s"],
                save_median_step_s=save["median_step_s"],
                blocking_s_per_save=blocking,
                blocking_pct_of_step=100 * blocking / nosave["median_step_s"],
                max_blocking_s=max(save["blocking_s"]),
                checkpointer_blocking_s=median(save["checkpointer_blocking_s"]),
                snapshot_s=median(save["snapshot_s"]),
                wait_for_previous_s=median(save["wait_for_previous_s"]),
                inflation_pct=100 * (save["window_wall_s"] / nosave["window_wall_s"] - 1),
                cpu_inflation_pct=100 * (save["window_cpu_s"] / nosave["window_cpu_s"] - 1),
                non_save_step_ratio=save["median_non_save_step_s"]
                / nosave["median_non_save_step_s"],
                num_saves=len(save["blocking_s"]),
                end_of_run_wait_s=save["end_of_run_s"] - nosave["end_of_run_s"],
                save_window_wall_s=save["window_wall_s"],
                nosave_window_wall_s=nosave["window_wall_s"],
                save_window_cpu_s=save["window_cpu_s"],
                nosave_window_cpu_s=nosave["window_cpu_s"],
                save_cpu_by_thread_s=save["window_cpu_by_thread_s"],
                nosave_cpu_by_thread_s=nosave["window_cpu_by_thread_s"],
                checkpoints=save["checkpoints"],
            )
        )
    keys = (
        "nosave_median_step_s",
        "save_median_step_s",
        "blocking_s_per_save",
        "blocking_pct_of_step",
        "inflation_pct",
        "cpu_inflation_pct",
        "non_save_step_ratio",
        "end_of_run_wait_s",
        "checkpointer_blocking_s",
        "snapshot_s",
        "wait_for_previous_s",
    )
    summary = {k: round(median([r[k] for r in per_round]), 5) for k in keys}
    print(
        json.dumps(
            dict(
                workload="P1",
                save_every_n_steps=SAVE_EVERY,
                window=f"steps ({SKIP}, {args.steps - SKIP}]",
                steps_per_run=args.steps,
                rounds=args.rounds,
                **summary,
                targets=dict(blocking_pct_of_step="< 1", inflation_pct="< 5"),
                meets_blocking_target=summary["blocking_pct_of_step"] < 1,
                meets_inflation_target=summary["inflation_pct"] < 5,
                per_round=per_round,
                load_average_before=load_before,
                load_average_after=os.getloadavg(),
                device=str(jax.devices()[0].device_kind),
            ),
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
