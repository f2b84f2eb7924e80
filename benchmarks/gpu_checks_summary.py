"""The headline numbers of a `gpu_checks.sh` run, one line each, from the JSONs in its $OUT.

Reads `save50.json`, `sweep.json`, `save5.json` and `trace.json` (a part that was skipped, killed
or failed has an empty or partial file: it gets a line saying so) and prints what issue 41's
acceptance asks for: per save run the blocking per save against one step, the non-save step
ratios (median and mean, with saves over without) and the slowest step after a save over the
median step; per sweep cell s/step, MFU and tokens/s; the fastest cell's trainer/plain-JAX ratio;
fp8 vs bf16 tokens/s and the losses of both over the measured steps.

Usage: python benchmarks/gpu_checks_summary.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Optional


def _load(out_dir: str, name: str) -> tuple[Optional[dict], str]:
    """The part's JSON object, or None and why not."""
    path = os.path.join(out_dir, f"{name}.json")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None, "no JSON (the part did not run)"
    try:
        return json.loads(text), ""
    except json.JSONDecodeError:
        return None, f"no complete JSON ({len(text)} bytes; see {name}.err in logs.tgz)"


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x: Optional[float], fmt: str = ".4g") -> str:
    return "n/a" if x is None else format(x, fmt)


def after_save_ratio(step_times: list) -> Optional[float]:
    """The slowest step right after a save over the median non-save step.

    Args:
        step_times: `[step, seconds, was_save]` per step (a save run's
            `checkpoint.step_times_first_save_arm`).

    Returns:
        The ratio, or None without a step after a save.
    """
    after = [
        t for (_, t, save), (_, _, prev) in zip(step_times[1:], step_times) if prev and not save
    ]
    non_save = [t for _, t, save in step_times if not save]
    if not after or not non_save:
        return None
    return max(after) / statistics.median(non_save)


def save_lines(name: str, result: dict) -> list[str]:
    """The headline of a `honeycrisp_1b.py --save_every N` JSON."""
    step = result.get("step_s")
    lines = [f"{name}: {result.get('device')}: step {_num(step)} s, MFU {_pct(result.get('mfu'))}"]
    ckpt = result.get("checkpoint")
    if not ckpt:
        return lines + [f"{name}: no checkpoint section"]
    blocking = (ckpt.get("blocking_per_save_s") or {}).get("max")
    within = "n/a" if blocking is None or not step else f"{blocking / step:.3g} steps"
    lines.append(
        f"{name}: {ckpt.get('saves')} saves every {ckpt.get('save_every')}: blocking per save max "
        f"{_num(blocking)} s ({within}); non-save steps with/without saves: median ratio "
        f"{_num(ckpt.get('non_save_step_ratio'))}, mean ratio "
        f"{_num(ckpt.get('non_save_step_mean_ratio'))}; slowest step after a save / median "
        f"step {_num(after_save_ratio(ckpt.get('step_times_first_save_arm') or []))}"
    )
    write = (ckpt.get("write_gb_per_s") or {}).get("median")
    lines.append(
        f"{name}: saves that waited {ckpt.get('saves_that_waited')}, write {_num(write)} GB/s "
        f"(median), snapshot {(ckpt.get('snapshot') or {}).get('mode')}"
    )
    return lines


def _cell_line(prefix: str, row: dict) -> str:
    cell = f"b{row.get('batch')} {row.get('remat')} c{row.get('chunk')} {row.get('flag_set')}"
    if not row.get("s_per_step"):
        return f"{prefix} {cell}: fits {row.get('fits')}: {str(row.get('error'))[:200]}"
    return (
        f"{prefix} {cell}: {_num(row['s_per_step'])} s/step, MFU {_pct(row.get('mfu'))}, "
        f"{_num(row.get('tokens_per_s'), '.0f')} tokens/s"
    )


def sweep_lines(name: str, result: dict) -> list[str]:
    """The headline of a `gpu_sweep.py` JSON (grid, fastest vs plain JAX, fp8 vs bf16)."""
    lines = [_cell_line(f"{name}:", row) for row in result.get("grid", [])]
    comparison = result.get("fastest_vs_plain_jax")
    if comparison and comparison.get("rounds"):
        lines.append(
            f"{name}: fastest {comparison.get('config')}: trainer/plain JAX "
            f"{_num(comparison.get('ratio_trainer_over_plain'))} (trainer MFU "
            f"{_pct(comparison.get('trainer_mfu'))}, plain JAX "
            f"{_pct(comparison.get('plain_jax_mfu'))})"
        )
    if "fp8_vs_bf16" not in result:
        return lines
    fp8 = result["fp8_vs_bf16"]
    if not fp8:
        return lines + [f"{name}: fp8 vs bf16: not run (no fitting cell)"]
    lines.append(
        f"{name}: fp8/bf16 tokens/s {_num(fp8.get('ratio_fp8_over_bf16_tokens_per_s'))} "
        f"({_num(fp8.get('fp8_tokens_per_s'), '.0f')} vs "
        f"{_num(fp8.get('bf16_tokens_per_s'), '.0f')}); "
        f"measured-step loss mean fp8 {_num(fp8.get('fp8_loss_mean_measured'), '.5f')} vs bf16 "
        f"{_num(fp8.get('bf16_loss_mean_measured'), '.5f')}; fp8 matmuls "
        f"{fp8.get('fp8_matmuls_with_amax')}/{fp8.get('fp8_matmuls')} ran; fp8 peak memory "
        f"{_num((fp8.get('fp8_peak_memory_bytes') or 0) / 1e9, '.2f')} GB"
    )
    for error in fp8.get("fp8_errors", []):
        lines.append(f"{name}: fp8 run failed: {str(error)[:300]}")
    return lines


def summary_lines(out_dir: str) -> list[str]:
    """All headline lines of a `gpu_checks.sh` output directory.

    Args:
        out_dir: The script's $OUT.

    Returns:
        One line per headline number group, parts in the script's order.
    """
    lines = []
    for name, kind in (
        ("save50", "save"),
        ("sweep", "sweep"),
        ("save5", "save"),
        ("trace", "sweep"),
    ):
        result, why = _load(out_dir, name)
        if result is None:
            lines.append(f"{name}: {why}")
        else:
            lines += save_lines(name, result) if kind == "save" else sweep_lines(name, result)
    return lines


def main() -> None:
    """Prints the summary lines of the directory given as the one argument."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} OUT_DIR (the directory gpu_checks.sh wrote)")
    print("\n".join(summary_lines(sys.argv[1])))


if __name__ == "__main__":
    main()
