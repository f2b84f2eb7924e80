"""P1's step time through the trainer with the chunked loss vs today's full-logits loss.

P1 (docs/performance.md) through `SpmdTrainer` (`p1.p1_trainer_config`: summaries every step,
no checkpoints), once with `model.logits_chunk_size=None` (full logits) and once with
`--chunk` positions per chunk (P1's sequence is 128, so 32 means 4 chunks). Interleaved: each
round runs both (their order alternating between rounds); a run's time is the trainer's median
`perf/step_time_s` after 2 warm-up steps; each side's time is the median over rounds, and the
ratio is chunked / full (also the median of per-round ratios). Prints one JSON object.

`--step_blocks N` measures instead the two compiled train steps alone, alternating in N blocks of
5 steps in one process (finer interleaving: both arms see the same load).

Usage: python benchmarks/p1_chunked_loss.py [--rounds 3] [--steps 30] [--chunk 32]
    [--step_blocks 16]
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
from typing import Optional

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from p1 import MESH_SHAPE, p1_trainer_config  # noqa: E402  pylint: disable=wrong-import-position

from axlearn.common.device_peak import device_peak_flops  # noqa: E402

SKIP = 2


def run(steps: int, peak: float, chunk: Optional[int]) -> dict:
    """One fresh P1 trainer run; its median step time and last loss."""
    trainer_dir = tempfile.mkdtemp(prefix="p1_chunked_")
    try:
        cfg = p1_trainer_config(trainer_dir, max_step=steps, peak_flops_per_device=peak)
        cfg.model.logits_chunk_size = chunk
        trainer = cfg.instantiate(
            parent=None, devices=np.array(jax.devices()[:1]).reshape(MESH_SHAPE)
        )
        trainer.run(jax.random.PRNGKey(0))
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    kept = [r["perf/step_time_s"] for r in records if r["step"] > SKIP]
    return dict(median_s=statistics.median(kept), loss_last=records[-1]["loss"])


def interleaved_steps(blocks: int, chunk: int, steps_per_block: int = 5) -> dict:
    """P1's compiled train step (as the trainer compiles it), full vs chunked, alternating.

    Both trainers are built and initialized in this process; their train steps (not donating
    the state) then run alternately in blocks of `steps_per_block` steps, the order flipping
    every block, so that both see the same machine load. Returns per-block medians and ratios.
    """
    compiled = {}
    for name, size in (("full", None), ("chunked", chunk)):
        cfg = p1_trainer_config(tempfile.mkdtemp(), max_step=1, peak_flops_per_device=1.0)
        cfg.model.logits_chunk_size = size
        trainer = cfg.instantiate(
            parent=None, devices=np.array(jax.devices()[:1]).reshape(MESH_SHAPE)
        )
        # pylint: disable=protected-access
        with trainer._mesh_context():
            trainer.init(jax.random.PRNGKey(0))
            batch = trainer._host_to_global(next(trainer._new_input_iterator()))
            step = trainer.compile_train_step(batch, donate_state=False)
        compiled[name] = (step, trainer.trainer_state, batch)

    def block(name: str, n: int) -> float:
        step, state, batch = compiled[name]
        start = time.perf_counter()
        for _ in range(n):
            outputs = step(state, batch).outputs
        jax.block_until_ready(outputs["loss"])
        return (time.perf_counter() - start) / n

    for name in compiled:
        block(name, 2)  # Warm-up.
    times: dict = {"full": [], "chunked": []}
    for i in range(blocks):
        for name in ("full", "chunked") if i % 2 == 0 else ("chunked", "full"):
            times[name].append(block(name, steps_per_block))
    full, chunked = statistics.median(times["full"]), statistics.median(times["chunked"])
    return dict(
        full_s_per_step=full,
        chunked_s_per_step=chunked,
        ratio_chunked_over_full=chunked / full,
        median_block_ratio=statistics.median(
            c / f for f, c in zip(times["full"], times["chunked"])
        ),
        full_min_s=min(times["full"]),
        chunked_min_s=min(times["chunked"]),
    )


def main() -> None:
    """Runs the interleaved rounds and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument(
        "--step_blocks",
        type=int,
        default=0,
        help="If > 0: instead, alternate the two compiled train steps in this many blocks.",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    if args.step_blocks > 0:
        result = interleaved_steps(args.step_blocks, args.chunk)
        result.update(
            workload="P1 train step (compiled by the trainer), alternating blocks of 5 steps",
            logits_chunk_size=args.chunk,
            load_average_before=load_before,
            load_average_after=os.getloadavg(),
        )
        print(json.dumps(result, indent=2))
        return
    peak = device_peak_flops(jax.devices()[:1], dtype="float32").flops_per_s
    rounds = []
    for i in range(args.rounds):
        order = [None, args.chunk] if i % 2 == 0 else [args.chunk, None]
        result = {("chunked" if c else "full"): run(args.steps, peak, c) for c in order}
        rounds.append(result)
    full = statistics.median(r["full"]["median_s"] for r in rounds)
    chunked = statistics.median(r["chunked"]["median_s"] for r in rounds)
    print(
        json.dumps(
            dict(
                workload="P1 through SpmdTrainer",
                logits_chunk_size=args.chunk,
                full_s_per_step=full,
                chunked_s_per_step=chunked,
                ratio_chunked_over_full=chunked / full,
                median_round_ratio=statistics.median(
                    r["chunked"]["median_s"] / r["full"]["median_s"] for r in rounds
                ),
                rounds=rounds,
                load_average_before=load_before,
                load_average_after=os.getloadavg(),
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
