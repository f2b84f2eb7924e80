"""What checkpointing costs a training run: workload P1 through SpmdTrainer, saves vs no saves.

P1 (DESIGN.md): decoder, 2 layers, d=256, 4 heads of 64 (4 KV heads), RoPE theta 5e5, QK-norm,
SwiGLU hidden 1024, tied embedding, vocab 32768, sequence 128, global batch 4, AdamW, fp32, one
device, summaries every step (TensorBoard and metrics.jsonl). About 10.5M parameters: the
checkpointed state (parameters + two AdamW moments + PRNG key + input position) is ~126 MB.

Two arms, each a fresh trainer run of `--steps` steps in a fresh directory, interleaved in ABBA
order over `--rounds` rounds (so drift in the machine's load hits both arms alike):

- save: the checkpointer's default async save every 10 steps (`every_n_steps_policy(n=10)`);
- nosave: the same trainer whose policy never fires.

Numbers (from each run's metrics.jsonl; step 1, which carries the compile, is excluded):

- blocking_s_per_save: the trainer's "checkpoint" overhead on save steps, i.e. everything the
  training loop waited for in a save (finiteness check of the state, iterator state, snapshot,
  waiting for the previous save). blocking_pct_of_step: that over the median step time of the
  nosave arm (target < 1%).
- inflation_pct: total step time of the save arm over the nosave arm, minus 1, all steps after
  the first (save steps, and steps slowed by the background write, included; target < 5%).
- non_save_step_ratio: median time of steps that did not save, save arm / nosave arm (the
  background write's interference).
- end_of_run_wait_s: seconds `run()` spent after the last step, waiting for the last save.

Every figure is a median over the rounds. Prints one JSON object.

    python benchmarks/checkpoint_in_training.py --rounds 3 --steps 60
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

from axlearn.common import learner, optimizers
from axlearn.common.checkpointer import (
    Checkpointer,
    checkpoint_paths,
    every_n_steps_policy,
    parse_step_from_dir,
)
from axlearn.common.config import config_for_function
from axlearn.common.input_fake import FakeLmInput
from axlearn.common.trainer import SpmdTrainer
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

SEQ, BATCH, VOCAB = 128, 4, 32768
SAVE_EVERY = 10
# The reference trainer's mesh axes (the model's partition specs name them); all of size 1.
MESH_AXIS_NAMES = ("pipeline", "data", "expert", "fsdp", "seq", "model")


class RecordingCheckpointer(Checkpointer):
    """A Checkpointer that keeps the SaveStats of every save (the checkpointer's own account)."""

    def save(self, **kwargs):
        stats = super().save(**kwargs)
        if stats is not None:
            if not hasattr(self, "save_stats"):
                self.save_stats = []
            self.save_stats.append(stats)
        return stats


def p1_trainer_config(trainer_dir: str, *, max_step: int, save: bool) -> SpmdTrainer.Config:
    """The P1 trainer; `save`: checkpoint every SAVE_EVERY steps, else never."""
    cfg = SpmdTrainer.default_config().set(
        name="p1_trainer",
        dir=trainer_dir,
        max_step=max_step,
        mesh_axis_names=MESH_AXIS_NAMES,
        mesh_shape=(1,) * len(MESH_AXIS_NAMES),
        batch_axis_names=("data", "expert", "fsdp", "seq"),
        input=FakeLmInput.default_config().set(
            is_training=True, global_batch_size=BATCH, source_length=SEQ, max_token_id=VOCAB
        ),
        model=transformer_lm_config(
            num_layers=2,
            model_dim=256,
            num_heads=4,
            num_kv_heads=4,
            hidden_dim=1024,
            vocab_size=VOCAB,
            rope_theta=5e5,
            qk_norm=True,
            stack="stack",
        ),
        learner=learner.Learner.default_config().set(
            optimizer=config_for_function(optimizers.adamw_optimizer).set(
                learning_rate=1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01
            )
        ),
        save_input_iterator=True,
        # DESIGN.md's measured fp32 matmul peak of this machine; skips the start-up probe.
        peak_flops_per_device=250e9,
    )
    cfg.summary_writer.write_every_n_steps = 1
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
    """One fresh run of one arm; returns its measurements."""
    trainer_dir = tempfile.mkdtemp(prefix="save_" if save else "nosave_", dir=root)
    cfg = p1_trainer_config(trainer_dir, max_step=steps, save=save)
    trainer = cfg.instantiate(
        parent=None, devices=np.array(jax.devices()[:1]).reshape(cfg.mesh_shape)
    )
    start = time.perf_counter()
    trainer.run(jax.random.PRNGKey(0))
    run_s = time.perf_counter() - start
    end_wall = time.time()
    stats = getattr(trainer.checkpointer, "save_stats", [])
    records = [r for r in _records(trainer_dir) if r["step"] > 1]
    saved = [r for r in records if r["step"] % SAVE_EVERY == 0] if save else []
    others = [r for r in records if r not in saved]
    last_time = max(r["time"] for r in records)
    result = dict(
        total_step_s=sum(r["perf/step_time_s"] for r in records),
        median_step_s=statistics.median(r["perf/step_time_s"] for r in records),
        median_non_save_step_s=statistics.median(r["perf/step_time_s"] for r in others),
        blocking_s=[r.get("perf/overhead/checkpoint", 0.0) for r in saved],
        checkpointer_blocking_s=[s.blocking_s for s in stats],
        snapshot_s=[s.snapshot_s for s in stats],
        wait_for_previous_s=[s.wait_for_previous_s for s in stats],
        save_step_s=[r["perf/step_time_s"] for r in saved],
        run_s=run_s,
        # From the last step's record to the end of run(): the last save's wait and the summary.
        end_of_run_s=end_wall - last_time,
    )
    result["checkpoints"] = [
        parse_step_from_dir(p) for p in checkpoint_paths(os.path.join(trainer_dir, "checkpoints"))
    ]
    shutil.rmtree(trainer_dir, ignore_errors=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    if args.steps < 2 * SAVE_EVERY:
        sys.exit(f"--steps must be >= {2 * SAVE_EVERY}")
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
                inflation_pct=100 * (save["total_step_s"] / nosave["total_step_s"] - 1),
                non_save_step_ratio=save["median_non_save_step_s"]
                / nosave["median_non_save_step_s"],
                num_saves=len(save["blocking_s"]),
                end_of_run_wait_s=save["end_of_run_s"] - nosave["end_of_run_s"],
                save_run_s=save["run_s"],
                nosave_run_s=nosave["run_s"],
                checkpoints=save["checkpoints"],
            )
        )
    keys = (
        "nosave_median_step_s",
        "save_median_step_s",
        "blocking_s_per_save",
        "blocking_pct_of_step",
        "inflation_pct",
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
