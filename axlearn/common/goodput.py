"""Goodput: how much of a run's wall time, over all its attempts, trained the model.

Reads the event files the local recorder (`axlearn.common.measurement_local`) wrote under
`<trainer_dir>/events/` and, when the run was started by `axlearn local launch`, the launcher's
`launcher.jsonl` there (each attempt's start, end and cause), through
`axlearn.common.goodput_events` (every line validated; a skipped line is reported by file, line
and reason, never by its content). The wall time, from the first attempt's start to the last
attempt's end, is split into parts that add up to it:

- productive: step time of steps whose results reached the final state;
- redone: step time of steps computed after the last committed checkpoint before a failure (the
  next attempt restored an earlier step and computed them again), including the failed attempt's
  time after its last step started (until it was killed or exited; a checkpoint or eval span
  that the failure interrupted counts here too);
- startup: from an attempt's start (the launcher starting the process, or the process start) to
  its first step: imports, accelerator set-up, restore or init, input pipeline, compile;
- checkpoint: checkpoint blocking inside steps (custom badput `checkpoint`);
- eval: evaluation inside steps (custom badput `eval`);
- input: waiting for the input batch (the `input_s` of each START_STEP event);
- other_badput: other custom badput types;
- idle: from the launcher seeing an attempt fail (or the attempt's end) to the next one's start:
  stopping the other processes, restarting.

Productive step time may be split further: a trainer whose steps have phases (GRPO's rollout
and reference log-probs, `axlearn.common.grpo`) records each phase as a custom span of type
`rollout` or `reference`; such spans are productive time, not badput, and `productive_parts`
splits the productive part into `rollout`, `reference` and `training` (the rest of the step).
Those sub-parts are >= 0 and sum to the productive part; they are reported only by runs that
recorded phases.

One computation serves `axlearn goodput` and the goodput line of `run_summary.json` (written by
the run itself, before its END_JOB), so the two agree: an attempt ends at its process's last
recorded event (END_JOB when it finished, or was preempted and saved), unless it failed, when it
ends where the launcher saw the failure (the lost time until then is re-done work). A
launcher's end more than `LAUNCHER_TAIL_S` after an attempt's last event is reported and not
counted (the process's own record is the attempt's end). A step's time is the interval from its
START_STEP to the next START_STEP (the last one: to the attempt's end), less the badput and
input wait inside it. The figures follow the first process's (lowest index) timeline: all
processes of a step run together. Goodput = productive / wall.

The timeline is validated: an event earlier than the one before it (the clock stepped back, or
lines out of order), a START_STEP not after its attempt's previous one, an attempt that starts
before the previous one ended, are reported by file and line and excluded (an attempt's start
is moved to the previous end). Every part is then >= 0 and the parts sum to the wall time by
construction; `check_invariants` asserts it (and 0 <= goodput <= 1) for every report.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from absl import logging

from axlearn.common.goodput_events import (
    NoEventsError,
    RunEvents,
    read_run_events,
    shown_text,
)
from axlearn.common.measurement_base import Event

__all__ = [
    "PARTS",
    "NoEventsError",
    "RunEvents",
    "read_run_events",
    "Attempt",
    "GoodputReport",
    "GoodputInvariantError",
    "compute_goodput",
    "check_invariants",
    "goodput_summary",
    "format_goodput",
]

# The parts of the wall time, in report order, with their table labels.
PARTS = {
    "productive": "productive steps",
    "redone": "re-done steps",
    "startup": "start-up",
    "checkpoint": "checkpoint blocking",
    "eval": "evaluation",
    "input": "input wait",
    "other_badput": "other badput",
    "idle": "idle between attempts",
}
# Custom span types that are phases of productive steps, not badput (see the module docstring).
PRODUCTIVE_PHASES = ("rollout", "reference")
# The sub-parts of the productive part, with their table labels.
PRODUCTIVE_PARTS = {
    "rollout": "rollout",
    "reference": "reference log-probs",
    "training": "training",
}
# Seconds a launcher's end may follow an attempt's last event without a warning (the process
# exiting after END_JOB).
LAUNCHER_TAIL_S = 10.0
# The outcomes of an attempt (`Attempt.status`).
STATUSES = ("ok", "preempted", "failed", "unknown")


class GoodputInvariantError(AssertionError):
    """A report breaks an invariant (a part < 0, parts not summing to the wall, goodput > 1)."""


@dataclasses.dataclass
class Attempt:
    """One attempt of a run (all processes started together once).

    Attributes:
        number: 1, 2, ...
        start: Epoch seconds when it started.
        end: Epoch seconds when it ended (see the module docstring).
        status: "ok" (ended normally), "preempted" (stopped by SIGTERM after saving),
            "failed" or "unknown" (no end recorded: still running, or killed with no record).
        cause: Why it ended, for a failed attempt (the launcher's words, or what the events
            show).
        first_step: The first step it started (None: none).
        last_step: The last step it started.
        restored_step: The step it restored (from its first step), None if it trained none.
        committed_step: For a failed or preempted attempt, the step the next attempt resumed
            from.
        redone_steps: How many of its steps were lost and computed again.
        parts: Its share of each part, in seconds.
        stopped: Epoch seconds when its processes were all stopped (after `end`, when the
            launcher recorded when it saw the failure: the time between counts as idle).
    """

    number: int
    start: float
    end: float
    status: str
    cause: Optional[str] = None
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    restored_step: Optional[int] = None
    committed_step: Optional[int] = None
    redone_steps: int = 0
    parts: dict[str, float] = dataclasses.field(default_factory=dict)
    stopped: Optional[float] = None
    _segment: Optional[list[dict]] = dataclasses.field(default=None, repr=False)
    # Its productive time by phase (PRODUCTIVE_PARTS); empty if it recorded no phase span.
    _phases: dict[str, float] = dataclasses.field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The attempt as JSON-ready values."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if not f.name.startswith("_")
        }
        out["parts"] = dict(self.parts)
        out["duration_s"] = self.end - self.start
        return out


@dataclasses.dataclass
class GoodputReport:
    """A run's wall time split into parts.

    Attributes:
        trainer_dir: The run.
        wall_s: From the first attempt's start to the last attempt's end.
        parts: Seconds by part (see `PARTS`); they add up to `wall_s`.
        attempts: The attempts, in order.
        num_processes: How many processes recorded events.
        warnings: What was skipped or excluded, `<file>:<line>: <reason>` each.
        productive_parts: The productive part split by phase (PRODUCTIVE_PARTS; they add up
            to `parts["productive"]`), or empty when the run recorded no phase spans.
    """

    trainer_dir: str
    wall_s: float
    parts: dict[str, float]
    attempts: list[Attempt]
    num_processes: int
    warnings: list[str]
    productive_parts: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def goodput(self) -> Optional[float]:
        """productive / wall (None for a zero wall time)."""
        return self.parts["productive"] / self.wall_s if self.wall_s > 0 else None

    @property
    def failed_attempts(self) -> list[Attempt]:
        """The attempts that failed."""
        return [a for a in self.attempts if a.status == "failed"]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (`axlearn goodput --json`, run_summary.json)."""
        extra = {}
        if self.productive_parts:
            extra["productive_parts_s"] = dict(self.productive_parts)
        return dict(
            trainer_dir=self.trainer_dir,
            goodput=self.goodput,
            wall_s=self.wall_s,
            parts_s=dict(self.parts),
            parts_sum_s=sum(self.parts.values()),
            num_attempts=len(self.attempts),
            num_failed_attempts=len(self.failed_attempts),
            num_preempted_attempts=sum(1 for a in self.attempts if a.status == "preempted"),
            num_processes=self.num_processes,
            attempts=[a.to_dict() for a in self.attempts],
            warnings=list(self.warnings),
            **extra,
        )


