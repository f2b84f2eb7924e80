"""Where a save's snapshot lives: on the device, partly on the device, or on the host.

A save must take a consistent copy of the state before the next train step overwrites (donates)
the state's buffers. The copy can live:

- on the device ("device"): a device-to-device copy, dispatched in microseconds; it costs one
  state's worth of device memory beside the next steps until its bytes are on the host;
- partly on the device ("partial"): as many leaves as fit in the device memory the step leaves
  free are copied on the device, the rest is copied to the host before `save` returns;
- on the host ("host"): `save` blocks for the device-to-host copy of the whole state (seconds
  for a multi-GB state), no extra device memory.

`choose_snapshot` picks one from numbers, not from the backend's name: the compiled train
step's peak memory per device (XLA's memory analysis), the state's bytes per device, and each
device's memory limit (`memory_stats()["bytes_limit"]`, or an injected limit). A copy must fit
beside the step's peak with a safety margin of `MARGIN_FRACTION` of the limit:

    free = limit - peak - MARGIN_FRACTION * limit
    device   if state bytes <= free on every device
    partial  if some leaves fit: the largest leaves first, as many as fit in `free`
    host     otherwise, or when a device reports no memory limit (said once in the log)

Example:

    choice = choose_snapshot(leaf_bytes={"w": {0: 4e9}, "m": {0: 4e9}}, step_peak_bytes=60e9,
                             limit_bytes={0: 70e9})
    choice.mode  # "partial": 6.5 GB free beside the peak, one 4 GB leaf fits.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping, Optional

import jax
import numpy as np

from axlearn.common.checkpointer import state_tree
from axlearn.common.device_memory import format_bytes

SNAPSHOT_DEVICE = "device"
SNAPSHOT_PARTIAL = "partial"
SNAPSHOT_HOST = "host"
# The values of TensorStoreStateStorage.Config.snapshot (None: chosen by `choose_snapshot`).
SNAPSHOT_MODES = (SNAPSHOT_DEVICE, SNAPSHOT_PARTIAL, SNAPSHOT_HOST)
# Device memory kept free beside the step's peak and the snapshot, as a fraction of the limit:
# the step's peak from XLA's analysis misses allocator fragmentation and runtime buffers.
MARGIN_FRACTION = 0.05
# The share of the host's available memory that a save may use for its host buffers when
# `max_concurrent_gb` is None.
HOST_BUDGET_FRACTION = 0.5

MemoryLimitFn = Callable[[Any], Optional[int]]


def _gb(num_bytes: Optional[float]) -> str:
    return format_bytes(num_bytes)


def available_host_memory_bytes() -> Optional[int]:
    """The host's available memory in bytes (MemAvailable of /proc/meminfo; None if unknown).

    Returns:
        Bytes, or None.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):
        return None


def device_memory_limit(device: Any) -> Optional[int]:
    """The default memory limit source: the device's `memory_stats()["bytes_limit"]`.

    CPU devices report no stats; their memory is the host's, so a CPU device's limit is the
    host's available memory divided among this process's CPU devices.

    Args:
        device: A jax device.

    Returns:
        The limit in bytes, or None when the device reports none.
    """
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    if device.platform == "cpu":
        available = available_host_memory_bytes()
        if available is None:
            return None
        num_cpu = sum(1 for d in jax.local_devices(backend="cpu")) or 1
        return available // num_cpu
    return None


def fixed_memory_limit(limit_bytes: Optional[int]) -> MemoryLimitFn:
    """A memory limit source giving every device the same limit (None: no limit reported).

    For `TensorStoreStateStorage.Config.memory_limit`, e.g. to simulate an accelerator's limit
    on CPU: `config_for_function(fixed_memory_limit).set(limit_bytes=16 * 2**30)`.

    Args:
        limit_bytes: The limit of every device, or None for a device reporting none.

    Returns:
        A function (device) -> limit.
    """

    def limit(device: Any) -> Optional[int]:
        del device
        return None if limit_bytes is None else int(limit_bytes)

    return limit


