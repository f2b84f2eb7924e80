"""Where an accelerator's time goes, from a `jax.profiler` trace (an `.xplane.pb` file).

The trainer writes a 3-step trace when `start_trace_steps` is set (`gpu_sweep.py --trace_dir`
does that for its cells and copies the trace out, gzipped). This script reads the device planes
of such a trace (`/device:GPU:N`, `/device:TPU:N`; on GPUs the kernels of the `Stream #...`
lines) and prints one JSON object per device:

- span_ms: first kernel start to last kernel end; busy_ms: the union of kernel intervals over
  all streams (overlapping kernels count once); idle_fraction: 1 - busy/span (the device waiting
  for the host: dispatch, input, Python);
- by_category: kernel time per kind, from the kernel name and its `hlo_op`: matmul (GEMM
  kernels), attention (cuDNN fused/flash attention), collective (NCCL), memcpy, fusion (XLA's
  elementwise/reduction kernels), other; with each kind's share of the summed kernel time;
- top: the kernels with the most total time (name, hlo_op, kind, count, total, mean).

Divide by the steps traced (`--steps`, 3 for the trainer's trace) for per-step numbers. Reading
needs the XPlane protobuf module, which TensorFlow ships (`tensorflow.tsl.profiler.protobuf`);
the accelerator machine only writes the trace, this machine reads it.

Usage: python benchmarks/trace_summary.py TRACE.xplane.pb[.gz] [--steps 3] [--top 20]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from typing import Any

# First match wins; matched against "<kernel name> <hlo_op>", case-insensitive.
CATEGORIES = (
    ("collective", r"nccl|all-reduce|all-gather|reduce-scatter|all_reduce|all_gather|allreduce"),
    ("attention", r"fmha|flash|sdpa|attention"),
    ("matmul", r"gemm|xmma|cutlass|cublas|matmul|wgmma|\bdot\b|dot\.\d|dot_"),
    ("memcpy", r"memcpy|memset"),
    ("fusion", r"fusion|loop_|input_|reduce|transpose|copy|convert|scatter|gather"),
)
# Lines that profilers derive from the kernels (they would count every kernel twice).
_DERIVED_LINES = frozenset({"XLA Modules", "XLA Ops", "Steps", "XLA TraceMe", "Source code"})


def _xplane_pb2() -> Any:
    try:
        # pylint: disable-next=import-outside-toplevel
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as e:
        raise SystemExit(
            "trace_summary.py reads traces with TensorFlow's XPlane protobuf module "
            f"(tensorflow.tsl.profiler.protobuf), which is not importable here: {e}"
        ) from e
    return xplane_pb2


def kernel_category(name: str, hlo_op: str = "") -> str:
    """The kind of a device kernel (see `CATEGORIES`).

    Args:
        name: The kernel's name as the profiler recorded it.
        hlo_op: The HLO instruction it runs, if recorded.

    Returns:
        One of the `CATEGORIES` names, or "other".
    """
    text = f"{name} {hlo_op}".lower()
    for category, pattern in CATEGORIES:
        if re.search(pattern, text):
            return category
    return "other"


def _busy_ps(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, current_start, current_end = 0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def _stat_str(stat: Any, stat_names: dict) -> str:
    if stat.HasField("str_value"):
        return stat.str_value
    if stat.HasField("ref_value"):
        return stat_names.get(stat.ref_value, "")
    return ""


def summarize_plane(plane: Any, *, top: int = 20) -> dict:
    """Summarizes one device plane of an XSpace (see the module docstring).

    Args:
        plane: An `XPlane` message.
        top: How many kernels to list.

    Returns:
        The plane's summary as a JSON-able dict.
    """
    stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
    hlo_op_ids = {k for k, name in stat_names.items() if name == "hlo_op"}
    lines = [line for line in plane.lines if line.name.startswith("Stream")]
    if not lines:
        lines = [line for line in plane.lines if line.name not in _DERIVED_LINES]
    intervals, per_kernel = [], collections.defaultdict(lambda: [0, 0])
    by_category = collections.defaultdict(lambda: [0, 0])
    for line in lines:
        base_ps = line.timestamp_ns * 1000
        for event in line.events:
            name = plane.event_metadata[event.metadata_id].name
            hlo_op = next(
                (_stat_str(s, stat_names) for s in event.stats if s.metadata_id in hlo_op_ids), ""
            )
            start = base_ps + event.offset_ps
            intervals.append((start, start + event.duration_ps))
            key = (name, hlo_op)
            per_kernel[key][0] += 1
            per_kernel[key][1] += event.duration_ps
            category = by_category[kernel_category(name, hlo_op)]
            category[0] += 1
            category[1] += event.duration_ps
    kernel_ps = sum(ps for _, ps in by_category.values())
    span_ps = max(e for _, e in intervals) - min(s for s, _ in intervals) if intervals else 0
    busy_ps = _busy_ps(intervals)
    ranked = sorted(per_kernel.items(), key=lambda item: -item[1][1])[:top]
    return dict(
        plane=plane.name,
        kernels=len(intervals),
        span_ms=span_ps / 1e9,
        busy_ms=busy_ps / 1e9,
        idle_fraction=1.0 - busy_ps / span_ps if span_ps else None,
        kernel_ms=kernel_ps / 1e9,
        by_category={
            category: dict(count=count, ms=ps / 1e9, share=ps / kernel_ps if kernel_ps else None)
            for category, (count, ps) in sorted(by_category.items(), key=lambda kv: -kv[1][1])
        },
        top=[
            dict(
                name=name,
                hlo_op=hlo_op,
                category=kernel_category(name, hlo_op),
                count=count,
                total_ms=ps / 1e9,
                mean_us=ps / count / 1e6,
            )
            for (name, hlo_op), (count, ps) in ranked
        ],
    )


def summarize_trace(path: str, *, steps: int = 3, top: int = 20) -> dict:
    """Reads an `.xplane.pb` (or `.xplane.pb.gz`) file and summarizes its device planes.

    Args:
        path: The trace file.
        steps: Steps the trace covers (per-step numbers are totals over this).
        top: How many kernels to list per device.

    Returns:
        {"trace": path, "steps": steps, "devices": [plane summaries], "per_step": {...}}.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        space = _xplane_pb2().XSpace.FromString(f.read())
    devices = [
        summarize_plane(plane, top=top)
        for plane in space.planes
        if re.match(r"/device:(GPU|TPU):\d+$", plane.name)
    ]
    per_step = [
        dict(
            plane=d["plane"],
            span_ms=d["span_ms"] / steps,
            busy_ms=d["busy_ms"] / steps,
            by_category_ms={k: v["ms"] / steps for k, v in d["by_category"].items()},
        )
        for d in devices
    ]
    return dict(trace=path, steps=steps, devices=devices, per_step=per_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("trace", help="An .xplane.pb or .xplane.pb.gz file.")
    parser.add_argument("--steps", type=int, default=3, help="Steps the trace covers.")
    parser.add_argument("--top", type=int, default=20, help="Kernels listed per device.")
    args = parser.parse_args()
    summary = summarize_trace(args.trace, steps=args.steps, top=args.top)
    if not summary["devices"]:
        raise SystemExit(f"{args.trace}: no /device:GPU or /device:TPU plane in this trace.")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