def _segments(events: list[dict]) -> list[list[dict]]:
    """Splits a process's events into attempts at each START_JOB."""
    segments: list[list[dict]] = []
    for event in events:
        if event["event"] == Event.START_JOB.value or not segments:
            segments.append([])
        segments[-1].append(event)
    return segments


def _segment_start(segment: list[dict]) -> float:
    """When a segment's process started: `process_start` if it is not after START_JOB."""
    first = segment[0]
    t = float(first["time"])
    start = first.get("process_start") if first["event"] == Event.START_JOB.value else None
    return float(start) if start is not None and start <= t else t


def _segment_outcome(segment: Optional[list[dict]]) -> Optional[str]:
    """"ok" or "preempted" from the segment's END_JOB, None without one."""
    for event in segment or []:
        if event["event"] == Event.END_JOB.value:
            return "preempted" if event.get("outcome") == "preempted" else "ok"
    return None


class _Timeline:
    """Builds the attempts with times that only go forward, reporting what it moves or drops."""

    def __init__(self, run: RunEvents):
        self.run = run
        self.warnings: list[str] = []
        name = next(iter(run.processes))
        self.process_file = run.files.get(name, name)
        self.launcher_file = run.files.get("launcher", "launcher.jsonl")
        self.segments = _segments(run.processes[name])

    def warn(self, file: str, line: Optional[int], reason: str) -> None:
        self.warnings.append(f"{file}:{line}: {reason}" if line else f"{file}: {reason}")

    def launched(self) -> list[Attempt]:
        """The attempts of the launcher's file, matched with the first process's segments."""
        starts: dict[int, dict] = {}
        ends: dict[int, dict] = {}
        for event in self.run.launcher:
            number = event.get("attempt")
            if number is None:
                self.warn(self.launcher_file, event["_line"], "skipped: no field 'attempt'")
                continue
            table = starts if event["event"] == "ATTEMPT_START" else ends
            if number in table:
                self.warn(
                    self.launcher_file,
                    event["_line"],
                    f"skipped: a second {event['event']} of attempt {number}",
                )
                continue
            table[number] = event
        attempts = []
        for number in sorted(set(starts) | set(ends)):
            first = starts.get(number) or ends[number]
            attempt = Attempt(number=number, start=float(first["time"]), end=0.0, status="unknown")
            attempt.end = attempt.start
            end_event = ends.get(number)
            if end_event is not None:
                attempt.stopped = float(end_event["time"])
                status = end_event.get("status")
                attempt.status = "ok" if status == "ok" else "failed"
                attempt.cause = shown_text(end_event.get("cause")) or (
                    None if end_event.get("cause") is None else "(cause not printable text)"
                )
                failed_at = end_event.get("failed_at")
                attempt.end = float(failed_at) if failed_at is not None else attempt.stopped
                if attempt.end > attempt.stopped or attempt.end < attempt.start:
                    self.warn(
                        self.launcher_file,
                        end_event["_line"],
                        f"excluded: attempt {number}'s failed_at is outside its start and end",
                    )
                    attempt.end = attempt.stopped
                attempt._launcher_end_line = end_event["_line"]  # pylint: disable=W0201
            attempts.append(attempt)
        for segment in self.segments:
            number = segment[0].get("attempt")
            if number is None:  # Match by time: the last attempt started before it.
                t = float(segment[0]["time"])
                number = max((a.number for a in attempts if a.start <= t), default=None)
            match = next((a for a in attempts if a.number == number), None)
            if match is not None and match._segment is None:
                match._segment = segment
            else:  # An attempt the launcher's file lacks (still running): its events count.
                if match is not None or number is None:
                    number = max(a.number for a in attempts) + 1 if attempts else 1
                attempts.append(
                    Attempt(
                        number=number,
                        start=_segment_start(segment),
                        end=float(segment[-1]["time"]),
                        status="unknown",
                        _segment=segment,
                    )
                )
        attempts.sort(key=lambda a: (a.start, a.number))
        return attempts

    def unlaunched(self) -> list[Attempt]:
        """The attempts of the first process's events alone (no launcher file)."""
        attempts = []
        for number, segment in enumerate(self.segments, start=1):
            attempts.append(
                Attempt(
                    number=number,
                    start=_segment_start(segment),
                    end=float(segment[-1]["time"]),
                    status="unknown",
                    _segment=segment,
                )
            )
        return attempts

    def settle(self, attempts: list[Attempt]) -> None:
        """Sets each attempt's status, start and end so that times only go forward."""
        cursor = None
        for i, a in enumerate(attempts):
            last = i == len(attempts) - 1
            if cursor is not None and a.start < cursor:
                self.warn(
                    self.launcher_file if self.run.launcher else self.process_file,
                    None,
                    f"attempt {a.number} starts {cursor - a.start:.3f} s before the previous "
                    "attempt ended (the clock stepped back?): counted from that end",
                )
                a.start = cursor
            segment = self._kept(a)
            outcome = _segment_outcome(segment)
            last_event = float(segment[-1]["time"]) if segment else None
            if outcome is not None:
                a.status = outcome
            elif a.status == "unknown" and not last and not self.run.launcher:
                a.status = "failed"
                a.cause = "ended without END_JOB (killed, crashed or hung; no launcher record)"
            if a.status in ("ok", "preempted"):
                if last_event is not None:
                    tail_from = a.stopped if a.stopped is not None else a.end
                    if tail_from - last_event > LAUNCHER_TAIL_S:
                        self.warn(
                            self.launcher_file,
                            getattr(a, "_launcher_end_line", None),
                            f"excluded: attempt {a.number}'s end is {tail_from - last_event:.1f}"
                            f" s after its last event ({self.process_file}:"
                            f"{segment[-1]['_line']}); the attempt ends at that event",
                        )
                    a.end = last_event
                a.stopped = None
                if a.status == "preempted" and a.cause is None:
                    a.cause = "preempted: saved its step and exited on SIGTERM"
            elif a.status == "unknown":
                a.end = max([a.start, a.end] + ([last_event] if last_event is not None else []))
                a.stopped = None
            a.end = max(a.end, a.start)
            if a.stopped is not None:
                a.stopped = max(a.stopped, a.end)
            a._segment = [e for e in segment if float(e["time"]) <= a.end]
            cursor = a.stopped if a.stopped is not None else a.end

    def _kept(self, a: Attempt) -> list[dict]:
        """The attempt's events from its start on, START_STEPs in increasing step order."""
        kept, previous = [], None
        for e in a._segment or []:
            if float(e["time"]) < a.start:
                self.warn(
                    self.process_file,
                    e["_line"],
                    f"excluded: {e['event']} is before attempt {a.number}'s start",
                )
                continue
            if e["event"] == Event.START_STEP.value:
                if previous is not None and int(e["step"]) <= previous:
                    self.warn(
                        self.process_file,
                        e["_line"],
                        f"excluded: START_STEP of step {int(e['step'])} after step {previous} "
                        f"in attempt {a.number} (out of order)",
                    )
                    continue
                previous = int(e["step"])
            kept.append(e)
        return kept


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _badput_spans(
    segment: list[dict], end: float, *, keep_open: bool
) -> list[tuple[str, float, float]]:
    """(part, start, end) of the custom badput spans of a segment.

    A span without its end event ends at `end` if `keep_open` (a running attempt); otherwise
    (the attempt failed inside it) it is dropped: its time was lost with the attempt's steps.
    """
    spans, open_spans = [], {}
    for event in segment:
        kind = str(event.get("custom_badput_event_type", "other"))
        if kind in PRODUCTIVE_PHASES:
            part = "phase:" + kind
        else:
            part = kind if kind in ("checkpoint", "eval") else "other_badput"
        if event["event"] == Event.START_CUSTOM_BADPUT_EVENT.value:
            open_spans[kind] = (part, float(event["time"]))
        elif event["event"] == Event.END_CUSTOM_BADPUT_EVENT.value and kind in open_spans:
            p, t0 = open_spans.pop(kind)
            spans.append((p, t0, float(event["time"])))
    if keep_open:
        spans.extend((p, t0, end) for p, t0 in open_spans.values())
    return spans


