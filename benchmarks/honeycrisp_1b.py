"""A ~1B-parameter honeycrisp-structured model trained in bf16 through SpmdTrainer on one device.

The model is written in the reference dump's structure (`config_variants.dump_structured_model`:
GroupedQueryAttention with RoFormerQKVLinear over FusedGroupedQKVLinear, QK-norm, causal,
RepeatedTransformerLayer, z-loss 1e-6, tied head) at dim 2048, 20 layers, 16 query / 8 KV heads of
128, SwiGLU hidden 5632, vocab 49152 (about 1.0B parameters); fp32 parameters and optimizer
state, bf16 compute (`train_dtype`), sequence 2048, global batch 8, FakeLmInput, AdamW, summaries
every 100 steps. `--attention flash` uses FlashAttention (cuDNN on GPU for bf16).

Prints one JSON object: parameters, model FLOPs per step, median step time after 3 warm-up steps,
MFU against the device's peak (axlearn.common.device_peak; H100/H200 bf16 dense), tokens/s.

`--save_every N` adds checkpoints: each round runs the trainer twice, without saves and with a
save every N steps (the default checkpointer, its snapshot chosen from memory numbers), in
alternating order over `--rounds`. The JSON then also holds, over the saves after the warm-up:
the blocking time per save (median, max) and its parts (snapshot, waiting for the previous save,
rest), the snapshot mode chosen and its numbers, the write throughput of each save, the non-save
step time with and without saves (and their ratio), and the end-of-run wait for the last write.

Needs jax, optax and tensorstore, not TensorFlow: without TensorFlow the summaries go to
metrics.jsonl only (one line says so on stderr). On an accelerator for the 1B size; `--tiny`
runs a few-MB version of the same structure on CPU to check the script.

Usage: python benchmarks/honeycrisp_1b.py [--steps 20] [--attention flash|plain] [--tiny]
    [--save_every N [--rounds R]]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Before the GPU backend starts: the training share of GPU memory (see gpu_memory.py).
from axlearn.common import gpu_memory  # noqa: E402

gpu_memory.set_default_memory_fraction(None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from g1_config import DIMS_1B, DIMS_TINY, g1_trainer_config  # noqa: E402

from axlearn.common.checkpointer import Checkpointer, every_n_steps_policy  # noqa: E402
from axlearn.common.config import config_for_function  # noqa: E402
from axlearn.common.device_peak import device_peak_flops  # noqa: E402
from axlearn.common.flops import lm_training_flops, matmul_param_count  # noqa: E402
from axlearn.common.summary_writer import NoOpWriter  # noqa: E402
from axlearn.common.trainer import SpmdTrainer  # noqa: E402

SKIP = 3


class RecordingCheckpointer(Checkpointer):
    """A Checkpointer that keeps the SaveStats of every save and the result of every write."""

    def save(self, **kwargs):
        stats = super().save(**kwargs)
        if stats is not None:
            self.__dict__.setdefault("save_stats", []).append(stats)
            if stats.previous is not None:
                self.__dict__.setdefault("write_results", []).append(stats.previous)
        return stats

    def wait_until_finished(self):
        result = super().wait_until_finished()
        if result is not None:
            self.__dict__.setdefault("write_results", []).append(result)
        return result


def has_tensorflow() -> bool:
    """Whether TensorFlow can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


def _median_max(values: list) -> dict:
    values = [float(v) for v in values]
    if not values:
        return dict(median=None, max=None)
    return dict(median=statistics.median(values), max=max(values))


def trainer_config(
    args, dims: dict, *, trainer_dir: str, save_every: int, peak
) -> SpmdTrainer.Config:
    """The benchmark's trainer (G1, `g1_config`); a save every `save_every` steps (0: never)."""
    del dims  # The sizes are g1_config's (DIMS_TINY with --tiny, else DIMS_1B).
    seq, batch = (32, 2) if args.tiny else (args.seq, args.batch)
    cfg = g1_trainer_config(
        trainer_dir,
        tiny=args.tiny,
        batch=batch,
        seq=seq,
        max_step=args.steps,
        attention=args.attention,
        peak_flops_per_device=peak.flops_per_s,
    ).set(name="honeycrisp_1b")
    if not has_tensorflow():
        cfg.summary_writer = NoOpWriter.default_config()
    else:
        cfg.summary_writer.write_every_n_steps = 100
    cfg.checkpointer.klass = RecordingCheckpointer
    cfg.checkpointer.keep_last_n = 1
    cfg.checkpointer.save_policy = config_for_function(every_n_steps_policy).set(
        n=save_every or 10**8
    )
    return cfg


