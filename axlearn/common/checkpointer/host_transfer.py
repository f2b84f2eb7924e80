"""How a checkpoint moves device arrays to host memory (used by `tensorstore_save`).

Two routes, chosen per device by `resolve_host_transfer`:

- "pinned_host": `jax.device_put(x, x.sharding.with_memory_kind("pinned_host"))`, an
  asynchronous DMA that XLA runs without Python's GIL; the chunk files are then written from
  `np.asarray` of the pinned array (no copy of ours; whether the runtime makes a host-to-host
  copy there has not been measured). The default on accelerators that
  have that memory space.
- "numpy": `copy_to_host_async()` then `np.asarray`. On GPUs `np.asarray` holds the GIL for the
  whole copy into pageable memory: measured on an H100 for a 12.5 GB state, the training loop's
  thread, which needs the GIL to dispatch its steps, stalled for the ~8 s of the transfer. The
  default on CPUs, where a device array is host memory and the copy is a memcpy.

A pinned copy that fails (e.g. pinned memory exhausted) falls back to "numpy" for that shard with
a warning.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Optional

import jax
import numpy as np
from absl import logging

# How a device snapshot reaches host memory (see the module docstring): "pinned_host" (an
# asynchronous DMA by XLA into page-locked host memory) or "numpy" (`np.asarray`).
HOST_TRANSFERS = ("pinned_host", "numpy")


@functools.cache
def _memory_kinds(device: jax.Device) -> frozenset[str]:
    # Cached: asked for every shard of every save, in the background writer.
    try:
        return frozenset(m.kind for m in device.addressable_memories())
    except Exception:  # pylint: disable=broad-except  # Backends without memory spaces.
        return frozenset()


def resolve_host_transfer(requested: Optional[str], device: jax.Device) -> str:
    """How device-snapshot shards on `device` are moved to host memory.

    Args:
        requested: One of `HOST_TRANSFERS`, or None: "pinned_host" where the device has that
            memory space and is not a CPU (on a CPU both are host memory copies), else "numpy".

    Returns:
        One of `HOST_TRANSFERS`.

    Raises:
        ValueError: If `requested` is unknown, or "pinned_host" on a device without it.
    """
    if requested is not None and requested not in HOST_TRANSFERS:
        raise ValueError(
            f"checkpointer.storage.host_transfer={requested!r} is not one of "
            f"{', '.join(HOST_TRANSFERS)} (or None: chosen per device)."
        )
    has_pinned = "pinned_host" in _memory_kinds(device)
    if requested == "pinned_host" and not has_pinned:
        raise ValueError(
            f"checkpointer.storage.host_transfer='pinned_host', but device {device} has no "
            f"pinned_host memory (it has: {', '.join(sorted(_memory_kinds(device))) or 'none'})."
        )
    if requested is not None:
        return requested
    return "pinned_host" if has_pinned and device.platform != "cpu" else "numpy"


def is_cpu(arr: jax.Array) -> bool:
    """Whether `arr` lives on CPU devices.

    Args:
        arr: A jax.Array.

    Returns:
        True if its (first) device is a CPU.
    """
    return next(iter(arr.sharding.device_set)).platform == "cpu"


def to_host(data: jax.Array, *, copy: bool) -> np.ndarray:
    """`np.asarray(data)`, copied on CPU when asked (there it aliases the device buffer).

    Args:
        data: A single-device jax.Array.
        copy: Whether the result must not share memory with a CPU device buffer (which a later
            step may donate).

    Returns:
        The host array.
    """
    host = np.asarray(data)
    # On CPU np.asarray aliases the device buffer: copy when the buffer may be donated later.
    if copy and is_cpu(data):
        host = np.array(host, copy=True)
    return host


def start_host_copy(shard: Any, host_transfer: Optional[str]) -> None:
    """Starts moving `shard.data` to host memory by the route `resolve_host_transfer` gives.

    Args:
        shard: An object with `data` (a single-device jax.Array) and `host_array` (set here to
            the pinned-host array on that route); `finish_host_copy` waits for it.
        host_transfer: The configured route, or None (per device).
    """
    device = next(iter(shard.data.devices()))
    if resolve_host_transfer(host_transfer, device) == "pinned_host":
        try:
            shard.host_array = _to_pinned_host(shard.data)
            return
        except Exception as e:  # pylint: disable=broad-except
            _warn_pinned_failed(device, e)
    shard.data.copy_to_host_async()


def _to_pinned_host(data: jax.Array) -> jax.Array:
    """Starts XLA's asynchronous copy of a single-device array into pinned host memory."""
    return jax.device_put(data, data.sharding.with_memory_kind("pinned_host"))


def _warn_pinned_failed(device: jax.Device, error: Exception) -> None:
    logging.warning(
        "Checkpoint: copying to pinned host memory of %s failed (%s); this shard is copied with "
        "np.asarray instead, which holds Python's GIL while it copies (training steps may stall). "
        "Set checkpointer.storage.host_transfer='numpy' to use that route throughout.",
        device,
        error,
    )


def finish_host_copy(shard: Any) -> None:
    """Waits for `start_host_copy`; `shard.data` becomes a host array the caller owns.

    Args:
        shard: As passed to `start_host_copy`. On the pinned route `shard.host_array` stays set:
            it keeps the pinned buffer that `shard.data` views alive until the chunk is written.
    """
    if shard.host_array is not None:
        try:
            shard.host_array.block_until_ready()  # Waits without holding the GIL.
        except Exception as e:  # pylint: disable=broad-except  # E.g. pinned memory exhausted.
            _warn_pinned_failed(next(iter(shard.data.devices())), e)
            shard.host_array = None
    if shard.host_array is None:
        shard.data = to_host(shard.data, copy=True)
        return
    # A view of the pinned buffer, which `host_array` keeps alive until the chunk is written. On
    # a CPU "pinned" memory is host memory that may share the source's buffer: copy it there.
    shard.data = to_host(shard.host_array, copy=True)
    if is_cpu(shard.host_array):
        shard.host_array = None


def reserve_pinned_host(
    arrays: Iterable[jax.Array], *, host_transfer: Optional[str], budget_bytes: int
) -> int:
    """Moves the shards the writer will move to pinned host memory once, then frees them.

    The first transfer into page-locked host memory has to allocate it. Measured on an H100 with
    a 12.5 GB state, the steps after a run's first save took 0.33-1.2 s instead of 0.27 s while
    its transfer ran, and those after the second save were unchanged, which says that the
    runtime keeps freed page-locked memory for reuse. Calling this once before training (with
    the same calls a save makes, on the same shards) moves that first-time cost into start-up.

    Args:
        arrays: The arrays a save moves to host memory (the state's array leaves).
        host_transfer: The configured route, or None (per device); shards whose route is not
            "pinned_host" are skipped.
        budget_bytes: At most this many bytes are moved (the writer never holds more staged).

    Returns:
        The bytes moved (0 where no device uses the pinned route).
    """
    pending, moved = [], 0
    for arr in arrays:
        for shard in arr.addressable_shards:
            if shard.replica_id != 0:
                continue
            if resolve_host_transfer(host_transfer, shard.device) != "pinned_host":
                continue
            if moved + shard.data.nbytes > budget_bytes:
                break
            pending.append(_to_pinned_host(shard.data))
            moved += shard.data.nbytes
    for copy in pending:
        copy.block_until_ready()
    for copy in pending:
        copy.delete()
    return moved
