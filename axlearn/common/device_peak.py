"""Peak matmul FLOP/s per device, the denominator of MFU.

Accelerators: a table of vendor-published dense (no sparsity) peak matmul throughput per chip,
looked up by `jax.Device.device_kind`. Float32 entries are what XLA runs a float32 matmul at with
JAX's default precision: one bfloat16 pass on TPU (so the bf16 peak), TF32 tensor cores on
A100/H100/H200.

CPU: no published number applies, so the peak is *measured* at start by a float32 matmul probe
that runs on all local CPU devices at once (they share the host's cores); the per-device peak is
the aggregate probe throughput divided by the device count. Reports say "measured" for it.

Example:

    peak = device_peak_flops(dtype="float32", probe_dim=256, probe_repeats=2)
    print(peak.describe())
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable, Optional, Sequence

from axlearn.common.system_characteristics import CHIP_SPECS

# Canonical device name -> {dtype name: peak FLOP/s per device (chip)}. Read from the one table
# of chips and instance types that launch and AOT compilation also use.
PEAK_FLOPS_PER_DEVICE: dict[str, dict[str, float]] = {
    name: dict(spec.peak_flops) for name, spec in CHIP_SPECS.items()
}

# (regex searched in device_kind, canonical name), first match wins.
_DEVICE_KIND_PATTERNS: list[tuple[str, str]] = [
    (spec.device_kind_pattern, name) for name, spec in CHIP_SPECS.items()
]

_TABLE_NOTES = {
    "float32": {
        "tpu": "float32 matmuls run as one bfloat16 pass at JAX's default precision",
        "gpu": "float32 matmuls run on TF32 tensor cores at JAX's default precision",
    },
}


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """The peak FLOP/s of one device and where the number comes from.

    Attributes:
        device_kind: `jax.Device.device_kind` (e.g. "TPU v5 lite", "cpu").
        platform: "tpu", "gpu" or "cpu".
        dtype: "bfloat16" or "float32".
        flops_per_s: Peak FLOP/s of one device, or None if unknown.
        source: "table", "measured" (CPU probe) or "unknown".
        note: How the number was obtained, in words.
    """

    device_kind: str
    platform: str
    dtype: str
    flops_per_s: Optional[float]
    source: str
    note: str

    def describe(self) -> str:
        """Returns a one-line description for the start-of-run log."""
        if self.flops_per_s is None:
            return f"Peak FLOP/s per device: unknown for {self.device_kind!r} ({self.note})"
        return (
            f"Peak FLOP/s per device: {self.flops_per_s / 1e12:.4g} TFLOP/s {self.dtype} on "
            f"{self.device_kind!r} ({self.source}: {self.note})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


def canonical_device_name(device_kind: str) -> Optional[str]:
    """Maps a `device_kind` string to its entry in `PEAK_FLOPS_PER_DEVICE`, or None.

    Args:
        device_kind: E.g. "TPU v4", "NVIDIA H100 80GB HBM3".

    Returns:
        The canonical name, or None if the kind is not in the table.
    """
    for pattern, name in _DEVICE_KIND_PATTERNS:
        if re.search(pattern, device_kind):
            return name
    return None


def _dtype_name(dtype: Any) -> str:
    import numpy as np  # pylint: disable=import-outside-toplevel

    if isinstance(dtype, str) and dtype.startswith("jax.numpy."):
        dtype = dtype[len("jax.numpy.") :]
    try:
        import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

        name = jnp.dtype(dtype).name
    except TypeError:
        name = np.dtype(dtype).name
    if name in ("bfloat16", "float16"):
        return "bfloat16"  # fp16 and bf16 share the tensor-core / MXU peak on these devices.
    if name == "float32":
        return "float32"
    raise ValueError(f"device_peak: no peak FLOP/s for dtype {dtype!r} (use bfloat16 or float32)")


def lookup_peak_flops(device_kind: str, *, platform: str, dtype: Any) -> DevicePeak:
    """Returns the table peak for a device kind (source "unknown" if it is not in the table).

    Args:
        device_kind: `jax.Device.device_kind`.
        platform: `jax.Device.platform`.
        dtype: The training dtype (bfloat16/float16 or float32).

    Returns:
        The `DevicePeak`.
    """
    dtype = _dtype_name(dtype)
    name = canonical_device_name(device_kind)
    if name is None:
        return DevicePeak(
            device_kind=device_kind,
            platform=platform,
            dtype=dtype,
            flops_per_s=None,
            source="unknown",
            note="device kind not in axlearn.common.device_peak.PEAK_FLOPS_PER_DEVICE",
        )
    note = f"{name} dense peak"
    if dtype == "float32":
        note += "; " + _TABLE_NOTES["float32"]["tpu" if name.startswith("TPU") else "gpu"]
    return DevicePeak(
        device_kind=device_kind,
        platform=platform,
        dtype=dtype,
        flops_per_s=PEAK_FLOPS_PER_DEVICE[name][dtype],
        source="table",
        note=note,
    )


def measure_matmul_flops(
    devices: Optional[Sequence[Any]] = None,
    *,
    dim: int = 1024,
    dtype: Any = "float32",
    repeats: int = 5,
    matmuls_per_call: int = 4,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Measures the matmul FLOP/s per device with all `devices` busy at once.

    Runs `matmuls_per_call` chained [dim, dim] x [dim, dim] matmuls on every device concurrently
    (one jitted program sharded over the devices), after one warm-up call; returns the best of
    `repeats` timed calls, as FLOP/s per device (2 * dim^3 FLOPs per matmul).

    Args:
        devices: The devices (default: all local devices); devices of other processes are
            ignored.
        dim: Matrix size.
        dtype: Matmul dtype.
        repeats: Timed calls; the fastest counts.
        matmuls_per_call: Matmuls per call (amortizes dispatch).
        clock: Time source in seconds.

    Returns:
        FLOP/s per device.
    """
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    from jax.sharding import Mesh, NamedSharding  # pylint: disable=import-outside-toplevel
    from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel

    # Only this process's devices: in a multi-process run each process probes its own devices,
    # and the operands are placed from host memory straight onto them (never built on one device
    # and moved, which would be a cross-process transfer the CPU backend does not support).
    devices = [
        d
        for d in (devices if devices is not None else jax.local_devices())
        if d.process_index == jax.process_index()
    ]
    if not devices:
        raise ValueError("measure_matmul_flops: no given device is local to this process.")
    n = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    scale = 1.0 / np.sqrt(dim)  # Keeps the chained products bounded.
    host = np.full((n, dim, dim), scale, dtype=jnp.dtype(dtype))
    a = jax.device_put(host, sharding)
    b = jax.device_put(host, sharding)

    @jax.jit
    def chain(a, b):
        x = a
        for _ in range(matmuls_per_call):
            x = jnp.einsum("nij,njk->nik", x, b, preferred_element_type=x.dtype)
        return x

    # The probe's own (process-local) mesh replaces any context mesh the caller set (the
    # trainer's global mesh spans other processes' devices).
    with jax.set_mesh(mesh):
        chain(a, b).block_until_ready()  # Compile and warm up.
        best = float("inf")
        for _ in range(repeats):
            start = clock()
            chain(a, b).block_until_ready()
            best = min(best, clock() - start)
    flops_per_device = 2.0 * dim**3 * matmuls_per_call
    return flops_per_device / max(best, 1e-12)