def run_arm(args, dims: dict, *, save_every: int, device, peak) -> dict:
    """One fresh trainer run; returns its records, run summary and checkpointer's account."""
    trainer_dir = tempfile.mkdtemp(prefix="honeycrisp_1b_", dir=args.dir)
    try:
        cfg = trainer_config(args, dims, trainer_dir=trainer_dir, save_every=save_every, peak=peak)
        trainer = cfg.instantiate(parent=None, devices=np.array([device]).reshape(1, 1, 1))
        trainer.run(jax.random.PRNGKey(0))
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(trainer_dir, "run_summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        choice = trainer._checkpoints.snapshot_choice  # pylint: disable=protected-access
        return dict(
            records=records,
            summary=summary,
            specs=trainer.model.create_parameter_specs_recursively(),
            save_stats=getattr(trainer.checkpointer, "save_stats", []),
            write_results=getattr(trainer.checkpointer, "write_results", []),
            choice=choice,
        )
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)


def _step_times(records: list, *, exclude_saves: bool) -> list:
    return [
        r["perf/step_time_s"]
        for r in records
        if r["step"] > SKIP
        and "perf/step_time_s" in r
        and not (exclude_saves and "perf/overhead/checkpoint" in r)
    ]


def checkpoint_report(save_arms: list, nosave_arms: list, *, save_every: int) -> dict:
    """The checkpoint numbers over the save arms (saves after the warm-up steps)."""
    saves = [
        r
        for arm in save_arms
        for r in arm["records"]
        if r["step"] > SKIP and "checkpoint_snapshot" in r
    ]

    def across_arms(arms: list, stat) -> float:
        """The median over arms of `stat` of each arm's non-save step times."""
        return statistics.median(
            stat(_step_times(arm["records"], exclude_saves=True)) for arm in arms
        )

    non_save_with = across_arms(save_arms, statistics.median)
    non_save_without = across_arms(nosave_arms, statistics.median)
    # The median hides a few very slow steps (e.g. while a save's transfer runs); the mean not.
    mean_with = across_arms(save_arms, statistics.mean)
    mean_without = across_arms(nosave_arms, statistics.mean)
    writes = [w for arm in save_arms for w in arm["write_results"]]
    choice = save_arms[0]["choice"]
    step_s = non_save_without
    snapshot_max = max((r["perf/checkpoint/snapshot_s"] for r in saves), default=None)
    blocking_max = max((r["perf/overhead/checkpoint"] for r in saves), default=None)
    return dict(
        save_every=save_every,
        saves=len(saves),
        snapshot=dict(
            mode=choice.mode if choice is not None else None,
            chosen=choice.describe() if choice is not None else None,
            **({k: v for k, v in choice.to_dict().items() if k != "mode"} if choice else {}),
            per_save=sorted({r["checkpoint_snapshot"] for r in saves}),
        ),
        blocking_per_save_s=_median_max([r["perf/overhead/checkpoint"] for r in saves]),
        snapshot_per_save_s=_median_max([r["perf/checkpoint/snapshot_s"] for r in saves]),
        wait_for_previous_per_save_s=_median_max(
            [r["perf/checkpoint/wait_for_previous_s"] for r in saves]
        ),
        rest_per_save_s=_median_max([r["perf/checkpoint/other_s"] for r in saves]),
        saves_that_waited=sum(
            arm["summary"]["checkpoint"]["saves_that_waited"] for arm in save_arms
        ),
        write_s=_median_max([w.write_s for w in writes]),
        write_gb_per_s=_median_max([w.write_gb_per_s for w in writes]),
        transfer_s=_median_max([w.transfer_s for w in writes]),
        written_gb_per_save=(writes[0].num_bytes / 1e9) if writes else None,
        non_save_step_s_with_saves=non_save_with,
        non_save_step_s_without_saves=non_save_without,
        non_save_step_ratio=non_save_with / non_save_without,
        non_save_step_mean_s_with_saves=mean_with,
        non_save_step_mean_s_without_saves=mean_without,
        non_save_step_mean_ratio=mean_with / mean_without,
        # Every step of the first save arm after the warm-up: (step, seconds, was a save).
        step_times_first_save_arm=[
            (r["step"], round(r["perf/step_time_s"], 4), "perf/overhead/checkpoint" in r)
            for r in save_arms[0]["records"]
            if r["step"] > SKIP and "perf/step_time_s" in r
        ],
        end_of_run_wait_s=_median_max(
            [arm["summary"]["checkpoint"]["end_of_run_wait_s"] for arm in save_arms]
        ),
        targets=dict(
            snapshot_max_within_one_step=(snapshot_max is not None and snapshot_max <= step_s),
            blocking_max_within_one_step=(blocking_max is not None and blocking_max <= step_s),
            non_save_steps_within_2pct=abs(non_save_with / non_save_without - 1) <= 0.02,
            non_save_step_mean_within_2pct=abs(mean_with / mean_without - 1) <= 0.02,
        ),
    )