def _step_events(segment: list[dict]) -> list[dict]:
    return [e for e in segment if e["event"] == Event.START_STEP.value]


def _split_attempt(attempt: Attempt, committed: Optional[int]) -> None:
    """Fills `attempt.parts` (and its step fields) from its (settled) events."""
    parts = {k: 0.0 for k in PARTS}
    segment = attempt._segment or []
    steps = _step_events(segment)
    if not steps:
        parts["startup"] = attempt.end - attempt.start
        attempt.parts = parts
        return
    attempt.first_step, attempt.last_step = int(steps[0]["step"]), int(steps[-1]["step"])
    attempt.restored_step = attempt.first_step - 1
    parts["startup"] = float(steps[0]["time"]) - attempt.start
    spans = _badput_spans(segment, attempt.end, keep_open=attempt.status != "failed")
    phase_spans = [s for s in spans if s[0].startswith("phase:")]
    spans = [s for s in spans if not s[0].startswith("phase:")]
    phases = {k: 0.0 for k in PRODUCTIVE_PARTS}
    redone = set()
    for i, event in enumerate(steps):
        t0 = float(event["time"])
        t1 = float(steps[i + 1]["time"]) if i + 1 < len(steps) else attempt.end
        rest = t1 - t0
        for part, s0, s1 in spans:
            cut = min(rest, _overlap(t0, t1, s0, s1))
            parts[part] += cut
            rest -= cut
        if i + 1 < len(steps):
            cut = min(rest, float(steps[i + 1].get("input_s") or 0.0))
            parts["input"] += cut
            rest -= cut
        step = int(event["step"])
        if committed is not None and step > committed:
            parts["redone"] += rest
            redone.add(step)
        else:
            parts["productive"] += rest
            # The productive rest by phase: each phase's overlap, within what is left of it.
            left = rest
            for part, s0, s1 in phase_spans:
                cut = min(left, _overlap(t0, t1, s0, s1))
                phases[part[len("phase:") :]] += cut
                left -= cut
            phases["training"] += left
    if phase_spans:
        attempt._phases = phases
    attempt.committed_step = committed
    attempt.redone_steps = len(redone)
    attempt.parts = parts


