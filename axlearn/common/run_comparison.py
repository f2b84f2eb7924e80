"""Comparing training runs: what `axlearn compare` computes (rendering is in
`axlearn.common.run_comparison_format`, charts in `axlearn.common.run_plots`).

A run directory is a trainer directory: `run_summary.json` (written at the end of a run, see
`axlearn.common.run_summary`), `metrics.jsonl` (one record per step, see
`axlearn.common.summary_writer.JsonlWriter`) and the `trainer_config` dump. A run that is still
going (no `run_summary.json` yet) is compared on what exists, and says so.

The table has one row per headline number and one column per run; each non-baseline run gets a
diff against the baseline (absolute and %). Each row knows which direction is better. Step-time
rows get a noise verdict from the runs' own per-step times (see `step_time_noise_test`): a
difference inside the step-to-step spread is reported as noise, not as a regression.

Example:

    runs = [load_run("/tmp/main"), load_run("/tmp/branch")]
    comparison = compare_runs(runs, baseline=0)
    for row in comparison.rows:
        print(row.title, [c.text for c in row.cells], [d.verdict for d in row.diffs])
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from typing import Any, Callable, Optional, Sequence

from axlearn.common import run_comparison_metrics, run_summary
from axlearn.common.run_comparison_noise import (  # noqa: F401 (public names)
    MIN_EFFECT,
    NOISE_ALPHA,
    NoiseVerdict,
    step_time_noise_test,
)

# Keys of metrics.jsonl records (the trainer's summary tags).
LOSS_KEY = "loss"
STEP_TIME_KEY = "perf/step_time_s"
LEARNING_RATE_KEY = "learner/optimizer/learning_rate"
GRADIENT_NORM_KEY = "learner/optimizer/gradient_norm"
EXCLUDED_KEY = "excluded_reason"

RUN_SUMMARY = "run_summary.json"
METRICS_JSONL = "metrics.jsonl"
CONFIG_DUMP = "trainer_config"

# Runs whose start-of-run matmul probes (CPU) differ by more than this fraction ran on a machine
# of different speed (other load): their step times are not comparable.
MACHINE_SPEED_TOLERANCE = 0.15
# A timing row (eval, checkpoint, ... seconds) measured fewer times than this in either run is
# within noise whatever its difference: one eval's time says nothing about the code.
MIN_TIMING_SAMPLES = 3


class NotARunError(ValueError):
    """A directory holds none of the files a run writes."""


class NoCommonStepsError(ValueError):
    """The runs share no step with a loss, so their losses cannot be compared."""


def _is_remote(path: str) -> bool:
    return "://" in path


def _exists(path: str) -> bool:
    if _is_remote(path):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return tf.io.gfile.exists(path)
    return os.path.exists(path)


def _read_text(path: str) -> str:
    if _is_remote(path):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        with tf.io.gfile.GFile(path, "r") as f:
            return f.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _join(*parts: str) -> str:
    return (
        "/".join([parts[0].rstrip("/"), *parts[1:]])
        if _is_remote(parts[0])
        else (os.path.join(*parts))
    )


@dataclasses.dataclass
class RunData:
    """What a run directory holds.

    Attributes:
        path: The directory.
        label: The run's name in tables and charts (default: the directory's base name).
        summary: `run_summary.json`, or None if the run has not finished.
        records: `metrics.jsonl` records by step, in step order, every attempt's (a resumed run
            moves the records it supersedes to metrics.redone.jsonl; a step logged twice in a
            file from an older version keeps the later record).
        config_dump: The `trainer_config` dump text, or None.
        notes: What is missing or partial, in words (and where multi-attempt figures come from).
        goodput: The goodput report of every attempt from the run's events
            (`GoodputReport.to_dict()`), or None without events (then run_summary.json's).
    """

    path: str
    label: str
    summary: Optional[dict[str, Any]]
    records: list[dict[str, Any]]
    config_dump: Optional[str]
    notes: list[str]
    goodput: Optional[dict[str, Any]] = None

    @property
    def summary_is_partial(self) -> bool:
        """Whether run_summary.json covers fewer steps than metrics.jsonl (it is written by the
        last attempt, about its own steps): per-step figures then come from the records."""
        steps = (self.summary or {}).get("steps")
        if not self.records or not isinstance(steps, dict):
            return False
        first, last = steps.get("first"), steps.get("last")
        if not isinstance(first, int) or not isinstance(last, int):
            return False
        return first > int(self.records[0]["step"]) or last < int(self.records[-1]["step"])

    def series(self, key: str) -> list[tuple[int, float]]:
        """Returns (step, value) for every record that has a finite number under `key`."""
        out = []
        for r in self.records:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append((int(r["step"]), float(v)))
        return out

    def step_times(self) -> list[float]:
        """Returns the per-step wall times of steps not excluded (compile, eval, checkpoint)."""
        return [
            float(r[STEP_TIME_KEY])
            for r in self.records
            if isinstance(r.get(STEP_TIME_KEY), (int, float)) and not r.get(EXCLUDED_KEY)
        ]

    def metric(self, name: str, *, per_step: bool = False) -> Optional[float]:
        """Returns `run_summary.json`'s metric value, or None.

        Args:
            name: The metric.
            per_step: Whether it is a per-step figure (step time, throughput): None when the
                summary covers only the last attempt, so that the caller uses every record.
        """
        if not self.summary or (per_step and self.summary_is_partial):
            return None
        entry = (self.summary.get("metrics") or {}).get(name)
        return entry.get("value") if isinstance(entry, dict) else None

    @property
    def last_step(self) -> Optional[int]:
        """The last step with a record, or None."""
        return int(self.records[-1]["step"]) if self.records else None


def load_run(path: str, *, label: Optional[str] = None) -> RunData:
    """Reads a run directory (local, or any path `tf.io.gfile` reads, e.g. gs://).

    Args:
        path: The trainer directory.
        label: The run's name (default: the directory's base name).

    Returns:
        The `RunData`.

    Raises:
        NotARunError: If the directory has none of run_summary.json, metrics.jsonl and
            trainer_config (the message names what was looked for).
        ValueError: If run_summary.json exists but is not valid JSON (names the file). Lines of
            metrics.jsonl that are not valid JSON are skipped with a note naming them.
    """
    if not _exists(path):
        raise NotARunError(f"Run directory {path!r} does not exist.")
    files = {name: _join(path, name) for name in (RUN_SUMMARY, METRICS_JSONL, CONFIG_DUMP)}
    present = {name: _exists(p) for name, p in files.items()}
    if not any(present.values()):
        raise NotARunError(
            f"{path!r} is not a run directory: it has no {RUN_SUMMARY}, {METRICS_JSONL} or "
            f"{CONFIG_DUMP} (a trainer directory written by launch_trainer_main has them)."
        )
    notes = []
    summary = None
    if present[RUN_SUMMARY]:
        try:
            summary = json.loads(_read_text(files[RUN_SUMMARY]))
        except json.JSONDecodeError as e:
            raise ValueError(f"{files[RUN_SUMMARY]}: not valid JSON ({e})") from e
    else:
        notes.append(f"no {RUN_SUMMARY} (run unfinished or crashed): using {METRICS_JSONL} only")
    by_step: dict[int, dict[str, Any]] = {}
    if present[METRICS_JSONL]:
        lines = _read_text(files[METRICS_JSONL]).splitlines()
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                if lineno == len(lines):
                    notes.append(f"{METRICS_JSONL}: last line incomplete (run still writing)")
                    continue
                # A line torn by an interrupted write (e.g. a full disk) that a resumed run
                # appended to: that step's record is lost, the others are read.
                notes.append(
                    f"{METRICS_JSONL}:{lineno}: not valid JSON ({e}; a torn line from an "
                    "interrupted write?): skipped"
                )
                continue
            if "step" in record:
                by_step[int(record["step"])] = record
    else:
        notes.append(f"no {METRICS_JSONL}: per-step rows and the noise test are unavailable")
    config_dump = _read_text(files[CONFIG_DUMP]) if present[CONFIG_DUMP] else None
    if config_dump is None:
        notes.append(f"no {CONFIG_DUMP} dump: configs cannot be compared")
    name = label or os.path.basename(path.rstrip("/")) or path
    run = RunData(
        path=path,
        label=name,
        summary=summary,
        records=[by_step[s] for s in sorted(by_step)],
        config_dump=config_dump,
        notes=notes,
        goodput=_events_goodput(path),
    )
    if run.summary_is_partial:
        steps = run.summary["steps"]
        notes.append(
            f"{RUN_SUMMARY} covers steps {steps['first']}-{steps['last']} (the last attempt); "
            f"step time, throughput, MFU and overhead rows are computed from the "
            f"{len(run.records)} records of every attempt in {METRICS_JSONL} (steps "
            f"{run.records[0]['step']}-{run.records[-1]['step']})"
        )
    if run.goodput is not None:
        notes.append(
            f"goodput rows from the events of all {run.goodput.get('num_attempts')} attempt(s) "
            "(events/)"
        )
    return run


def _events_goodput(path: str) -> Optional[dict[str, Any]]:
    """The goodput report of every attempt from a local run's events, or None."""
    if _is_remote(path) or not os.path.isdir(os.path.join(path, "events")):
        return None
    from axlearn.common import goodput  # pylint: disable=import-outside-toplevel

    return goodput.goodput_summary(path)


def machine_speed_verdict(
    base: RunData, run: RunData, *, tolerance: float = MACHINE_SPEED_TOLERANCE
) -> Optional[NoiseVerdict]:
    """Returns a not-significant verdict when the machine's speed explains the step-time change.

    CPU runs measure the machine's matmul throughput at start (the MFU probe, in
    `run_summary.json`'s `peak`). On a shared machine that changes between runs (easily 2x). The
    difference is explained by the machine when the probes differ by more than `tolerance` and
    the run with faster steps was measured on a machine faster by at least the same factor
    (probe ratio >= median step-time ratio): then the machine alone accounts for the whole
    difference. A probe is one snapshot at start-up, so it never explains away more than it
    measured; anything it does not fully account for is left to the noise test.

    Args:
        base: The baseline run.
        run: The other run.
        tolerance: Largest relative probe difference that still counts as the same machine speed.

    Returns:
        The verdict, or None when the probes agree (or either run has none).
    """
    pa, pb = _probe_gflops(base), _probe_gflops(run)
    if not pa or not pb:
        return None
    change = abs(pb - pa) / pa
    if change <= tolerance:
        return None
    ta, tb = base.step_times(), run.step_times()
    if not ta or not tb:
        return None
    ma, mb = statistics.median(ta), statistics.median(tb)
    step_ratio = max(ma, mb) / min(ma, mb)
    # Probe of the run with faster steps / probe of the run with slower steps.
    machine_ratio = pb / pa if mb < ma else pa / pb
    if machine_ratio < step_ratio:
        return None  # The machine does not account for the whole difference.
    return NoiseVerdict(
        False,
        None,
        None,
        None,
        len(base.step_times()),
        len(run.step_times()),
        f"not comparable: the machine's measured matmul speed differed by {100 * change:.0f}% "
        f"({pa:.4g} vs {pb:.4g} GFLOP/s at start; other load on the machine), enough to explain "
        f"the {step_ratio:.2f}x step-time difference",
    )


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One row of the comparison table.

    Attributes:
        key: Machine name (JSON key).
        title: Row title.
        better: "lower", "higher" or None (no direction: e.g. versions).
        get: Extracts the value from a run (None when unknown).
        fmt: Formats a value for display.
        noise: Whether the step-time noise test decides this row's verdict.
        tolerance: Relative differences below this are within noise (e.g. memory jitter).
        timing: A wall-time measurement: not comparable when the machines' speeds differed.
        abs_tolerance: Absolute differences below this are within noise (e.g. 0.5 s of overhead).
        samples: How many measurements a run's value comes from (e.g. the evals of an eval-time
            row); fewer than `MIN_TIMING_SAMPLES` in either run is too few to call a difference.
    """

    key: str
    title: str
    better: Optional[str]
    get: Callable[[RunData], Any]
    fmt: Callable[[Any], str]
    noise: bool = False
    tolerance: float = 0.0
    timing: bool = False
    abs_tolerance: float = 0.0
    samples: Optional[Callable[[RunData], Optional[int]]] = None


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda v: "n/a" if v is None else format(v, fmt)


def _bytes(v: Any) -> str:
    if v is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.0f} B"


def _env(name: str) -> Callable[[RunData], Any]:
    return lambda r: ((r.summary or {}).get("environment") or {}).get(name)


def _overhead_samples(name: str) -> Callable[[RunData], Optional[int]]:
    """How many steps paid the overhead `name` (None without per-step records)."""

    def count(r: RunData) -> Optional[int]:
        if not r.records:
            return None
        return sum(1 for x in r.records if float(x.get(f"perf/overhead/{name}", 0.0) or 0.0) > 0)

    return count


def _overhead(name: str) -> Callable[[RunData], Any]:
    def get(r: RunData) -> Any:
        if r.summary and "overhead_totals_s" in r.summary and not r.summary_is_partial:
            return (r.summary.get("overhead_totals_s") or {}).get(name, 0.0)
        if not r.records:
            return None
        return sum(float(x.get(f"perf/overhead/{name}", 0.0) or 0.0) for x in r.records)

    return get


def _median_step(r: RunData) -> Optional[float]:
    times = r.step_times()
    return statistics.median(times) if times else r.metric("median_step_s", per_step=True)


def _avg_step(r: RunData) -> Optional[float]:
    value = r.metric("avg_step_s", per_step=True)
    if value is None:
        times = r.step_times()
        value = sum(times) / len(times) if times else None
    return value


def _mean_of(key: str, summary_metric: str) -> Callable[[RunData], Any]:
    def get(r: RunData) -> Any:
        value = r.metric(summary_metric, per_step=True)
        if value is None:
            xs = [
                float(x[key])
                for x in r.records
                if isinstance(x.get(key), (int, float)) and not x.get(EXCLUDED_KEY)
            ]
            value = sum(xs) / len(xs) if xs else None
        return value

    return get


def _mfu(r: RunData) -> Any:
    value = _mean_of("perf/mfu", "mfu")(r)
    return None if value is None else 100.0 * value


def _probe_gflops(r: RunData) -> Any:
    """The start-of-run matmul probe (CPU runs: the machine's speed when the run started)."""
    peak = (r.summary or {}).get("peak") or {}
    if peak.get("source") != "measured" or not peak.get("flops_per_s"):
        return None
    return peak["flops_per_s"] / 1e9


def _commit(r: RunData) -> Any:
    git = (r.summary or {}).get("git") or {}
    commit = git.get("commit")
    if commit is None:
        return None
    return commit[:10] + ("-dirty" if git.get("dirty") else "")


def _config_hash(r: RunData) -> Any:
    """`run_summary.config_dump_hash` of the run's dump (its own directory left out), so two
    runs of one config share it; else the summary's hash in the same spelling."""
    if r.config_dump is not None:
        return run_summary.config_dump_hash(r.config_dump)
    digest = (r.summary or {}).get("config_hash")
    return digest[: len("sha256:") + 10] if digest else None


def _goodput(key: str, part: Optional[str] = None) -> Callable[[RunData], Any]:
    """A figure of run_summary.json's `goodput` (see axlearn/common/goodput.py), or None."""

    def get(r: RunData) -> Any:
        report = r.goodput if r.goodput is not None else (r.summary or {}).get("goodput")
        if not isinstance(report, dict):
            return None
        value = (report.get("parts_s") or {}).get(part) if part else report.get(key)
        if key == "goodput" and isinstance(value, (int, float)):
            return 100 * value
        return value

    return get


# The table's rows: the reference comparison's (Parameters, Final loss, TFLOP/s, Tok/s,
# Avg s/step, Memory %, JAX version) and more. "Final loss" is filled per comparison (at the last
# step all runs share), see `compare_runs`.
ROWS: list[RowSpec] = [
    RowSpec("parameters", "Parameters", None, lambda r: r.metric("parameters"), _num(",")),
    RowSpec("final_loss", "Final loss", "lower", lambda r: None, _num(".4f")),
    RowSpec(
        "tflops_per_device",
        "TFLOP/s/device",
        "higher",
        _mean_of("perf/tflops_per_device", "tflops_per_device"),
        _num(".4g"),
        noise=True,
    ),
    RowSpec(
        "tokens_per_s_per_device",
        "Tokens/s/device",
        "higher",
        _mean_of("perf/tokens_per_s_per_device", "tokens_per_s_per_device"),
        _num(",.0f"),
        noise=True,
    ),
    RowSpec("avg_step_s", "Avg s/step", "lower", _avg_step, _num(".4f"), noise=True),
    RowSpec("median_step_s", "Median s/step", "lower", _median_step, _num(".4f"), noise=True),
    RowSpec("mfu_pct", "MFU %", "higher", _mfu, _num(".2f"), noise=True),
    RowSpec("machine_gflops", "Machine probe GFLOP/s", None, _probe_gflops, _num(".4g")),
    RowSpec(
        "memory_pct",
        "Memory %",
        "lower",
        lambda r: r.metric("memory_pct"),
        _num(".3g"),
        tolerance=0.02,
    ),
    RowSpec(
        "peak_memory_bytes",
        "Peak memory",
        "lower",
        lambda r: r.metric("peak_memory_bytes"),
        _bytes,
        tolerance=0.02,
    ),
    *(
        RowSpec(
            f"overhead_{kind}_s",
            title,
            "lower",
            _overhead(kind),
            _num(".3g"),
            tolerance=0.10,
            abs_tolerance=0.5,
            timing=True,
            samples=_overhead_samples(kind),
        )
        for kind, title in (
            ("compile", "Compile s"),
            ("eval", "Eval s"),
            ("checkpoint", "Checkpoint s"),
            ("input", "Input wait s"),
        )
    ),
    RowSpec("goodput_pct", "Goodput %", "higher", _goodput("goodput"), _num(".1f")),
    RowSpec(
        "failed_attempts", "Failed attempts", "lower", _goodput("num_failed_attempts"), _num("d")
    ),
    *(
        RowSpec(f"goodput_{part}_s", title, better, _goodput("parts_s", part), _num(".3g"))
        for part, title, better in (
            # More productive seconds is a longer run as often as a better one: no direction.
            ("productive", "Productive s", None),
            ("redone", "Re-done steps s", "lower"),
            ("startup", "Start-up s", "lower"),
            ("idle", "Idle between attempts s", "lower"),
        )
    ),
    RowSpec("steps", "Steps", None, lambda r: r.last_step, _num("d")),
    RowSpec("jax_version", "JAX version", None, _env("jax_version"), lambda v: str(v or "n/a")),
    RowSpec("device_kind", "Device kind", None, _env("device_kind"), lambda v: str(v or "n/a")),
    RowSpec("device_count", "Devices", None, _env("device_count"), _num("d")),
    RowSpec("git_commit", "Git commit", None, _commit, lambda v: str(v or "n/a")),
    RowSpec("config_hash", "Config hash", None, _config_hash, lambda v: str(v or "n/a")),
]
ROW_KEYS = [row.key for row in ROWS]

# Verdicts of a diff cell.
IMPROVED, REGRESSED, NOISE, SAME, CHANGED, UNKNOWN = (
    "improved",
    "regressed",
    "within noise",
    "same",
    "changed",
    "n/a",
)


@dataclasses.dataclass(frozen=True)
class Diff:
    """A run's difference from the baseline in one row.

    Attributes:
        absolute: run - baseline (None for non-numeric or unknown values).
        percent: 100 * (run - baseline) / |baseline| (None when baseline is 0 or unknown).
        verdict: One of IMPROVED, REGRESSED, NOISE, SAME, CHANGED, UNKNOWN.
        note: Why, for noise-tested rows.
    """

    absolute: Optional[float]
    percent: Optional[float]
    verdict: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Row:
    """One computed row.

    Attributes:
        spec: The row's definition.
        values: One value per run (None when unknown).
        diffs: One per run; the baseline's is None.
    """

    spec: RowSpec
    values: list[Any]
    diffs: list[Optional[Diff]]

    @property
    def texts(self) -> list[str]:
        """The displayed values."""
        return [self.spec.fmt(v) for v in self.values]


@dataclasses.dataclass
class Comparison:
    """The comparison of runs against a baseline.

    Attributes:
        runs: The runs, in column order.
        baseline: Index of the baseline run.
        rows: The table.
        loss_step: The step at which "Final loss" is compared.
        warnings: Flags for the reader: different lengths, different configs, partial runs.
        noise: Per non-baseline run index, the step-time `NoiseVerdict`.
    """

    runs: list[RunData]
    baseline: int
    rows: list[Row]
    loss_step: Optional[int]
    warnings: list[str]
    noise: dict[int, NoiseVerdict]

    def row(self, key: str) -> Row:
        """Returns the row with this key."""
        for row in self.rows:
            if row.spec.key == key:
                return row
        raise KeyError(f"No row {key!r}; rows: {ROW_KEYS}")

    @property
    def regressions(self) -> list[tuple[str, str]]:
        """(run label, row title) of every regressed cell."""
        out = []
        for row in self.rows:
            for i, d in enumerate(row.diffs):
                if d is not None and d.verdict == REGRESSED:
                    out.append((self.runs[i].label, row.spec.title))
        return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _diff(
    spec: RowSpec,
    base: Any,
    value: Any,
    noise: Optional[NoiseVerdict],
    machine: Optional[NoiseVerdict] = None,
) -> Diff:
    if value is None or base is None:
        return Diff(None, None, UNKNOWN)
    if not (_is_number(base) and _is_number(value)):
        return Diff(None, None, SAME if base == value else CHANGED)
    absolute = float(value) - float(base)
    percent = 100.0 * absolute / abs(base) if base else None
    if absolute == 0:
        return Diff(absolute, percent, SAME)
    if spec.better is None:
        return Diff(absolute, percent, CHANGED)
    better = absolute < 0 if spec.better == "lower" else absolute > 0
    if spec.noise and noise is not None and not noise.significant:
        return Diff(absolute, percent, NOISE, noise.reason)
    if spec.timing and machine is not None:
        return Diff(absolute, percent, NOISE, machine.reason)
    if percent is not None and abs(percent) < 100 * spec.tolerance:
        return Diff(absolute, percent, NOISE, f"within {100 * spec.tolerance:g}%")
    if abs(absolute) < spec.abs_tolerance:
        return Diff(absolute, percent, NOISE, f"within {spec.abs_tolerance:g}")
    note = noise.reason if (spec.noise and noise is not None) else ""
    return Diff(absolute, percent, IMPROVED if better else REGRESSED, note)


def _too_few_samples(spec: RowSpec, base: RunData, run: RunData, diff: Diff) -> Diff:
    """A timing measured fewer than `MIN_TIMING_SAMPLES` times is not called better or worse."""
    if spec.samples is None or diff.verdict not in (IMPROVED, REGRESSED):
        return diff
    counts = [spec.samples(base), spec.samples(run)]
    if any(c is None for c in counts) or min(counts) >= MIN_TIMING_SAMPLES:
        return diff
    return dataclasses.replace(
        diff,
        verdict=NOISE,
        note=f"{min(counts)} sample(s): too few to tell (needs {MIN_TIMING_SAMPLES} per run)",
    )


def _loss_step(runs: Sequence[RunData]) -> Optional[int]:
    steps = [set(s for s, _ in r.series(LOSS_KEY)) for r in runs]
    if not any(steps):
        return None
    common = set.intersection(*steps) if all(steps) else set()
    if not common:
        raise NoCommonStepsError(
            "The runs have no step in common with a logged loss (steps: "
            + "; ".join(
                f"{r.label}: {min(s)}-{max(s)}" if s else f"{r.label}: none"
                for r, s in zip(runs, steps)
            )
            + "), so their losses cannot be compared."
        )
    return max(common)


def normalized_config_dump(run: RunData) -> Optional[str]:
    """Returns the run's config dump with its own trainer directory replaced by `<trainer_dir>`.

    Two runs of one config differ only in where they write; that is not a config difference.

    Args:
        run: The run.

    Returns:
        The dump text, or None when the run has none.
    """
    if run.config_dump is None:
        return None
    return run_summary.normalize_config_dump(run.config_dump) + "\n"


# Rows of summed overhead seconds (compile, eval, checkpoint, input wait).
OVERHEAD_ROW_PREFIX = "overhead_"
# Overheads paid once per run whatever its length: compared as totals.
ONCE_PER_RUN = ("overhead_compile_s",)


def _per_step(spec: RowSpec, values: list, lengths: list[int]) -> tuple[RowSpec, list]:
    """A total-seconds row as seconds per step (for runs of different lengths)."""
    values = [v / n if _is_number(v) else v for v, n in zip(values, lengths)]
    spec = dataclasses.replace(
        spec, title=f"{spec.title} per step", abs_tolerance=spec.abs_tolerance / min(lengths)
    )
    return spec, values


def compare_runs(runs: Sequence[RunData], *, baseline: int = 0) -> Comparison:
    """Builds the comparison table of `runs` against `runs[baseline]`.

    Args:
        runs: Two or more runs.
        baseline: Index of the baseline run.

    Returns:
        The `Comparison`.

    Raises:
        ValueError: Fewer than two runs, or a bad baseline index.
        NoCommonStepsError: The runs logged losses at no common step.
    """
    runs = list(runs)
    if len(runs) < 2:
        raise ValueError(f"Comparing needs at least two runs, got {len(runs)}.")
    if not 0 <= baseline < len(runs):
        raise ValueError(f"Baseline index {baseline} is not one of the {len(runs)} runs.")
    warnings = [f"{r.label}: {note}" for r in runs for note in r.notes]
    loss_step = _loss_step(runs)
    base = runs[baseline]
    machine = {i: machine_speed_verdict(base, r) for i, r in enumerate(runs) if i != baseline}
    noise = {
        i: machine[i] or step_time_noise_test(base.step_times(), r.step_times())
        for i, r in enumerate(runs)
        if i != baseline
    }
    rows = []
    lengths = [r.last_step for r in runs]
    per_step = len(set(lengths)) > 1 and all(n for n in lengths)
    for spec in run_comparison_metrics.row_specs(ROWS, runs, loss_step, row_cls=RowSpec):
        if spec.key == "final_loss":
            values = [dict(r.series(LOSS_KEY)).get(loss_step) for r in runs]
        else:
            values = [spec.get(r) for r in runs]
        if per_step and spec.key.startswith(OVERHEAD_ROW_PREFIX) and spec.key not in ONCE_PER_RUN:
            # Totals of runs of different lengths are not comparable: their per-step rates are.
            spec, values = _per_step(spec, values, lengths)
        diffs = [
            None
            if i == baseline
            else _too_few_samples(
                spec, base, runs[i], _diff(spec, values[baseline], v, noise.get(i), machine.get(i))
            )
            for i, v in enumerate(values)
        ]
        rows.append(Row(spec=spec, values=values, diffs=diffs))
    last_steps = {r.label: r.last_step for r in runs}
    if len(set(last_steps.values())) > 1:
        warnings.append(
            "runs have different lengths ("
            + ", ".join(f"{k}: {v}" for k, v in last_steps.items())
            + f"); final loss is compared at step {loss_step}, the last step all runs logged"
            + (
                "; overhead rows but compile are seconds per step (their totals are not comparable)"
                if per_step
                else ""
            )
        )
    dumps = {r.label: normalized_config_dump(r) for r in runs if r.config_dump is not None}
    base_dump = normalized_config_dump(base)
    differing = [k for k, d in dumps.items() if base_dump is not None and d != base_dump]
    if differing:
        warnings.append(
            "configs differ from the baseline's for: "
            + ", ".join(differing)
            + " (see `axlearn config diff "
            + f"{_join(base.path, CONFIG_DUMP)} "
            + " ".join(_join(r.path, CONFIG_DUMP) for r in runs if r.label in differing[:1])
            + "`)"
        )
    return Comparison(
        runs=runs,
        baseline=baseline,
        rows=rows,
        loss_step=loss_step,
        warnings=warnings,
        noise=noise,
    )
