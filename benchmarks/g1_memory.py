"""Compiled memory of G1's train step (the 1B yardstick) per chunked-loss and remat setting.

Compiles (does not run) the SpmdTrainer train step of `g1_config.g1_trainer_config` for this
machine's first device (the CPU here: the 1B model at batch 8 compiles in minutes, its 12.5 GB of
state is never allocated) for each `--chunks` x `--remats` setting, and prints one JSON object
with XLA's memory analysis of each (temp, argument, output bytes) and, per chunk size, the temp
bytes relative to the unchunked program with the same remat.

Usage: python benchmarks/g1_memory.py [--batch 8] [--seq 2048] [--chunks none,512]
    [--remats none] [--attention flash] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from g1_config import g1_trainer_config  # noqa: E402  pylint: disable=wrong-import-position

from axlearn.common.device_memory import compiled_memory_stats  # noqa: E402


def compiled_memory(
    *, tiny: bool, batch: int, seq: int, attention: str, remat: str, chunk: int | None
) -> dict:
    """Compiles one setting's train step; returns its memory analysis and compile time."""
    trainer_dir = tempfile.mkdtemp(prefix="g1_memory_")
    try:
        cfg = g1_trainer_config(
            trainer_dir,
            tiny=tiny,
            batch=batch,
            seq=seq,
            attention=attention,
            remat=remat,
            logits_chunk_size=chunk,
            peak_flops_per_device=1.0,
        )
        device = jax.devices()[0]
        trainer = cfg.instantiate(parent=None, devices=np.array([device]).reshape(1, 1, 1))
        start = time.perf_counter()
        compiled = trainer.compile_train_step()
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    mem = compiled_memory_stats(compiled)
    return dict(
        remat=remat,
        logits_chunk_size=chunk,
        temp_bytes=mem.temp_bytes,
        argument_bytes=mem.argument_bytes,
        output_bytes=mem.output_bytes,
        compile_s=round(seconds, 1),
    )


def main() -> None:
    """Compiles every setting and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--chunks", default="none,512", help="Comma-separated; 'none': full.")
    parser.add_argument("--remats", default="none", help="Comma-separated REMAT_CHOICES names.")
    parser.add_argument("--attention", choices=("flash", "plain"), default="flash")
    parser.add_argument("--tiny", action="store_true", help="The few-MB model.")
    args = parser.parse_args()
    chunks = [None if c == "none" else int(c) for c in args.chunks.split(",")]
    results = []
    for remat in args.remats.split(","):
        for chunk in chunks:
            results.append(
                compiled_memory(
                    tiny=args.tiny,
                    batch=args.batch,
                    seq=args.seq,
                    attention=args.attention,
                    remat=remat,
                    chunk=chunk,
                )
            )
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    base = {r["remat"]: r["temp_bytes"] for r in results if r["logits_chunk_size"] is None}
    for r in results:
        if r["remat"] in base and base[r["remat"]]:
            r["temp_vs_unchunked"] = round(r["temp_bytes"] / base[r["remat"]], 4)
    print(
        json.dumps(
            dict(
                workload="G1 train step, compiled for " + jax.devices()[0].platform,
                tiny=args.tiny,
                batch=args.batch,
                seq=args.seq,
                attention=args.attention,
                results=results,
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
