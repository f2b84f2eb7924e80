"""Does moving a device snapshot to the host in a background thread slow the training loop?

On one accelerator, a 12.5 GB state (36 float32 arrays of 348 MB, the 1B benchmark's size) is
copied on the device and the copy is moved to host memory by a background thread, as the
checkpoint writer does, while the main thread runs ~0.2 s matmul "steps". Three routes:

- `np_async_all`: `copy_to_host_async()` on every array, then `np.asarray` one by one (the
  writer's route before `checkpointer.storage.host_transfer`);
- `np_serial`: `np.asarray` one by one;
- `pinned`: `jax.device_put(x, x.sharding.with_memory_kind("pinned_host"))` for every array,
  then `block_until_ready()` and `np.asarray` of the pinned array (the writer's route now).

For each: the transfer's duration and the mean/max step time while it ran (`base_step`: without
a transfer). `gil_*` runs the route while the main thread spins in pure Python: its longest
pause and the sum of pauses over 1 ms show how long the route held Python's GIL. Prints one JSON
object (and writes it to $OUT/transfer_probe.json when OUT is set). On CPU it runs a small
version (8 arrays of 16 MB) to check the script.

Measured on an H100 (2026-11-26; docs/performance.md): np_async_all held the GIL for 11.2 s of
a 9.4 s transfer and slowed the steps 2.5x; pinned moved the 12.5 GB in 0.24 s with the steps
unchanged.

Usage: python benchmarks/host_transfer_probe.py
"""

import json
import os
import statistics
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np


def main() -> None:
    """Runs the probe; prints the JSON result."""
    dev = jax.devices()[0]
    gpu = dev.platform != "cpu"
    n_leaves, leaf_mb = (36, 348) if gpu else (8, 16)
    dim, reps = (8192, 160) if gpu else (512, 2)
    memories = [m.kind for m in dev.addressable_memories()]
    res = {"device": dev.device_kind, "memories": memories}
    state = [jnp.full((leaf_mb << 18,), i, jnp.float32) for i in range(n_leaves)]
    x = jnp.ones((dim, dim), jnp.bfloat16)

    @jax.jit
    def work(x):
        return jax.lax.fori_loop(0, reps, lambda _, y: jnp.tanh(y @ y) * 0.5, x)

    def steps(n):
        nonlocal x
        times = []
        for _ in range(n):
            t = time.perf_counter()
            x = work(x)
            x.block_until_ready()
            times.append(time.perf_counter() - t)
        return times

    def np_serial(snap):
        out = []
        for a in snap:
            out.append(np.asarray(a))
            a.delete()
        return out

    def np_async_all(snap):
        for a in snap:
            a.copy_to_host_async()
        return np_serial(snap)

    def pinned(snap):
        kind = "pinned_host" if "pinned_host" in memories else "unpinned_host"
        hosts = [jax.device_put(a, a.sharding.with_memory_kind(kind)) for a in snap]
        out = []
        for a, h in zip(snap, hosts):
            h.block_until_ready()
            a.delete()
            out.append(np.asarray(h))
        return out

    def snapshot():
        snap = [jnp.copy(a) for a in state]
        jax.block_until_ready(snap)
        return snap

    def with_steps(name, fn):
        snap, done = snapshot(), {}

        def background():
            t = time.perf_counter()
            fn(snap)
            done["s"] = time.perf_counter() - t

        thread = threading.Thread(target=background)
        thread.start()
        times = []
        while thread.is_alive() and len(times) < 200:
            times += steps(1)
        thread.join()
        res[name] = dict(
            transfer_s=done.get("s"),
            steps=len(times),
            step_mean=statistics.mean(times) if times else None,
            step_max=max(times) if times else None,
        )

    def gil_probe(name, fn):
        snap = snapshot()
        thread = threading.Thread(target=fn, args=(snap,))
        gaps, last = [], time.perf_counter()
        thread.start()
        while thread.is_alive():
            for _ in range(1000):
                pass
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        res[name] = dict(
            max_gap_s=max(gaps), n=len(gaps), sum_gaps_over_1ms=sum(g for g in gaps if g > 1e-3)
        )

    steps(3)
    res["base_step"] = statistics.mean(steps(10))
    gil_probe("gil_np", np_async_all)
    gil_probe("gil_pinned", pinned)
    with_steps("np_async_all", np_async_all)
    with_steps("np_serial", np_serial)
    with_steps("pinned", pinned)
    res["base_step_after"] = statistics.mean(steps(10))
    print(json.dumps(res, indent=1))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "transfer_probe.json"), "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
