"""Per-device compiled memory and step time of context-parallel attention (CPU devices).

For each sequence length and degree (1, 2, 4, 8 CPU devices on a ("seq",) mesh), compiles the
forward and backward pass of one causal FlashAttention layer (GQA, batch 1) with
`context_parallel` in the ring and all-gather forms (degree 1: the layer without it, on one
device) and reports from `compiled.memory_analysis()` the per-device temporary bytes (the
activations and workspace of the step; arguments and outputs are listed apart), the step time
(median of --repeats runs after one warm-up) and the HLO's collectives (whether the ring's
collective-permutes are asynchronous start/done pairs that XLA can overlap with compute).
`ratio_vs_degree_1` is temp bytes / temp bytes at degree 1 (ideal 1/degree) and `efficiency`
is (1/degree) / ratio (1.0: ideal).

Usage (from the repository root):
    python benchmarks/context_parallel.py --seq_lens 1024,2048,4096 --output results.json

With `--max_seq_under_mib M` (usually with `--tpu_topology v5p-16`: compiled for the chips, not
run), it instead searches, for each degree and form, the longest sequence (a multiple of
--search_unit tokens) whose compiled step needs at most M MiB per device (temporary + argument
+ output bytes, less aliased ones): the length doubles from --search_unit until a compile does
not fit, then --search_steps bisections narrow the bracket. The report's "max_seq" rows list
every length tried.

Prints one JSON object {"config", "rows"}; every row's numbers are checked (positive bytes and
times, efficiency > 0) before it is printed.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
)

# pylint: disable=wrong-import-position
import argparse
import json
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from axlearn.common.attention import GroupedQKVLinear
from axlearn.common.flash_attention.context_parallel import ContextParallelConfig
from axlearn.common.flash_attention.layer import FlashAttention
from axlearn.common.module import functional


def _layer(dim: int, heads: int, kv_heads: int, form: str | None):
    cfg = FlashAttention.default_config().set(
        name="attn",
        query_dim=dim,
        key_dim=dim,
        value_dim=dim,
        num_heads=heads,
        causal=True,
        input_linear=GroupedQKVLinear.default_config().set(num_kv_heads=kv_heads),
    )
    if form is not None:
        cfg.context_parallel = ContextParallelConfig(form=form)
    return cfg.instantiate(parent=None)


def _collectives(hlo: str) -> dict:
    names = (
        "collective-permute-start",
        "collective-permute-done",
        "collective-permute",
        "all-gather-start",
        "all-gather",
        "reduce-scatter",
        "all-reduce",
    )
    counts = {}
    for name in names:
        counts[name] = len(re.findall(rf"\s{re.escape(name)}\(", hlo))
    return counts


def measure(seq_len: int, degree: int, form: str | None, args, devices=None) -> dict:
    """One row: compiled memory, step time and collectives of one (seq_len, degree, form).

    With `devices` (a TPU topology's, no TPU here) the step is only compiled, not run.
    """
    layer = _layer(args.dim, args.heads, args.kv_heads, form)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.ShapeDtypeStruct((1, seq_len, args.dim), jnp.float32)
    if devices is None:
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=x.shape), jnp.float32)

    def loss(params, x):
        out, _ = functional(layer, None, params, dict(query=x), is_training=True)
        return jnp.sum(out.data**2)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    mesh = Mesh(np.array((devices or jax.devices())[:degree]), ("seq",))
    with jax.set_mesh(mesh):
        if devices is not None:
            params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
        compiled = step.lower(params, x).compile()
        memory = compiled.memory_analysis()
        hlo = compiled.as_text()
        times = []
        if devices is None:
            jax.block_until_ready(compiled(params, x))
            times = []
        for _ in range(args.repeats if devices is None else 0):
            start = time.perf_counter()
            jax.block_until_ready(compiled(params, x))
            times.append(time.perf_counter() - start)
    return dict(
        seq_len=seq_len,
        degree=degree,
        form=form or "none",
        temp_bytes_per_device=int(memory.temp_size_in_bytes),
        argument_bytes_per_device=int(memory.argument_size_in_bytes),
        output_bytes_per_device=int(memory.output_size_in_bytes),
        alias_bytes_per_device=int(memory.alias_size_in_bytes),
        step_time_s=statistics.median(times) if devices is None else None,
        collectives=_collectives(hlo),
    )


def total_bytes(row: dict) -> int:
    """The per-device bytes of a row's compiled step: temporary + arguments + outputs - aliased.

    Args:
        row: A row of `measure`.

    Returns:
        The bytes.
    """
    return (
        row["temp_bytes_per_device"]
        + row["argument_bytes_per_device"]
        + row["output_bytes_per_device"]
        - row["alias_bytes_per_device"]
    )


def max_seq_under(limit_mib: float, degree: int, form: str | None, args, devices=None) -> dict:
    """The longest sequence (a multiple of args.search_unit) that compiles within limit_mib.

    Doubles the length from args.search_unit while the step fits, then bisects the bracket
    args.search_steps times.

    Args:
        limit_mib: The per-device memory limit in MiB.
        degree: The context-parallel degree (1: the layer without it, on one device).
        form: "ring", "all_gather" or None (degree 1).
        args: The parsed flags (dim, heads, kv_heads, search_unit, search_steps, repeats).
        devices: A TPU topology's devices (compile only) or None (this host's devices).

    Returns:
        {degree, form, limit_mib, max_seq_len (0: even search_unit does not fit),
        first_failing_seq_len, mib_at_max, tried: [[seq_len, MiB], ...]}.
    """
    unit, limit = args.search_unit, limit_mib * 2**20
    tried = []

    def fits(seq_len: int) -> bool:
        row = measure(seq_len, degree, form, args, devices)
        mib = total_bytes(row) / 2**20
        tried.append([seq_len, round(mib, 1)])
        print(json.dumps(dict(degree=degree, form=form, seq_len=seq_len, mib=mib)), file=sys.stderr)
        return mib * 2**20 <= limit

    low, high = 0, unit
    while fits(high):
        low, high = high, 2 * high
    for _ in range(args.search_steps if low else 0):
        mid = (low + high) // 2 // unit * unit
        if mid in (low, high):
            break
        if fits(mid):
            low = mid
        else:
            high = mid
    mib = dict(tried).get(low)
    return dict(
        degree=degree,
        form=form or "none",
        limit_mib=limit_mib,
        max_seq_len=low,
        first_failing_seq_len=high,
        mib_at_max=mib,
        tried=tried,
    )


def main() -> None:
    """Runs the sweep and prints the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq_lens", default="1024,2048,4096")
    parser.add_argument("--degrees", default="1,2,4,8")
    parser.add_argument("--forms", default="ring,all_gather")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=None, help="Also write the JSON here.")
    parser.add_argument(
        "--tpu_topology",
        default=None,
        help="Compile (not run) for this TPU topology's chips instead, e.g. v5p-16 (libtpu).",
    )
    parser.add_argument(
        "--max_seq_under_mib",
        type=float,
        default=None,
        help="Search the longest sequence per degree and form within this many MiB per device.",
    )
    parser.add_argument("--search_unit", type=int, default=1024, help="Lengths tried: multiples.")
    parser.add_argument("--search_steps", type=int, default=3, help="Bisections after doubling.")
    args = parser.parse_args()
    devices = None
    if args.tpu_topology:
        from axlearn.common.aot_compilation import get_devices_for_topology

        devices = get_devices_for_topology(args.tpu_topology)
    config = dict(
        dim=args.dim,
        heads=args.heads,
        kv_heads=args.kv_heads,
        batch=1,
        dtype="float32",
        backend=args.tpu_topology or jax.default_backend(),
        repeats=args.repeats,
    )
    if args.max_seq_under_mib is not None:
        degrees = [int(d) for d in args.degrees.split(",")]
        if any(2 * d > args.search_unit or args.search_unit % (2 * d) for d in degrees):
            parser.error(f"--search_unit={args.search_unit} must be a multiple of 2 * degree.")
        found = []
        for degree in degrees:
            for form in [None] if degree == 1 else args.forms.split(","):
                found.append(max_seq_under(args.max_seq_under_mib, degree, form, args, devices))
        for row in found:
            assert row["max_seq_len"] % args.search_unit == 0, row
            assert row["first_failing_seq_len"] > row["max_seq_len"], row
        config.update(search_unit=args.search_unit, search_steps=args.search_steps)
        _write(dict(config=config, max_seq=found), args.output)
        return
    rows = []
    for seq_len in (int(s) for s in args.seq_lens.split(",")):
        base = measure(seq_len, 1, None, args, devices)
        base.update(ratio_vs_degree_1=1.0, efficiency=1.0)
        rows.append(base)
        print(json.dumps(base), file=sys.stderr, flush=True)
        for degree in (int(d) for d in args.degrees.split(",")):
            if degree == 1:
                continue
            for form in args.forms.split(","):
                row = measure(seq_len, degree, form, args, devices)
                ratio = row["temp_bytes_per_device"] / base["temp_bytes_per_device"]
                row.update(ratio_vs_degree_1=ratio, efficiency=(1 / degree) / ratio)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)  # Progress.
    for row in rows:
        # Invariants of every reported number.
        assert row["temp_bytes_per_device"] > 0, row
        assert devices is not None or row["step_time_s"] > 0, row
        assert row["efficiency"] > 0 and row["ratio_vs_degree_1"] > 0, row
    _write(dict(config=config, rows=rows), args.output)


def _write(report: dict, output: str | None) -> None:
    text = json.dumps(report, indent=1)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