def main() -> None:
    """Trains and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--attention", choices=("flash", "plain"), default="flash")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="A tiny model, to check on CPU.")
    parser.add_argument(
        "--save_every", type=int, default=0, help="Also run with a save every N steps (0: no)."
    )
    parser.add_argument("--rounds", type=int, default=1, help="Save/no-save pairs (--save_every).")
    parser.add_argument("--dir", default=None, help="Where trainer dirs go (default: TMPDIR).")
    args = parser.parse_args()
    if args.save_every and args.steps < SKIP + args.save_every:
        sys.exit(f"--steps must be >= {SKIP + args.save_every} with --save_every {args.save_every}")
    if not has_tensorflow():
        print(
            "honeycrisp_1b: TensorFlow is not installed; summaries go to metrics.jsonl only.",
            file=sys.stderr,
        )
    dims = DIMS_TINY if args.tiny else DIMS_1B
    seq, batch = (32, 2) if args.tiny else (args.seq, args.batch)
    device = jax.devices()[0]
    peak = device_peak_flops([device], dtype=jnp.bfloat16)
    nosave_arms, save_arms = [], []
    for i in range(args.rounds if args.save_every else 1):
        order = (0, args.save_every) if i % 2 == 0 else (args.save_every, 0)
        for save_every in order if args.save_every else (0,):
            arm = run_arm(args, dims, save_every=save_every, device=device, peak=peak)
            (save_arms if save_every else nosave_arms).append(arm)
    first = nosave_arms[0]
    records, specs = first["records"], first["specs"]
    num_params = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(specs))
    flops = lm_training_flops(
        matmul_params=matmul_param_count(specs),
        num_layers=dims["num_layers"],
        num_heads=dims["num_heads"],
        per_head_dim=dims["dim"] // dims["num_heads"],
        seq_len=seq,
        global_batch_size=batch,
    )
    step_s = statistics.median(
        statistics.median(_step_times(arm["records"], exclude_saves=False)) for arm in nosave_arms
    )
    result = dict(
        device=device.device_kind,
        attention=args.attention,
        parameters=num_params,
        seq_len=seq,
        global_batch=batch,
        model_tflops_per_step=flops.total_flops / 1e12,
        step_s=step_s,
        mfu=flops.total_flops / step_s / peak.flops_per_s,
        peak_tflops=peak.flops_per_s / 1e12,
        peak_source=peak.describe(),
        tokens_per_s=seq * batch / step_s,
        loss_first=records[0]["loss"],
        loss_last=records[-1]["loss"],
        xla_python_client_mem_fraction=os.environ.get(gpu_memory.MEM_FRACTION_ENV),
    )
    if args.save_every:
        result["rounds"] = args.rounds
        result["checkpoint"] = checkpoint_report(save_arms, nosave_arms, save_every=args.save_every)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
