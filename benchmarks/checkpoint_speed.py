"""Benchmark: checkpoint save/restore speed vs the raw disk and vs orbax-checkpoint.

For a state of `--gib` GiB (float32 arrays sharded over `--devices` CPU devices), each trial
measures, interleaved (the order rotates between trials):
- raw: sequential write of the same number of bytes to one file with fsync, and read back;
- axlearn: `Checkpointer.save` (async) until committed, the caller's blocking time, and
  `Checkpointer.restore` into the same shardings;
- orbax: `orbax.checkpoint.StandardCheckpointer` save until finished, and restore.
Also the caller-side blocking time of async saves of a P1-sized train state (~126 MB, 1 device)
in both snapshot modes.
Page caches of the written files are dropped (fsync + POSIX_FADV_DONTNEED) before every read, so
reads come from the disk. Prints JSON: per-trial numbers, medians, and ratios of medians.

Usage: python benchmarks/checkpoint_speed.py [--gib 1] [--trials 3] [--devices 8] [--dir DIR]
"""

import argparse
import os
import sys

_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_parser.add_argument("--gib", type=float, default=1.0, help="State size in GiB.")
_parser.add_argument("--trials", type=int, default=3, help="Interleaved trials (>= 3).")
_parser.add_argument("--devices", type=int, default=8, help="CPU devices to shard over.")
_parser.add_argument("--dir", default=None, help="Scratch directory (default: a temp dir).")
_parser.add_argument("--leaves", type=int, default=16, help="Number of arrays in the state.")
ARGS = _parser.parse_args()
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ARGS.devices}"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# pylint: disable=wrong-import-position
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from axlearn.common.checkpointer import (  # noqa: E402
    Checkpointer,
    TensorStoreStateStorage,
    every_n_steps_policy,
)
from axlearn.common.config import config_for_function  # noqa: E402

_BLOCK = 64 << 20


def _drop_cache(path: str) -> None:
    """Flushes and evicts the page cache of every file under `path`."""
    os.sync()
    paths = (
        [path]
        if os.path.isfile(path)
        else [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]
    )
    for file in paths:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _make_state(num_bytes: int, num_leaves: int) -> dict:
    mesh = jax.make_mesh((ARGS.devices,), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    cols = 1024
    rows = max(ARGS.devices, num_bytes // (4 * cols * num_leaves))
    rows -= rows % ARGS.devices
    rng = np.random.default_rng(0)
    return {
        f"layer{i}": jax.device_put(rng.standard_normal((rows, cols), np.float32), sharding)
        for i in range(num_leaves)
    }


def _raw(scratch: str, num_bytes: int) -> dict:
    path = os.path.join(scratch, "raw.bin")
    buf = np.random.default_rng(1).bytes(_BLOCK)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    written = 0
    while written < num_bytes:
        written += os.write(fd, buf[: min(_BLOCK, num_bytes - written)])
    os.fsync(fd)
    os.close(fd)
    write_s = time.perf_counter() - start
    _drop_cache(path)
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, _BLOCK):
        pass
    os.close(fd)
    read_s = time.perf_counter() - start
    os.remove(path)
    return dict(save_s=write_s, restore_s=read_s)


def _axlearn(scratch: str, state: dict) -> dict:
    ckpt_dir = os.path.join(scratch, "axlearn")
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=ckpt_dir,
        save_policy=config_for_function(every_n_steps_policy).set(n=1),
    )
    ckpt = cfg.instantiate(parent=None)
    start = time.perf_counter()
    stats = ckpt.save(step=1, state=state)
    ckpt.wait_until_finished()
    save_s = time.perf_counter() - start
    _drop_cache(ckpt_dir)
    start = time.perf_counter()
    _, restored = ckpt.restore(state=state)
    jax.block_until_ready(restored)
    restore_s = time.perf_counter() - start
    ckpt.stop()
    del restored
    shutil.rmtree(ckpt_dir)
    return dict(save_s=save_s, restore_s=restore_s, blocking_s=stats.blocking_s)


def _orbax(scratch: str, state: dict) -> dict:
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

    path = os.path.join(scratch, "orbax")
    checkpointer = ocp.StandardCheckpointer()
    start = time.perf_counter()
    checkpointer.save(path, state)
    blocking_s = time.perf_counter() - start
    checkpointer.wait_until_finished()
    save_s = time.perf_counter() - start
    _drop_cache(path)
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    start = time.perf_counter()
    restored = checkpointer.restore(path, target)
    jax.block_until_ready(restored)
    restore_s = time.perf_counter() - start
    checkpointer.close()
    del restored
    shutil.rmtree(path)
    return dict(save_s=save_s, restore_s=restore_s, blocking_s=blocking_s)


