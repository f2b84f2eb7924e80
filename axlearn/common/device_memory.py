"""Memory numbers: XLA's compiled memory analysis and live peak memory per device.

- Compiled: `jitted.lower(...).compile().memory_analysis()`, XLA's plan for one device's buffers
  of a compiled program (arguments, outputs, temporaries, code; aliased = donated arguments reused
  as outputs). Total = argument + output + temp + generated code - alias.
- Live: `Device.memory_stats()` on accelerators (bytes in use, peak bytes in use, limit). CPU
  devices report no stats, so the host process's resident set size (RSS) is used instead: current
  RSS from /proc/self/statm, peak RSS from getrusage, limit = the host's physical memory. That is
  process-wide and shared by all CPU devices; reports say "host RSS" for it.

Example:

    import jax, jax.numpy as jnp
    compiled = jax.jit(lambda x: x @ x).lower(jnp.ones((64, 64))).compile()
    print(compiled_memory_stats(compiled).describe())
    print(live_memory_per_device()[0].describe())
"""

from __future__ import annotations

import dataclasses
import os
import resource
from typing import Any, Optional, Sequence

GB = 1e9


def format_bytes(num_bytes: Optional[float]) -> str:
    """Formats bytes as 'X.Y GB' (decimal units; 'n/a' for None).

    Args:
        num_bytes: Bytes.

    Returns:
        The text.
    """
    if num_bytes is None:
        return "n/a"
    if num_bytes >= 1e9:
        return f"{num_bytes / 1e9:.2f} GB"
    if num_bytes >= 1e6:
        return f"{num_bytes / 1e6:.1f} MB"
    return f"{num_bytes / 1e3:.1f} KB"


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory analysis of a compiled program, per device, in bytes.

    Attributes:
        argument_bytes: Input buffers.
        output_bytes: Output buffers.
        temp_bytes: Temporaries.
        alias_bytes: Arguments donated and reused as outputs (counted once in the total).
        generated_code_bytes: Compiled code.
        host_temp_bytes: Host-side temporaries (host offloading).
        peak_bytes: XLA's own peak estimate, when the runtime reports one.
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    host_temp_bytes: int
    peak_bytes: Optional[int] = None

    @property
    def total_bytes(self) -> int:
        """argument + output + temp + generated code - alias."""
        return (
            self.argument_bytes
            + self.output_bytes
            + self.temp_bytes
            + self.generated_code_bytes
            - self.alias_bytes
        )

    def describe(self) -> str:
        """Returns the one-line description printed after compilation."""
        text = (
            f"Compiled memory per device: total {format_bytes(self.total_bytes)}, "
            f"argument {format_bytes(self.argument_bytes)}, "
            f"output {format_bytes(self.output_bytes)}, temp {format_bytes(self.temp_bytes)}, "
            f"alias {format_bytes(self.alias_bytes)}, "
            f"code {format_bytes(self.generated_code_bytes)}, "
            f"host temp {format_bytes(self.host_temp_bytes)}"
        )
        if self.peak_bytes is not None:
            text += f", XLA peak estimate {format_bytes(self.peak_bytes)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields and the total as a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def compiled_memory_stats(compiled: Any) -> Optional[CompiledMemory]:
    """Returns the memory analysis of a compiled program (`jax.stages.Compiled`).

    Args:
        compiled: `jitted.lower(...).compile()`.

    Returns:
        The `CompiledMemory`, or None if the backend provides no analysis.
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    if isinstance(stats, (list, tuple)):  # Older runtimes: one entry per device.
        stats = stats[0]

    def get(name: str) -> int:
        return int(getattr(stats, name, 0) or 0)

    peak = getattr(stats, "peak_memory_in_bytes", None)
    return CompiledMemory(
        argument_bytes=get("argument_size_in_bytes"),
        output_bytes=get("output_size_in_bytes"),
        temp_bytes=get("temp_size_in_bytes"),
        alias_bytes=get("alias_size_in_bytes"),
        generated_code_bytes=get("generated_code_size_in_bytes"),
        host_temp_bytes=get("host_temp_size_in_bytes"),
        peak_bytes=int(peak) if peak else None,
    )


@dataclasses.dataclass(frozen=True)
class LiveMemory:
    """Live memory of one device, in bytes.

    Attributes:
        device: A description of the device ("TPU_0", "cpu:0 (host RSS)").
        source: "device" (Device.memory_stats) or "host RSS".
        bytes_in_use: Currently in use.
        peak_bytes_in_use: Peak so far.
        bytes_limit: Capacity (None if unknown).
    """

    device: str
    source: str
    bytes_in_use: Optional[int]
    peak_bytes_in_use: Optional[int]
    bytes_limit: Optional[int]

    @property
    def peak_fraction(self) -> Optional[float]:
        """peak_bytes_in_use / bytes_limit, or None if either is unknown."""
        if not self.peak_bytes_in_use or not self.bytes_limit:
            return None
        return self.peak_bytes_in_use / self.bytes_limit

    def describe(self) -> str:
        """Returns e.g. 'cpu:0 (host RSS): peak 1.20 GB / 24.00 GB (5.0%), in use 1.10 GB'."""
        frac = self.peak_fraction
        pct = f" ({100 * frac:.1f}%)" if frac is not None else ""
        return (
            f"{self.device} ({self.source}): peak {format_bytes(self.peak_bytes_in_use)} / "
            f"{format_bytes(self.bytes_limit)}{pct}, in use {format_bytes(self.bytes_in_use)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields and the peak fraction as a JSON-ready dict."""
        d = dataclasses.asdict(self)
        d["peak_fraction"] = self.peak_fraction
        return d


def host_rss_bytes() -> tuple[Optional[int], int]:
    """Returns (current RSS, peak RSS) of this process in bytes.

    Current RSS comes from /proc/self/statm (None where that does not exist); peak RSS from
    getrusage (kilobytes on Linux).

    Returns:
        (current, peak).
    """
    current = None
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # getrusage's high-water mark can lag the current RSS slightly; the peak is at least current.
    return current, max(peak, current or 0)


def host_memory_bytes() -> Optional[int]:
    """Returns the host's physical memory in bytes (None if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def live_memory_per_device(devices: Optional[Sequence[Any]] = None) -> list[LiveMemory]:
    """Returns the live memory of each local device (host RSS for CPU devices).

    Args:
        devices: Devices to report (default: `jax.local_devices()`).

    Returns:
        One `LiveMemory` per device.
    """
    import jax  # pylint: disable=import-outside-toplevel

    devices = list(devices if devices is not None else jax.local_devices())
    result = []
    rss = None
    for device in devices:
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if stats:
            result.append(
                LiveMemory(
                    device=str(device),
                    source="device",
                    bytes_in_use=stats.get("bytes_in_use"),
                    peak_bytes_in_use=stats.get("peak_bytes_in_use"),
                    bytes_limit=stats.get("bytes_limit"),
                )
            )
            continue
        if rss is None:
            rss = host_rss_bytes()
        result.append(
            LiveMemory(
                device=str(device),
                source="host RSS",
                bytes_in_use=rss[0],
                peak_bytes_in_use=rss[1],
                bytes_limit=host_memory_bytes(),
            )
        )
    return result
