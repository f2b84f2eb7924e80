"""Workload P1 train-step time: the axlearn library (jitted functional + optax) vs plain JAX.

P1 (docs/performance.md): decoder, 2 layers, d=256, 4 heads of 64 (4 KV heads), RoPE theta 5e5,
QK-norm, SwiGLU hidden 1024, tied embedding, vocab 32768, sequence 128, batch 4, AdamW, fp32,
one device, summaries every step.

Both sides run forward + backward + AdamW (optax.adamw, same hyper-parameters) from the same
parameter values; the first step's losses are checked to agree. Timing is interleaved: each
round times `--steps` steps of the library then of plain JAX (blocking on the loss each step);
the reported time per side is the median over rounds of the per-round median step time.

Prints one JSON object: library_s, plain_jax_s, ratio (library / plain), median_round_ratio (the
median over rounds of the ratio of adjacent measurements, robust to load drift), per-round times,
the stack variant, the load average before and after.

Usage: python benchmarks/lm_step_vs_plain_jax.py [--rounds 5] [--steps 10] [--stack stack|repeat]
    [--plain_unrolled]
"""

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plain_jax_lm  # noqa: E402  pylint: disable=wrong-import-position
from p1 import (  # noqa: E402  pylint: disable=wrong-import-position
    BATCH,
    SEQ,
    p1_model_config,
    p1_plain_config,
)

from axlearn.common.module import functional  # noqa: E402


def _library_step(model, optimizer):
    def loss_fn(params, batch):
        (loss, _), collection = functional(
            model, None, params, dict(input_batch=batch), is_training=True
        )
        return loss, collection.summaries

    def step(params, opt_state, batch):
        (loss, summaries), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss, summaries

    return jax.jit(step, donate_argnums=(0, 1))


def _time_steps(step, params, opt_state, batch, steps):
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss, _ = step(params, opt_state, batch)
        float(loss)
        times.append(time.perf_counter() - start)
    return params, opt_state, statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--stack", default="stack", choices=["stack", "repeat"])
    parser.add_argument("--plain_unrolled", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()

    cfg = p1_plain_config()
    model = p1_model_config(stack=args.stack).set(name="model").instantiate(parent=None)
    lib_params = jax.jit(model.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    # The same parameter values on both sides; with --stack repeat, plain JAX scans the
    # stacked layers too (--plain_unrolled: it unrolls them instead).
    plain_params = jax.tree.map(jnp.copy, lib_params)
    if args.stack == "repeat" and args.plain_unrolled:
        repeated = plain_params["decoder"]["transformer"].pop("repeat")["layer"]
        for i in range(cfg.num_layers):
            plain_params["decoder"]["transformer"][f"layer{i}"] = jax.tree.map(
                lambda x, i=i: x[i], repeated
            )

    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1, cfg.vocab_size, size=(BATCH, SEQ + 1)), jnp.int32)
    batch = dict(input_ids=ids[:, :-1], target_labels=ids[:, 1:])

    optimizer = optax.adamw(1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01)
    lib_step = _library_step(model, optimizer)
    plain_step = plain_jax_lm.make_train_step(cfg, optimizer)
    lib_state = (lib_params, optimizer.init(lib_params))
    plain_state = (plain_params, optimizer.init(plain_params))

    # Compile, and check both compute the same loss from the same parameters.
    start = time.perf_counter()
    *lib_state, lib_loss, _ = lib_step(*lib_state, batch)
    lib_compile = time.perf_counter() - start
    start = time.perf_counter()
    *plain_state, plain_loss, _ = plain_step(*plain_state, batch)
    plain_compile = time.perf_counter() - start
    np.testing.assert_allclose(float(lib_loss), float(plain_loss), rtol=1e-5)

    lib_times, plain_times = [], []
    for _ in range(args.rounds):
        *lib_state, t = _time_steps(lib_step, *lib_state, batch, args.steps)
        lib_times.append(t)
        *plain_state, t = _time_steps(plain_step, *plain_state, batch, args.steps)
        plain_times.append(t)
    lib_s, plain_s = statistics.median(lib_times), statistics.median(plain_times)
    print(
        json.dumps(
            dict(
                workload="P1",
                stack=args.stack,
                plain_layers="scan"
                if args.stack == "repeat" and not args.plain_unrolled
                else "unrolled",
                library_s=round(lib_s, 5),
                plain_jax_s=round(plain_s, 5),
                ratio=round(lib_s / plain_s, 4),
                median_round_ratio=round(
                    statistics.median(a / b for a, b in zip(lib_times, plain_times)), 4
                ),
                library_round_s=[round(t, 5) for t in lib_times],
                plain_jax_round_s=[round(t, 5) for t in plain_times],
                library_compile_s=round(lib_compile, 2),
                plain_jax_compile_s=round(plain_compile, 2),
                first_step_loss=dict(library=float(lib_loss), plain_jax=float(plain_loss)),
                rounds=args.rounds,
                steps_per_round=args.steps,
                load_average_before=load_before,
                load_average_after=os.getloadavg(),
                devices=str(jax.devices()[0].platform),
            )
        )
    )


if __name__ == "__main__":
    main()