def check_invariants(report: GoodputReport, *, tolerance_s: float = 1e-6) -> None:
    """Asserts what every report satisfies by construction.

    Args:
        report: The report.
        tolerance_s: The rounding allowed in the sum (seconds, scaled by the wall time).

    Raises:
        GoodputInvariantError: If a part (or the wall) is negative, the parts do not sum to the
            wall time, or the goodput is outside [0, 1].
    """
    tol = tolerance_s * max(1.0, report.wall_s)
    bad = {k: v for k, v in report.parts.items() if not v >= -tol}
    if report.wall_s < 0 or bad:
        raise GoodputInvariantError(f"negative parts {bad} or wall {report.wall_s}")
    total = sum(report.parts.values())
    if abs(total - report.wall_s) > tol:
        raise GoodputInvariantError(f"parts sum to {total} s, wall is {report.wall_s} s")
    for a in report.attempts:
        if a.end < a.start or any(not v >= -tol for v in a.parts.values()):
            raise GoodputInvariantError(f"attempt {a.number}: {a.start}..{a.end}, {a.parts}")
    if report.productive_parts:
        bad = {k: v for k, v in report.productive_parts.items() if not v >= -tol}
        total = sum(report.productive_parts.values())
        if bad or abs(total - report.parts["productive"]) > tol:
            raise GoodputInvariantError(
                f"productive parts {report.productive_parts} (sum {total} s) do not split the "
                f"productive {report.parts['productive']} s"
            )
    goodput = report.goodput
    if goodput is not None and not -tol <= goodput <= 1 + tol:
        raise GoodputInvariantError(f"goodput {goodput} outside [0, 1]")


