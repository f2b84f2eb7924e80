"""The per-step record and its one-line log format.

A step record is a flat dict (also what `metrics.jsonl` and the run summary are built from):

    step, max_step, loss, step_time_s, overheads ({kind: s}), excluded_reason,
    learning_rate, gradient_norm, consumed_tokens, tokens_per_s_per_device,
    real_tokens_per_s_per_device, real_tokens, tflops_per_device, mfu, eta_s,
    loss_scale, skipped_steps, nonfinite_steps, checkpoint ({snapshot_s,
    wait_for_previous_s, other_s, snapshot, ...}: the parts of a save's `checkpoint`
    overhead)                                              (optional keys may be absent)

`step_throughput` derives the throughput keys from a step's wall time by the definitions in
docs/metrics.md; `format_step_line` renders a record as one readable line, e.g.

    step 12/100 | loss 5.4321 | lr 1.00e-03 | grad_norm 0.853 | tokens 6.14K |
    0.162 s (input 0.001 s) | 0.198 TFLOP/s/device | 3.16K tok/s/device (real 3.01K) |
    MFU 8.4% | ETA 14 s

(on one line). A step whose interval contains compile/eval/checkpoint/profiler time is labelled
`[<reason>, not in averages]` after the step number.
"""

from __future__ import annotations

import math
from typing import Any, Optional


def _si(value: float) -> str:
    """Formats a count with a K/M/G/T suffix and 3 significant digits."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def format_duration(seconds: float) -> str:
    """Formats seconds as e.g. '14 s', '3m05s', '2h07m', '1d03h'.

    Args:
        seconds: Non-negative seconds.

    Returns:
        The text.
    """
    if not math.isfinite(seconds):
        return "n/a"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def step_throughput(
    *,
    wall_s: float,
    num_devices: int,
    tokens_per_step: int,
    real_tokens: Optional[float] = None,
    flops_per_step: Optional[float] = None,
    peak_flops_per_device: Optional[float] = None,
) -> dict[str, float]:
    """Returns a step's throughput numbers, per device, from its wall time.

    - tokens_per_s_per_device = tokens_per_step / wall_s / num_devices (padded tokens).
    - real_tokens_per_s_per_device = real_tokens / wall_s / num_devices (non-padding targets).
    - tflops_per_device = flops_per_step / wall_s / num_devices / 1e12 (model FLOPs).
    - mfu = tflops_per_device * 1e12 / peak_flops_per_device.

    Args:
        wall_s: The step's wall time (> 0).
        num_devices: Devices the step ran on.
        tokens_per_step: Global batch size x sequence length.
        real_tokens: Non-padding target tokens in the global batch, if known.
        flops_per_step: Model FLOPs per step, if known.
        peak_flops_per_device: Peak FLOP/s of one device, if known.

    Returns:
        The keys that could be computed.

    Raises:
        ValueError: If wall_s <= 0 or num_devices < 1.
    """
    if wall_s <= 0:
        raise ValueError(f"step_throughput: wall_s must be > 0, got {wall_s}")
    if num_devices < 1:
        raise ValueError(f"step_throughput: num_devices must be >= 1, got {num_devices}")
    out = dict(tokens_per_s_per_device=tokens_per_step / wall_s / num_devices)
    if real_tokens is not None:
        out["real_tokens_per_s_per_device"] = real_tokens / wall_s / num_devices
    if flops_per_step is not None:
        out["tflops_per_device"] = flops_per_step / wall_s / num_devices / 1e12
        if peak_flops_per_device:
            out["mfu"] = flops_per_step / wall_s / num_devices / peak_flops_per_device
    return out


def _fmt_float(value: Any, fmt: str) -> str:
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return str(value)


def format_checkpoint_split(split: dict[str, Any]) -> str:
    """Renders a save's blocking time in parts, e.g. 'snapshot 0.004 s (device), waiting for the
    previous save 0.000 s, rest 0.002 s'.

    Args:
        split: A record's `checkpoint` entry (`snapshot_s`, `wait_for_previous_s`, `other_s`,
            optional `snapshot` and `previous_write_gb_per_s`).

    Returns:
        The text.
    """
    text = f"snapshot {float(split.get('snapshot_s', 0.0)):.3f} s"
    if split.get("snapshot"):
        text += f" ({split['snapshot']})"
    text += f", waiting for the previous save {float(split.get('wait_for_previous_s', 0.0)):.3f} s"
    if split.get("previous_write_gb_per_s") is not None:
        text += f" (its write ran at {float(split['previous_write_gb_per_s']):.3g} GB/s)"
    text += f", rest {float(split.get('other_s', 0.0)):.3f} s"
    if split.get("input_position_s"):
        text += f" (input position {float(split['input_position_s']):.3f} s)"
    return text


def format_step_line(record: dict[str, Any]) -> str:
    """Renders a step record as one log line (see the module docstring).

    Args:
        record: The step record; only `step` and `step_time_s` are required.

    Returns:
        The line.
    """
    max_step = record.get("max_step")
    head = f"step {record['step']}"
    if max_step is not None and math.isfinite(float(max_step)):
        head += f"/{int(max_step)}"
    reason = record.get("excluded_reason")
    if reason:
        head += f" [{reason}, not in averages]"
    parts = [head]
    if "loss" in record:
        parts.append(f"loss {_fmt_float(record['loss'], '.4f')}")
    if record.get("learning_rate") is not None:
        parts.append(f"lr {_fmt_float(record['learning_rate'], '.2e')}")
    if record.get("gradient_norm") is not None:
        parts.append(f"grad_norm {_fmt_float(record['gradient_norm'], '.4g')}")
    if record.get("consumed_tokens") is not None:
        parts.append(f"tokens {_si(float(record['consumed_tokens']))}")
    step_text = f"{float(record['step_time_s']):.3f} s"
    overheads = {k: v for k, v in (record.get("overheads") or {}).items() if v > 0}
    if overheads:
        texts = []
        for kind, seconds in overheads.items():
            text = f"{kind} {seconds:.3f} s"
            if kind == "checkpoint" and record.get("checkpoint"):
                text += " [" + format_checkpoint_split(record["checkpoint"]) + "]"
            texts.append(text)
        step_text += " (" + ", ".join(texts) + ")"
    parts.append(step_text)
    if record.get("tflops_per_device") is not None:
        parts.append(f"{_fmt_float(record['tflops_per_device'], '.4g')} TFLOP/s/device")
    if record.get("tokens_per_s_per_device") is not None:
        text = f"{_si(float(record['tokens_per_s_per_device']))} tok/s/device"
        if record.get("real_tokens_per_s_per_device") is not None:
            text += f" (real {_si(float(record['real_tokens_per_s_per_device']))})"
        parts.append(text)
    if record.get("mfu") is not None:
        parts.append(f"MFU {100 * float(record['mfu']):.1f}%")
    if record.get("eta_s") is not None:
        parts.append(f"ETA {format_duration(float(record['eta_s']))}")
    if record.get("loss_scale") is not None:
        parts.append(f"loss_scale {_fmt_float(record['loss_scale'], '.6g')}")
    if record.get("skipped_steps") is not None:
        parts.append(f"skipped {int(record['skipped_steps'])}")
    if record.get("nonfinite_steps") is not None:
        parts.append(f"nan {int(record['nonfinite_steps'])}")
    return " | ".join(parts)
