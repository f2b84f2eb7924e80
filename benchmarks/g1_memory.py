"""Compiled memory of G1's train step (the 1B yardstick) per chunked-loss and remat setting.

Compiles (does not run) the SpmdTrainer train step of `g1_config.g1_trainer_config` for this
machine's first device (the CPU here: the 1B model at batch 8 compiles in minutes, its 12.5 GB of
state is never allocated) for each `--chunks` x `--remats` setting, and prints one JSON object
with XLA's memory analysis of each (temp, argument, output bytes) and, per chunk size, the temp
bytes relative to the unchunked program with the same remat.

`--head` adds the LM head and loss alone (value and gradient of hidden states -> loss at G1's
shapes in bf16), which is what the chunked loss changes; `--remats ''` skips the train steps.

Usage: python benchmarks/g1_memory.py [--batch 8] [--seq 2048] [--chunks none,512]
    [--remats none] [--attention flash] [--tiny] [--head]
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
from g1_config import g1_dims, g1_trainer_config  # noqa: E402  pylint: disable=wrong-import-position

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


def head_memory(*, batch: int, seq: int, dims: dict, chunk: int | None) -> dict:
    """Compiled temp bytes of value-and-grad of the LM head + loss alone at G1's shapes (bf16).

    The loss of hidden states [batch, seq, dim] and the tied table [vocab, dim] (z-loss 1e-6),
    differentiated with respect to both: `loss.cross_entropy` of the full logits, or
    `chunked_lm_head_loss` with `chunk` positions per chunk.
    """
    # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp

    from axlearn.common.chunked_lm_loss import chunked_lm_head_loss
    from axlearn.common.loss import cross_entropy

    hidden = jax.ShapeDtypeStruct((batch, seq, dims["dim"]), jnp.bfloat16)
    weight = jax.ShapeDtypeStruct((dims["vocab_size"], dims["dim"]), jnp.bfloat16)
    labels = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

    def loss_fn(h, w, labels):
        live = labels > 0
        if chunk is None:
            logits = jnp.einsum("btd,vd->btv", h, w)
            return cross_entropy(logits, labels, live_targets=live, z_loss_scale=1e-6)[0]
        return chunked_lm_head_loss(
            h, w, labels, live_targets=live, chunk_size=chunk, z_loss_scale=1e-6
        )[0]

    compiled = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1))).lower(hidden, weight, labels)
    mem = compiled_memory_stats(compiled.compile())
    return dict(part="lm_head_and_loss", logits_chunk_size=chunk, temp_bytes=mem.temp_bytes)


def main() -> None:
    """Compiles every setting and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--chunks", default="none,512", help="Comma-separated; 'none': full.")
    parser.add_argument("--remats", default="none", help="Comma-separated REMAT_CHOICES names.")
    parser.add_argument("--attention", choices=("flash", "plain"), default="flash")
    parser.add_argument("--tiny", action="store_true", help="The few-MB model.")
    parser.add_argument(
        "--head", action="store_true", help="Also the LM head + loss alone (first chunk: 'none')."
    )
    args = parser.parse_args()
    chunks = [None if c == "none" else int(c) for c in args.chunks.split(",")]
    results = []
    for remat in [r for r in args.remats.split(",") if r]:
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
    if args.head:
        dims = g1_dims(args.tiny)
        head = [head_memory(batch=args.batch, seq=args.seq, dims=dims, chunk=c) for c in chunks]
        for r in head:
            r["temp_vs_unchunked"] = round(r["temp_bytes"] / head[0]["temp_bytes"], 4)
        results += head
    base = {
        r["remat"]: r["temp_bytes"]
        for r in results
        if r["logits_chunk_size"] is None and "remat" in r
    }
    for r in results:
        if r.get("remat") in base and base[r["remat"]]:
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