def compute_goodput(trainer_dir: str, *, run: Optional[RunEvents] = None) -> GoodputReport:
    """Splits a run's wall time over all its attempts into parts (see the module docstring).

    Args:
        trainer_dir: The run's trainer dir.
        run: Its events (default: read from `trainer_dir`).

    Returns:
        The report; `check_invariants` holds for it.

    Raises:
        NoEventsError: If the run recorded no events.
    """
    run = run or read_run_events(trainer_dir)
    if not run.processes or not next(iter(run.processes.values())):
        attempts: list[Attempt] = []
        timeline = None
    else:
        timeline = _Timeline(run)
        attempts = timeline.launched() if run.launcher else timeline.unlaunched()
        timeline.settle(attempts)
    for i, attempt in enumerate(attempts):
        committed = None
        if attempt.status in ("failed", "preempted"):
            # The step the next attempt that trained resumed from.
            for later in attempts[i + 1 :]:
                later_steps = _step_events(later._segment or [])
                if later_steps:
                    committed = int(later_steps[0]["step"]) - 1
                    break
        _split_attempt(attempt, committed)
    parts = {k: 0.0 for k in PARTS}
    for attempt in attempts:
        for k, v in attempt.parts.items():
            parts[k] += v
    productive_parts = {}
    if any(a._phases for a in attempts):
        productive_parts = {k: 0.0 for k in PRODUCTIVE_PARTS}
        for attempt in attempts:
            # An attempt without phase spans: all of its productive time is training.
            phases = attempt._phases or dict(training=attempt.parts.get("productive", 0.0))
            for k, v in phases.items():
                productive_parts[k] += v
    for prev, nxt in zip(attempts, attempts[1:]):
        prev_end = prev.stopped if prev.stopped is not None else prev.end
        parts["idle"] += (prev_end - prev.end) + (nxt.start - prev_end)
    if attempts and attempts[-1].stopped is not None:
        parts["idle"] += attempts[-1].stopped - attempts[-1].end  # Stopping the last attempt.
    if attempts:
        last = attempts[-1]
        wall = (last.stopped if last.stopped is not None else last.end) - attempts[0].start
    else:
        wall = 0.0
    report = GoodputReport(
        trainer_dir=trainer_dir,
        wall_s=wall,
        parts=parts,
        attempts=attempts,
        num_processes=len(run.processes),
        warnings=list(run.warnings) + (timeline.warnings if timeline else []),
        productive_parts=productive_parts,
    )
    check_invariants(report)
    return report


