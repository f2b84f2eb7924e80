"""Chunk compression for checkpoints: zstd (level 1, what AXLearn writes) against raw chunks.

Our checkpointer writes raw (uncompressed) zarr chunks, which AXLearn's `Checkpointer` also
restores (TensorStore reads any zarr compressor). This measures what zstd would buy and cost on
a training state: the same arrays written as zarr v2 by TensorStore with `{"id": "zstd",
"level": 1}` and with no compressor, and by our `Checkpointer.save` (raw, O_DIRECT, CRC-32
per chunk). Cases interleaved, each repeated, medians reported; bytes on disk per case.

The state mimics a trainer's: float32 parameters drawn as an initializer would (normal, scale
1/sqrt(fan_in)), Adam moments (`mu` ~ 1e-3 normal, `nu` ~ its square), bfloat16 copies of the
parameters, and int32 step counters.

    python benchmarks/checkpoint_zstd_vs_raw.py --mbytes 128 --repeats 3 --output out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def _state(total_bytes: int, seed: int = 0) -> dict[str, np.ndarray]:
    import ml_dtypes  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(seed)
    # 7 units: params (4 B), mu (4 B), nu (4 B), bf16 params (2 B) per element -> 14 B.
    n = max(1024, total_bytes // 14)
    cols = 1024
    rows = max(8, n // cols // 8 * 8)  # A multiple of 8: 8 equal shards.
    params = (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(
        np.float32
    )
    mu = (rng.standard_normal((rows, cols), dtype=np.float32) * 1e-3).astype(np.float32)
    return {
        "model/w": params,
        "learner/mu": mu,
        "learner/nu": (mu * mu).astype(np.float32),
        "model/w_bf16": params.astype(ml_dtypes.bfloat16),
        "learner/count": np.asarray(7, np.int32),
    }


def _dir_bytes(path: str) -> int:
    total = 0
    for d, _, names in os.walk(path):
        total += sum(os.path.getsize(os.path.join(d, n)) for n in names)
    return total


def _write_tensorstore(state: dict, out_dir: str, compressor) -> None:
    import tensorstore as ts  # pylint: disable=import-outside-toplevel

    futures = []
    for path, value in state.items():
        rows = value.shape[0] if value.ndim else 1
        chunks = [max(1, rows // 8)] + list(value.shape[1:]) if value.ndim else []
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": os.path.join(out_dir, "gda", path)},
            "metadata": {
                "shape": list(value.shape),
                "chunks": chunks,
                "dtype": "bfloat16" if value.dtype.name == "bfloat16" else value.dtype.str,
                "compressor": compressor,
                "dimension_separator": ".",
            },
            "create": True,
        }
        array = ts.open(spec).result()
        futures.append(array.write(value))
    for f in futures:
        f.result()


def _write_ours(state: dict, out_dir: str) -> None:
    # pylint: disable=import-outside-toplevel
    import jax

    from axlearn.common.checkpointer import Checkpointer

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    tree = {}
    for path, value in state.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = jax.device_put(value, sharding) if value.ndim else jax.numpy.asarray(value)
    jax.block_until_ready(tree)
    ckpt = Checkpointer.default_config().set(name="c", dir=out_dir).instantiate(parent=None)
    ckpt.save(step=1, state=tree)
    ckpt.wait_until_finished()
    ckpt.stop()


def main() -> int:
    """Runs the interleaved cases; prints (and optionally writes) one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbytes", type=int, default=128, help="State size in MiB.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    state = _state(args.mbytes << 20)
    raw_bytes = sum(v.nbytes for v in state.values())
    cases = {
        "tensorstore_zstd1": lambda d: _write_tensorstore(state, d, {"id": "zstd", "level": 1}),
        "tensorstore_raw": lambda d: _write_tensorstore(state, d, None),
        "ours_raw": lambda d: _write_ours(state, d),
    }
    times = {name: [] for name in cases}
    sizes = {}
    root = tempfile.mkdtemp(prefix="zstd_vs_raw_")
    try:
        _write_ours(state, os.path.join(root, "warmup"))
        for r in range(args.repeats):
            for name, fn in cases.items():
                out = os.path.join(root, f"{name}_{r}")
                start = time.perf_counter()
                fn(out)
                times[name].append(time.perf_counter() - start)
                sizes[name] = _dir_bytes(out)
                shutil.rmtree(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "state_bytes": raw_bytes,
        "repeats": args.repeats,
        "seconds": times,
        "median_seconds": medians,
        "bytes_on_disk": sizes,
        "size_ratio_zstd_over_raw": sizes["tensorstore_zstd1"] / sizes["tensorstore_raw"],
        "time_ratio_zstd_over_raw_tensorstore": medians["tensorstore_zstd1"]
        / medians["tensorstore_raw"],
        "time_ratio_zstd_over_ours": medians["tensorstore_zstd1"] / medians["ours_raw"],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
