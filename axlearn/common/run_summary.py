"""The end-of-run summary: one block in the log and `run_summary.json` in the trainer directory.

Built from the per-step records (see `axlearn.common.step_log`) plus what the trainer knows about
the run. `run_summary.json` is self-describing so two runs can be compared without this code:
`metrics` maps each headline number to `{"value", "unit", "better", "definition"}` ("better" is
"higher", "lower" or null), and `environment`/`steps` say what produced it.

Averages (s/step and the throughput derived from it) leave out steps whose interval contains
compile, eval, checkpoint or profiler time (the record's `excluded_reason`): those steps measure
something other than training speed. Which steps were left out, and why, is listed. The
all-inclusive wall-clock time per step is reported next to it.

Example:

    records = [
        dict(step=1, loss=3.0, step_time_s=5.0, overheads={"compile": 4.8},
             excluded_reason="compile"),
        dict(step=2, loss=2.5, step_time_s=0.2, overheads={}, excluded_reason=None),
        dict(step=3, loss=2.0, step_time_s=0.3, overheads={}, excluded_reason=None),
    ]
    summary = build_run_summary(records, num_params=1000, num_devices=1, tokens_per_step=512)
    print(format_run_summary(summary))   # average s/step 0.25 over steps 2-3
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
from collections import defaultdict
from typing import Any, Optional, Sequence

from axlearn.common.path_containment import write_text_no_follow

SCHEMA = "axlearn.run_summary/1"
FILENAME = "run_summary.json"


def normalize_config_dump(text: str) -> str:
    """Returns a config dump with the trainer's own directory replaced by `<trainer_dir>`.

    Two runs of one config differ only in where they write; that is not a config difference.

    Args:
        text: A config dump (`debug_string()`, or a trainer dir's `trainer_config` file).

    Returns:
        The dump, its own directory (the `dir: ...` line's value, wherever it appears) replaced
        and trailing newlines removed.
    """
    for line in text.splitlines():
        if line.startswith("dir: "):  # The trainer's own directory (SpmdTrainer.Config.dir).
            own = line[len("dir: ") :]
            if own not in ("None", "'<trainer_dir>'"):
                text = text.replace(own, "'<trainer_dir>'").replace(
                    own[:-1] + "/", "'<trainer_dir>/"
                )
            break
    return text.rstrip("\n")


def config_dump_hash(text: str) -> str:
    """Returns the config hash of a dump: 'sha256:' and 10 hex digits of its normalized text.

    The one spelling of a config hash: run summaries, the summary table and `axlearn compare`
    all show it, and two runs of one config in different directories share it.

    Args:
        text: A config dump.

    Returns:
        The hash text.
    """
    digest = hashlib.sha256(normalize_config_dump(text).encode("utf-8")).hexdigest()
    return "sha256:" + digest[:10]


def config_hash(config: Any) -> str:
    """Returns `config_dump_hash` of a config's dump (`debug_string()`), or of `str(config)`.

    Args:
        config: A config (or any object).

    Returns:
        The hash text.
    """
    return config_dump_hash(
        config.debug_string() if hasattr(config, "debug_string") else str(config)
    )


# Set in launch images (Dockerfile, from the bundler's GIT_COMMIT build argument).
GIT_COMMIT_ENV = "AXLEARN_GIT_COMMIT"


def git_commit(path: Optional[str] = None) -> dict[str, Any]:
    """Returns {"commit": sha or None, "dirty": bool or None} of the git checkout holding `path`.

    Args:
        path: A file or directory in the checkout (default: this package's directory).

    Returns:
        The commit and whether tracked files have uncommitted changes (None when not a checkout
        or git is unavailable). Outside a checkout (a container image built by a launch bundler,
        which has no .git), the commit is the `AXLEARN_GIT_COMMIT` environment variable the
        image sets from its GIT_COMMIT build argument, if any.
    """
    path = path or os.path.dirname(os.path.abspath(__file__))
    if os.path.isfile(path):
        path = os.path.dirname(path)

    def git(*args: str) -> Optional[str]:
        try:
            out = subprocess.run(
                ["git", "-C", path, *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return dict(commit=os.environ.get(GIT_COMMIT_ENV) or None, dirty=None)
    status = git("status", "--porcelain", "--untracked-files=no")
    return dict(commit=commit, dirty=bool(status) if status is not None else None)


def environment_info(devices: Optional[Sequence[Any]] = None) -> dict[str, Any]:
    """Returns JAX/jaxlib/Python versions, device kind/platform/count and process count.

    Args:
        devices: The devices the run used (default: `jax.devices()`).

    Returns:
        The info dict.
    """
    import jax  # pylint: disable=import-outside-toplevel
    import jaxlib  # pylint: disable=import-outside-toplevel

    devices = list(devices if devices is not None else jax.devices())
    return dict(
        jax_version=jax.__version__,
        jaxlib_version=getattr(jaxlib, "__version__", None),
        python_version=platform.python_version(),
        platform=devices[0].platform if devices else None,
        device_kind=devices[0].device_kind if devices else None,
        device_count=len(devices),
        process_count=jax.process_count(),
    )


def _ranges(steps: Sequence[int]) -> str:
    """Formats sorted steps compactly: [1, 2, 3, 7] -> '1-3, 7'."""
    steps = sorted(steps)
    out, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out)


def _metric(value: Any, unit: str, better: Optional[str], definition: str) -> dict[str, Any]:
    return dict(value=value, unit=unit, better=better, definition=definition)


def _real_tokens(record: dict[str, Any], num_devices: int) -> Optional[float]:
    """The record's real tokens, or its real-token rate x wall time x devices."""
    if record.get("real_tokens") is not None:
        return float(record["real_tokens"])
    rate = record.get("real_tokens_per_s_per_device")
    if rate is None:
        return None
    return float(rate) * float(record["step_time_s"]) * num_devices


def _finite_or_none(x: Optional[float]) -> Optional[float]:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def build_run_summary(
    records: Sequence[dict[str, Any]],
    *,
    num_params: int,
    num_devices: int,
    tokens_per_step: int,
    flops_per_step: Optional[float] = None,
    flops: Optional[dict[str, Any]] = None,
    peak: Optional[dict[str, Any]] = None,
    memory: Optional[Sequence[dict[str, Any]]] = None,
    compiled_memory: Optional[dict[str, Any]] = None,
    environment: Optional[dict[str, Any]] = None,
    git: Optional[dict[str, Any]] = None,
    config_digest: Optional[str] = None,
    end_of_run_wait_s: Optional[float] = None,
    extra: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Builds the run summary from the step records.

    Args:
        records: The step records of this run (keys as in `axlearn.common.step_log`).
        num_params: Model parameters.
        num_devices: Devices the run used.
        tokens_per_step: Padded tokens per step (global batch x sequence length).
        flops_per_step: Model FLOPs per step (see `axlearn.common.flops`), if known.
        flops: `StepFlops.to_dict()`, stored as is.
        peak: `DevicePeak.to_dict()` (its `flops_per_s` is the MFU denominator).
        memory: `LiveMemory.to_dict()` per device.
        compiled_memory: `CompiledMemory.to_dict()`.
        environment: `environment_info()` (default: computed now).
        git: `git_commit()` (default: computed now).
        config_digest: `config_hash(trainer_config)`.
        end_of_run_wait_s: Seconds the end of the run waited for the last save's write.
        extra: Additional top-level entries (e.g. trainer_dir, name).

    Returns:
        The JSON-ready summary dict.
    """
    records = list(records)
    included = [r for r in records if not r.get("excluded_reason")]
    excluded: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if r.get("excluded_reason"):
            excluded[r["excluded_reason"]].append(int(r["step"]))
    walls = [float(r["step_time_s"]) for r in included]
    avg = sum(walls) / len(walls) if walls else None
    median = statistics.median(walls) if walls else None
    total_wall = sum(float(r["step_time_s"]) for r in records)
    avg_all = total_wall / len(records) if records else None

    tflops = tokens_rate = real_rate = mfu = None
    if avg:
        tokens_rate = tokens_per_step / avg / num_devices
        if flops_per_step is not None:
            tflops = flops_per_step / avg / num_devices / 1e12
            peak_flops = (peak or {}).get("flops_per_s")
            if peak_flops:
                mfu = flops_per_step / avg / num_devices / peak_flops
        real = [_real_tokens(r, num_devices) for r in included]
        real = [x for x in real if x is not None]
        if real and len(real) == len(included):
            real_rate = sum(real) / len(real) / avg / num_devices

    overhead_totals: dict[str, float] = defaultdict(float)
    for r in records:
        for kind, seconds in (r.get("overheads") or {}).items():
            overhead_totals[kind] += float(seconds)

    peak_fractions = [m.get("peak_fraction") for m in memory or [] if m.get("peak_fraction")]
    memory_pct = 100.0 * max(peak_fractions) if peak_fractions else None
    peak_bytes = max((m.get("peak_bytes_in_use") or 0 for m in memory or []), default=None) or None
    final = records[-1] if records else {}
    excluded_text = "; ".join(f"{k}: {_ranges(v)}" for k, v in excluded.items()) or "none"

    metrics = dict(
        parameters=_metric(int(num_params), "count", None, "Model parameters (all leaves)."),
        final_loss=_metric(
            _finite_or_none(final.get("loss")),
            "loss",
            "lower",
            f"Training loss of the last step (step {final.get('step')}).",
        ),
        tflops_per_device=_metric(
            tflops,
            "TFLOP/s",
            "higher",
            "Model FLOPs per step / average s/step / devices / 1e12 (FLOPs: docs/metrics.md).",
        ),
        tokens_per_s_per_device=_metric(
            tokens_rate,
            "tokens/s",
            "higher",
            "Padded tokens per step (global batch x sequence length) / average s/step / devices.",
        ),
        real_tokens_per_s_per_device=_metric(
            real_rate,
            "tokens/s",
            "higher",
            "Mean non-padding target tokens per averaged step / average s/step / devices.",
        ),
        avg_step_s=_metric(
            avg,
            "s",
            "lower",
            "Mean wall time between consecutive host syncs on the loss, over the steps not "
            f"excluded (excluded: {excluded_text}; they contain compile, eval, checkpoint or "
            "profiler time).",
        ),
        median_step_s=_metric(median, "s", "lower", "Median over the same steps as avg_step_s."),
        wall_s_per_step_all=_metric(
            avg_all,
            "s",
            "lower",
            "Total wall time of all steps (every overhead included) / number of steps.",
        ),
        mfu=_metric(
            mfu,
            "fraction",
            "higher",
            "tflops_per_device x 1e12 / peak FLOP/s per device (peak: see `peak`).",
        ),
        memory_pct=_metric(
            memory_pct,
            "%",
            "lower",
            "Highest peak memory / capacity over devices (host RSS / host memory on CPU).",
        ),
        peak_memory_bytes=_metric(
            peak_bytes, "bytes", "lower", "Highest peak memory in use over devices."
        ),
    )
    return dict(
        schema=SCHEMA,
        metrics=metrics,
        steps=dict(
            first=int(records[0]["step"]) if records else None,
            last=int(final["step"]) if records else None,
            count=len(records),
            averaged=len(included),
            excluded={k: v for k, v in excluded.items()},
            total_wall_s=total_wall,
            tokens_per_step=int(tokens_per_step),
            num_devices=int(num_devices),
        ),
        overhead_totals_s=dict(overhead_totals),
        checkpoint=checkpoint_summary(records, end_of_run_wait_s=end_of_run_wait_s),
        flops=flops,
        peak=peak,
        memory=list(memory) if memory is not None else None,
        compiled_memory=compiled_memory,
        environment=environment if environment is not None else environment_info(),
        git=git if git is not None else git_commit(),
        config_hash=config_digest,
        **(extra or {}),
    )


def checkpoint_summary(
    records: Sequence[dict[str, Any]], *, end_of_run_wait_s: Optional[float] = None
) -> dict[str, Any]:
    """What the run's saves cost the training loop, in parts (from the records' `checkpoint`).

    Args:
        records: The step records.
        end_of_run_wait_s: Seconds the end of the run waited for the last save's write.

    Returns:
        {saves, blocking_s (total), snapshot_s, wait_for_previous_s, other_s (totals;
        input_position_s: the part of other_s spent reading the input iterator's position),
        median_blocking_s, max_blocking_s, saves_that_waited, snapshot (modes seen),
        end_of_run_wait_s}.
    """
    splits = [r["checkpoint"] for r in records if r.get("checkpoint")]
    blocking = [float(s.get("blocking_s", 0.0)) for s in splits]
    return dict(
        saves=len(splits),
        blocking_s=sum(blocking),
        snapshot_s=sum(float(s.get("snapshot_s", 0.0)) for s in splits),
        wait_for_previous_s=sum(float(s.get("wait_for_previous_s", 0.0)) for s in splits),
        other_s=sum(float(s.get("other_s", 0.0)) for s in splits),
        input_position_s=sum(float(s.get("input_position_s", 0.0)) for s in splits),
        median_blocking_s=statistics.median(blocking) if blocking else None,
        max_blocking_s=max(blocking) if blocking else None,
        saves_that_waited=sum(1 for s in splits if s.get("waited")),
        snapshot=sorted({str(s.get("snapshot")) for s in splits if s.get("snapshot")}),
        end_of_run_wait_s=end_of_run_wait_s,
    )


def format_checkpoint_summary(checkpoint: dict[str, Any]) -> str:
    """Renders `checkpoint_summary` as the run summary's "Checkpoints" row.

    Args:
        checkpoint: From `checkpoint_summary`.

    Returns:
        The text, e.g. '3 saves blocked 0.012 s: snapshot 0.003 s, waiting for the previous
        save 0.000 s, rest 0.009 s; per save median 0.004 s, max 0.005 s; 0 waited; ...'.
    """
    if not checkpoint or not checkpoint.get("saves"):
        text = "no saves"
    else:
        text = (
            f"{checkpoint['saves']} saves blocked {checkpoint['blocking_s']:.3f} s: snapshot "
            f"{checkpoint['snapshot_s']:.3f} s, waiting for the previous save "
            f"{checkpoint['wait_for_previous_s']:.3f} s, rest {checkpoint['other_s']:.3f} s "
            f"(input position {checkpoint.get('input_position_s', 0.0):.3f} s); "
            f"per save median {checkpoint['median_blocking_s']:.3f} s, max "
            f"{checkpoint['max_blocking_s']:.3f} s; {checkpoint['saves_that_waited']} waited for "
            "the previous save"
        )
        if checkpoint.get("snapshot"):
            text += f"; snapshot {', '.join(checkpoint['snapshot'])}"
    if checkpoint and checkpoint.get("end_of_run_wait_s") is not None:
        text += f"; end-of-run wait {checkpoint['end_of_run_wait_s']:.3f} s"
    return text


def _fmt(value: Optional[float], fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else format(value, fmt) + suffix


def format_run_summary(summary: dict[str, Any]) -> str:
    """Renders the summary as the block printed at the end of training.

    Args:
        summary: From `build_run_summary`.

    Returns:
        The multi-line text.
    """
    m = {k: v["value"] for k, v in summary["metrics"].items()}
    steps = summary["steps"]
    env = summary.get("environment") or {}
    git = summary.get("git") or {}
    peak = summary.get("peak") or {}
    excluded = steps.get("excluded") or {}
    excl = "; ".join(f"{k} [{_ranges(v)}]" for k, v in excluded.items())
    rows = [
        ("Parameters", f"{m['parameters']:,}"),
        ("Final loss", f"{_fmt(m['final_loss'], '.4f')} (step {steps['last']})"),
        (
            "Average s/step",
            f"{_fmt(m['avg_step_s'], '.4f')} over {steps['averaged']} of {steps['count']} steps"
            + (f"; not averaged: {excl}" if excl else "")
            + f"; median {_fmt(m['median_step_s'], '.4f')}",
        ),
        ("Wall s/step (all)", f"{_fmt(m['wall_s_per_step_all'], '.4f')} incl. every overhead"),
        ("TFLOP/s/device", _fmt(m["tflops_per_device"], ".4g")),
        (
            "Tokens/s/device",
            f"{_fmt(m['tokens_per_s_per_device'], ',.0f')} padded, "
            f"{_fmt(m['real_tokens_per_s_per_device'], ',.0f')} real",
        ),
        (
            "MFU",
            _fmt(None if m["mfu"] is None else 100 * m["mfu"], ".2f", "%")
            + (
                f" of {peak['flops_per_s'] / 1e12:.4g} TFLOP/s ({peak.get('source')})"
                if peak.get("flops_per_s")
                else ""
            ),
        ),
        (
            "Memory",
            _fmt(m["memory_pct"], ".1f", "%")
            + (
                f" (peak {m['peak_memory_bytes'] / 1e9:.2f} GB)"
                if m.get("peak_memory_bytes")
                else ""
            ),
        ),
        (
            "Overheads (total s)",
            ", ".join(f"{k} {v:.2f}" for k, v in summary.get("overhead_totals_s", {}).items())
            or "none",
        ),
        ("Checkpoints", format_checkpoint_summary(summary.get("checkpoint") or {})),
        *([("Goodput", _format_goodput(summary["goodput"]))] if summary.get("goodput") else []),
        (
            "JAX",
            f"{env.get('jax_version')} on {env.get('device_count')} x "
            f"{env.get('device_kind')!r} ({env.get('platform')}), "
            f"{env.get('process_count')} process(es)",
        ),
        (
            "Git commit",
            f"{git.get('commit')}" + (" (uncommitted changes)" if git.get("dirty") else ""),
        ),
        ("Config hash", str(summary.get("config_hash"))),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["=" * 24 + " Run summary " + "=" * 24]
    lines += [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("=" * 61)
    return "\n".join(lines)


def _format_goodput(report: dict[str, Any]) -> str:
    """One line of `goodput.GoodputReport.to_dict()` for the summary block."""
    value = report.get("goodput")
    parts = report.get("parts_s") or {}
    return (
        _fmt(None if value is None else 100 * value, ".1f", "%")
        + f" of {report.get('wall_s', 0.0):.1f} s wall over {report.get('num_attempts')} "
        f"attempt(s), {report.get('num_failed_attempts')} failed"
        + (
            f", {report['num_preempted_attempts']} preempted"
            if report.get("num_preempted_attempts")
            else ""
        )
        + " (re-done steps "
        f"{parts.get('redone', 0.0):.1f} s, start-up {parts.get('startup', 0.0):.1f} s; "
        "`axlearn goodput` splits it)"
    )


def write_run_summary(directory: str, summary: dict[str, Any]) -> str:
    """Writes `summary` to `<directory>/run_summary.json` (strict JSON; NaN/inf -> null).

    Args:
        directory: The trainer directory.
        summary: From `build_run_summary`.

    Returns:
        The file path.
    """

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    path = os.path.join(directory, FILENAME)
    text = json.dumps(clean(summary), indent=2, sort_keys=False, allow_nan=False) + "\n"
    if "://" in directory:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
    else:
        os.makedirs(directory, exist_ok=True)
        write_text_no_follow(path, text)  # A link planted under its name is replaced, not followed.
    return path
