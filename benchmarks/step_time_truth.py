"""Are StepTimer's step times true? Pipelined timing vs a block_until_ready-every-step loop.

Runs the same jitted training step (a 2-layer MLP language-model-like step with AdamW, sized by
flags) in two loops, interleaved, `--repeats` times each:

- pipelined: step N+1 is dispatched before step N's loss is read; step time = interval between
  consecutive host syncs on the loss (`StepTimer.end_step` right after `float(loss)`);
- synchronous: every step is timed from dispatch to `block_until_ready` on its outputs.

Prints JSON: the median step time of each loop per repeat, the medians over repeats, their ratio
(the reported pipelined step time should be within 5% of the synchronous one) and the total
wall time per step of each loop (pipelined should be at least as fast).

    python benchmarks/step_time_truth.py --steps 30 --repeats 5
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from axlearn.common.step_timer import StepTimer


def make_step(*, dim: int, hidden: int, vocab: int, tokens: int):
    """Returns (train_step, state, batch) for a [tokens] batch of a small LM-like MLP."""
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = dict(
        emb=jax.random.normal(k[0], (vocab, dim)) * 0.02,
        w1=jax.random.normal(k[1], (dim, hidden)) * 0.02,
        w2=jax.random.normal(k[2], (hidden, dim)) * 0.02,
    )
    ids = jax.random.randint(k[3], (tokens,), 0, vocab)
    opt = optax.adamw(1e-3)

    def loss_fn(p, ids):
        x = p["emb"][ids]
        x = x + jax.nn.silu(x @ p["w1"]) @ p["w2"]
        logits = x @ p["emb"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.roll(ids, -1)).mean()

    @functools.partial(jax.jit, donate_argnums=0)  # The state is donated, as in the trainer.
    def train_step(state, ids):
        p, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(p, ids)
        updates, opt_state = opt.update(grads, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), loss

    return train_step, (params, opt.init(params)), ids


def pipelined(train_step, state, ids, steps: int) -> tuple[list[float], float]:
    """Returns (step times from StepTimer, total wall s) of a pipelined loop."""
    timer = StepTimer()
    start = time.perf_counter()
    timer.start()
    pending, times = None, []
    for step in range(1, steps + 1):
        state, loss = train_step(state, ids)
        if pending is not None:
            float(pending[1])
            times.append(timer.end_step(pending[0]).wall_s)
        pending = (step, loss)
    float(pending[1])
    times.append(timer.end_step(pending[0]).wall_s)
    return times, time.perf_counter() - start


def synchronous(train_step, state, ids, steps: int) -> tuple[list[float], float]:
    """Returns (per-step dispatch-to-ready times, total wall s) of a blocking loop."""
    times = []
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        state, loss = train_step(state, ids)
        jax.block_until_ready((state, loss))
        times.append(time.perf_counter() - t0)
    return times, time.perf_counter() - start


def main() -> None:
    """Runs the benchmark and prints JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()

    train_step, state, ids = make_step(
        dim=args.dim, hidden=args.hidden, vocab=args.vocab, tokens=args.tokens
    )

    def fresh_state():
        return jax.tree.map(lambda x: x.copy(), state)  # Each loop donates its own copy.

    jax.block_until_ready(train_step(fresh_state(), ids))  # Compile outside the timed loops.
    runs = []
    for _ in range(args.repeats):  # Interleaved: pipelined, synchronous, pipelined, ...
        p_times, p_total = pipelined(train_step, fresh_state(), ids, args.steps)
        s_times, s_total = synchronous(train_step, fresh_state(), ids, args.steps)
        # The first pipelined step includes the host's dispatch latency before the device
        # starts; compare steady-state steps of both loops.
        runs.append(
            dict(
                pipelined_median_s=statistics.median(p_times[1:]),
                synchronous_median_s=statistics.median(s_times[1:]),
                pipelined_total_s_per_step=p_total / args.steps,
                synchronous_total_s_per_step=s_total / args.steps,
            )
        )
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(
        json.dumps(
            dict(
                args=vars(args),
                device=str(jax.devices()[0].device_kind),
                runs=runs,
                medians=med,
                reported_over_synchronous=med["pipelined_median_s"] / med["synchronous_median_s"],
                pipelined_total_over_synchronous_total=(
                    med["pipelined_total_s_per_step"] / med["synchronous_total_s_per_step"]
                ),
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