def device_peak_flops(
    devices: Optional[Sequence[Any]] = None,
    *,
    dtype: Any = "float32",
    probe_dim: int = 1024,
    probe_repeats: int = 5,
) -> DevicePeak:
    """Returns the peak FLOP/s per device: from the table, or measured on CPU.

    Args:
        devices: The devices training runs on (default: `jax.devices()`); the first one's kind is
            used; the CPU probe runs on the local ones.
        dtype: The training dtype.
        probe_dim: CPU probe matrix size.
        probe_repeats: CPU probe timed calls.

    Returns:
        The `DevicePeak`.
    """
    import jax  # pylint: disable=import-outside-toplevel

    devices = list(devices if devices is not None else jax.devices())
    first = devices[0]
    if first.platform != "cpu":
        return lookup_peak_flops(first.device_kind, platform=first.platform, dtype=dtype)
    dtype = _dtype_name(dtype)
    local = [d for d in devices if d.process_index == jax.process_index()]
    # The probe always multiplies float32: XLA:CPU has no fast bfloat16 matmul, and the float32
    # number is what a CPU run can reach at best.
    flops = measure_matmul_flops(local, dim=probe_dim, dtype="float32", repeats=probe_repeats)
    return DevicePeak(
        device_kind=first.device_kind,
        platform="cpu",
        dtype=dtype,
        flops_per_s=flops,
        source="measured",
        note=(
            f"float32 {probe_dim}x{probe_dim} matmul probe run at start on {len(local)} CPU "
            f"device(s) at once, best of {probe_repeats}, aggregate / {len(local)}"
        ),
    )