def _blocking(scratch: str) -> dict:
    """Caller-side cost of async saves of a P1-sized train state (one device, ~126 MB).

    P1 (docs/performance.md) has ~10.5M fp32 parameters; with AdamW's two moments the state is ~3x
    that. Each save is followed by `wait_until_finished`, so no save waits for another: this is
    the snapshot cost alone, for both snapshot modes.
    """
    rng = np.random.default_rng(2)
    shapes = [(32768, 256)] + [(256, 768), (256, 256), (256, 1024), (256, 1024), (1024, 256)] * 2
    params = {
        f"p{i}": jax.device_put(rng.standard_normal(s, np.float32), jax.devices()[0])
        for i, s in enumerate(shapes)
    }
    state = dict(
        params=params,
        mu=jax.tree.map(jnp.zeros_like, params),
        nu=jax.tree.map(jnp.zeros_like, params),
        step=0,
    )
    jax.block_until_ready(state)
    num_bytes = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
    result = dict(state_mb=num_bytes / 1e6, leaves=len(jax.tree.leaves(state)))
    for mode in ("device", "host"):
        ckpt_dir = os.path.join(scratch, f"blocking_{mode}")
        cfg = Checkpointer.default_config().set(
            name="checkpointer",
            dir=ckpt_dir,
            save_policy=config_for_function(every_n_steps_policy).set(n=1),
            storage=TensorStoreStateStorage.default_config().set(snapshot=mode),
        )
        ckpt = cfg.instantiate(parent=None)
        times, cpu_times = [], []
        for step in range(1, 6):
            cpu_start = time.thread_time()
            times.append(ckpt.save(step=step, state=state).blocking_s)
            cpu_times.append(time.thread_time() - cpu_start)
            ckpt.wait_until_finished()
        ckpt.stop()
        shutil.rmtree(ckpt_dir)
        result[f"{mode}_blocking_s"] = times
        result[f"{mode}_blocking_median_s"] = statistics.median(times)
        # CPU time of the calling thread: what the caller's own work costs, whatever the load.
        result[f"{mode}_blocking_cpu_median_s"] = statistics.median(cpu_times)
    return result


def main() -> None:
    """Runs the benchmark and prints JSON."""
    if ARGS.trials < 3:
        sys.exit("--trials must be >= 3 (medians of at least 3)")
    scratch = ARGS.dir or tempfile.mkdtemp(prefix="axlearn_ckpt_bench_")
    os.makedirs(scratch, exist_ok=True)
    state = _make_state(int(ARGS.gib * (1 << 30)), ARGS.leaves)
    num_bytes = sum(x.nbytes for x in state.values())
    runners = dict(
        raw=lambda: _raw(scratch, num_bytes),
        axlearn=lambda: _axlearn(scratch, state),
        orbax=lambda: _orbax(scratch, state),
    )
    names = list(runners)
    _axlearn(scratch, state)  # Warm up compilation caches and imports; not timed.
    _orbax(scratch, state)
    trials = {name: [] for name in names}
    for trial in range(ARGS.trials):
        order = names[trial % len(names) :] + names[: trial % len(names)]
        for name in order:
            trials[name].append(runners[name]())
    gb = num_bytes / 1e9
    medians = {}
    for name, runs in trials.items():
        medians[name] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        medians[name]["save_gb_s"] = gb / medians[name]["save_s"]
        medians[name]["restore_gb_s"] = gb / medians[name]["restore_s"]
    ours, raw, orbax = medians["axlearn"], medians["raw"], medians["orbax"]
    result = dict(
        state_gb=gb,
        leaves=ARGS.leaves,
        devices=ARGS.devices,
        trials=trials,
        medians=medians,
        ratios=dict(
            save_vs_raw_write=ours["save_gb_s"] / raw["save_gb_s"],
            restore_vs_raw_read=ours["restore_gb_s"] / raw["restore_gb_s"],
            save_vs_orbax=ours["save_gb_s"] / orbax["save_gb_s"],
            restore_vs_orbax=ours["restore_gb_s"] / orbax["restore_gb_s"],
            blocking_vs_orbax=ours["blocking_s"] / orbax["blocking_s"],
        ),
        p1_like_blocking=_blocking(scratch),
        scratch=scratch,
    )
    print(json.dumps(result, indent=2))
    if ARGS.dir is None:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