@dataclasses.dataclass(frozen=True)
class SnapshotChoice:
    """The snapshot mode of a run's saves and the numbers it was chosen from (per device).

    Attributes:
        mode: "device", "partial" or "host".
        source: "chosen" (from the numbers), "configured" (the `snapshot` field) or
            "no memory limit" (a device reports none: host).
        state_bytes: The state's bytes on the fullest device.
        device_bytes: Bytes of the leaves snapshotted on the device, on the fullest device.
        num_leaves: Array leaves of the state.
        device_paths: Paths of the leaves snapshotted on the device (all of them for "device").
        limit_bytes: The smallest device memory limit (None if unknown).
        peak_bytes: The step's peak memory per device (None if unknown).
        margin_bytes: The safety margin kept free.
        device: The device that decided it (the one reporting no limit, or the tightest).
        peak_from_step: Whether `peak_bytes` is a compiled step's peak (else the state's own
            bytes: no step was given, e.g. a Checkpointer used on its own).
    """

    mode: str
    source: str
    state_bytes: int
    device_bytes: int
    num_leaves: int
    device_paths: frozenset
    limit_bytes: Optional[int] = None
    peak_bytes: Optional[int] = None
    margin_bytes: int = 0
    device: str = ""
    peak_from_step: bool = True

    @property
    def free_bytes(self) -> Optional[int]:
        """Device memory left beside the step's peak and the margin (None if unknown)."""
        if self.limit_bytes is None or self.peak_bytes is None:
            return None
        return self.limit_bytes - self.peak_bytes - self.margin_bytes

    def short(self) -> str:
        """E.g. 'partial (3 of 8 leaves, 6.20 of 12.53 GB on the device)'."""
        if self.mode == SNAPSHOT_PARTIAL:
            return (
                f"partial ({len(self.device_paths)} of {self.num_leaves} leaves, "
                f"{_gb(self.device_bytes)} of {_gb(self.state_bytes)} on the device)"
            )
        return self.mode

    def describe(self) -> str:
        """The line logged once at start, e.g. 'checkpoint snapshot: device, 12.53 GB of ...'."""
        peak = "the step's peak" if self.peak_from_step else "the state itself (no step given)"
        numbers = (
            f"{peak} {_gb(self.peak_bytes)} of the {_gb(self.limit_bytes)} limit per "
            f"device, margin {_gb(self.margin_bytes)}"
        )
        if self.source == "configured":
            text = f"checkpoint snapshot: {self.short()} (configured by the snapshot field)"
            if self.limit_bytes is not None and self.peak_bytes is not None:
                text += f"; state {_gb(self.state_bytes)} per device, {numbers}"
            return text
        if self.source == "no memory limit":
            return (
                f"checkpoint snapshot: host, because device {self.device} reports no memory "
                f"limit (memory_stats() has no bytes_limit), so a device copy of the "
                f"{_gb(self.state_bytes)} state per device cannot be checked to fit; set "
                "checkpointer.storage.snapshot='device' to force one"
            )
        free = self.free_bytes
        if self.mode == SNAPSHOT_DEVICE:
            return (
                f"checkpoint snapshot: device, {_gb(self.state_bytes)} of {_gb(free)} free beside "
                f"{numbers}"
            )
        if self.mode == SNAPSHOT_PARTIAL:
            return (
                f"checkpoint snapshot: {self.short()}, {_gb(free)} free beside {numbers}; the "
                "other leaves are copied to the host before each save returns"
            )
        return (
            f"checkpoint snapshot: host, no leaf of the {_gb(self.state_bytes)} state fits in the "
            f"{_gb(max(0, free or 0))} free beside {numbers}; each save blocks for the "
            "device-to-host copy"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (device paths as a count)."""
        d = dataclasses.asdict(self)
        d["device_paths"] = len(self.device_paths)
        d["free_bytes"] = self.free_bytes
        return d


def leaf_bytes_per_device(state: Any) -> dict[str, dict[Any, int]]:
    """Bytes each array leaf of `state` holds on each of this process's devices.

    Args:
        state: A pytree (jax.Arrays or ShapeDtypeStructs with shardings; other leaves are
            ignored).

    Returns:
        {leaf path: {device: bytes}}, in tree order.
    """
    pairs, _ = state_tree.flatten_state(state)
    result: dict[str, dict[Any, int]] = {}
    for path, leaf in pairs:
        sharding = getattr(leaf, "sharding", None)
        if sharding is None or not hasattr(leaf, "shape"):
            continue
        shape = tuple(leaf.shape)
        itemsize = np.dtype(leaf.dtype).itemsize
        per_device: dict[Any, int] = {}
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            region = state_tree.normalize_index(index, shape)
            per_device[device] = math.prod(state_tree.region_shape(region)) * itemsize
        result[path] = per_device
    return result


def choose_snapshot(
    *,
    leaf_bytes: Mapping[str, Mapping[Any, int]],
    step_peak_bytes: Optional[int],
    limit_bytes: Mapping[Any, Optional[int]],
    configured: Optional[str] = None,
) -> SnapshotChoice:
    """Chooses the snapshot mode (see the module docstring for the rule).

    Args:
        leaf_bytes: {leaf path: {device: bytes}} (see `leaf_bytes_per_device`).
        step_peak_bytes: The train step's peak memory per device; None: the state's own bytes
            (the state is on the device anyway; used when no step was compiled).
        limit_bytes: {device: memory limit in bytes, or None if it reports none}.
        configured: The `snapshot` field, if set: that mode, with the numbers for the log.
            "partial" takes as many leaves as fit (none if the limit is unknown).

    Returns:
        The choice.
    """
    devices = sorted({d for per in leaf_bytes.values() for d in per} | set(limit_bytes), key=str)
    used = {d: sum(per.get(d, 0) for per in leaf_bytes.values()) for d in devices}
    state_bytes = max(used.values(), default=0)
    num_leaves = len(leaf_bytes)
    peak = state_bytes if step_peak_bytes is None else int(step_peak_bytes)
    all_paths = frozenset(leaf_bytes)
    common = dict(
        state_bytes=state_bytes,
        num_leaves=num_leaves,
        peak_bytes=peak,
        peak_from_step=step_peak_bytes is not None,
    )
    missing = [d for d in devices if limit_bytes.get(d) is None]
    if missing and configured is None:
        return SnapshotChoice(
            mode=SNAPSHOT_HOST,
            source="no memory limit",
            device_bytes=0,
            device_paths=frozenset(),
            device=str(missing[0]),
            **common,
        )
    limits = {d: int(limit_bytes[d]) for d in devices if limit_bytes.get(d) is not None}
    tightest = min(limits, key=limits.get) if limits else None
    limit = limits[tightest] if limits else None
    margin = int(MARGIN_FRACTION * limit) if limit is not None else 0
    free = {d: limits[d] - peak - int(MARGIN_FRACTION * limits[d]) for d in limits}
    # The largest leaves first (ties in tree order), each taken if it fits on every device.
    order = sorted(leaf_bytes, key=lambda p: -max(leaf_bytes[p].values(), default=0))
    taken, filled = [], {d: 0 for d in free}
    for path in order:
        per = leaf_bytes[path]
        if free and all(filled[d] + per.get(d, 0) <= free[d] for d in free):
            taken.append(path)
            for d in free:
                filled[d] += per.get(d, 0)
    if configured is not None:
        mode = configured
        paths = {SNAPSHOT_DEVICE: all_paths, SNAPSHOT_HOST: frozenset()}.get(
            configured, frozenset(taken)
        )
        source = "configured"
    elif len(taken) == num_leaves:
        mode, paths, source = SNAPSHOT_DEVICE, all_paths, "chosen"
    elif taken:
        mode, paths, source = SNAPSHOT_PARTIAL, frozenset(taken), "chosen"
    else:
        mode, paths, source = SNAPSHOT_HOST, frozenset(), "chosen"
    device_bytes = max((sum(leaf_bytes[p].get(d, 0) for p in paths) for d in devices), default=0)
    return SnapshotChoice(
        mode=mode,
        source=source,
        device_bytes=device_bytes,
        device_paths=paths,
        limit_bytes=limit,
        margin_bytes=margin,
        device=str(tightest) if tightest is not None else "",
        **common,
    )


def host_budget_bytes(max_concurrent_gb: Optional[float]) -> int:
    """The host memory a save may hold in transfer and staging buffers.

    Args:
        max_concurrent_gb: The configured budget in GB, or None: `HOST_BUDGET_FRACTION` of the
            host's available memory now (1 GB if unknown).

    Returns:
        Bytes.
    """
    if max_concurrent_gb is not None:
        return int(max_concurrent_gb * 1e9)
    available = available_host_memory_bytes()
    if available is None:
        return int(1e9)
    return int(HOST_BUDGET_FRACTION * available)