def goodput_summary(trainer_dir: str) -> Optional[dict[str, Any]]:
    """The goodput report for run_summary.json (the last attempt counted until now).

    Never raises: the run's own summary must not fail because of its event files.

    Args:
        trainer_dir: The run's trainer dir.

    Returns:
        `GoodputReport.to_dict()`, or None if the run recorded no events or they cannot be
        read (one warning line says why).
    """
    try:
        return compute_goodput(trainer_dir).to_dict()
    except NoEventsError:
        return None
    except (OSError, ValueError, GoodputInvariantError) as e:
        logging.warning("Goodput of %s not computed: %s: %s", trainer_dir, type(e).__name__, e)
        return None


def _steps_text(a: Attempt) -> str:
    if a.first_step is None:
        return "none"
    return f"{a.first_step}-{a.last_step}"


def format_goodput(report: GoodputReport) -> str:
    """The report as a text table (`axlearn goodput TRAINER_DIR`).

    Args:
        report: The report.

    Returns:
        The text, without a trailing newline.
    """
    wall = report.wall_s
    goodput = report.goodput
    failed = report.failed_attempts
    preempted = sum(1 for a in report.attempts if a.status == "preempted")
    lines = [
        f"Goodput of {report.trainer_dir}: "
        + (f"{100 * goodput:.1f}%" if goodput is not None else "n/a")
        + f" ({report.parts['productive']:.1f} s productive of {wall:.1f} s wall time; "
        f"{len(report.attempts)} attempt(s), {len(failed)} failed"
        + (f", {preempted} preempted" if preempted else "")
        + f"; {report.num_processes} process(es))",
        "",
        f"{'part':<24}{'seconds':>10}{'share':>9}",
    ]
    for key, label in PARTS.items():
        value = report.parts[key]
        share = f"{100 * value / wall:.1f}%" if wall > 0 else "-"
        lines.append(f"{label:<24}{value:>10.1f}{share:>9}")
        if key == "productive":
            for sub, sub_label in PRODUCTIVE_PARTS.items():
                if report.productive_parts:
                    value = report.productive_parts[sub]
                    share = f"{100 * value / wall:.1f}%" if wall > 0 else "-"
                    lines.append(f"{'  ' + sub_label:<24}{value:>10.1f}{share:>9}")
    total = sum(report.parts.values())
    share = f"{100 * total / wall:.1f}%" if wall > 0 else "-"
    lines.append(f"{'total':<24}{total:>10.1f}{share:>9}")
    lines += ["", f"{'attempt':<9}{'start':>9}{'seconds':>9}  {'steps':<11}{'re-done':<9}status"]
    t0 = report.attempts[0].start if report.attempts else 0.0
    for a in report.attempts:
        redone = str(a.redone_steps) if a.status in ("failed", "preempted") else "-"
        status = {
            "failed": f"failed: {a.cause or 'unknown cause'}",
            "preempted": "preempted (saved its step and exited on SIGTERM)",
            "unknown": "no end recorded (still running, or killed with no launcher record)",
        }.get(a.status, a.status)
        if a.status in ("failed", "preempted") and a.committed_step is not None:
            status += f" (resumed from step {a.committed_step})"
        lines.append(
            f"{a.number:<9}{'+%.1f' % (a.start - t0):>9}{a.end - a.start:>9.1f}  "
            f"{_steps_text(a):<11}{redone:<9}{status}"
        )
    for warning in report.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
