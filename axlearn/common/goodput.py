"""Goodput: how much of a run's wall time, over all its attempts, trained the model.

Reads the event files the local recorder (`axlearn.common.measurement_local`) wrote under
`<trainer_dir>/events/` and, when the run was started by `axlearn local launch`, the launcher's
`launcher.jsonl` there (each attempt's start, end and cause). The wall time, from the first
attempt's start to the last attempt's end, is split into parts that add up to it:

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

A step's time is the interval from its START_STEP to the next START_STEP (the last one: to the
attempt's end), less the badput and input wait inside it. The figures follow the first process's
(lowest index) timeline: all processes of a step run together. Goodput = productive / wall.

Files from an older or damaged run are read with warnings naming the file: a torn last line
(a crash mid-write), a line that is not JSON, an unknown event.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from collections.abc import Sequence
from typing import Any, Optional

from axlearn.common.measurement_base import Event
from axlearn.common.measurement_local import EVENTS_DIR
from axlearn.common.measurement_local import LAUNCHER_EVENTS_FILE as LAUNCHER_FILE

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
_KNOWN_EVENTS = {e.value for e in Event}
_LAUNCHER_EVENTS = {"ATTEMPT_START", "ATTEMPT_END"}


class NoEventsError(ValueError):
    """A trainer dir holds no event files."""


def read_event_file(path: str, *, warnings: list[str], known: Sequence[str] = ()) -> list[dict]:
    """Reads one JSON-lines event file, skipping damaged lines with a warning.

    Args:
        path: The file.
        warnings: Receives one message per skipped line (naming the file and the line).
        known: The event names to keep (default: `measurement_base.Event`'s).

    Returns:
        The events, in file order, each with a float `time`.
    """
    known = set(known) or _KNOWN_EVENTS
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    events = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = number == len(lines)  # No newline after it: written partly.
        try:
            event = json.loads(raw.decode("utf-8"))
            if not isinstance(event, dict) or not isinstance(event.get("time"), (int, float)):
                raise ValueError("not an event object with a time")
        except (ValueError, UnicodeDecodeError):
            what = "torn last line (the process died while writing it)" if last else "bad line"
            warnings.append(f"{path}:{number}: skipped a {what}: {raw[:80]!r}")
            continue
        if event.get("event") not in known:
            warnings.append(f"{path}:{number}: skipped unknown event {event.get('event')!r}")
            continue
        events.append(event)
    return events


def _process_sort_key(path: str) -> tuple:
    match = re.search(r"process_(\d+)\.jsonl$", path)
    return (0, int(match.group(1)), path) if match else (1, 0, path)


@dataclasses.dataclass
class RunEvents:
    """The events of a run.

    Attributes:
        processes: Event lists by file name (process_0.jsonl, ...), lowest process first.
        launcher: The launcher's attempt events (empty if not launched by `local launch`).
        warnings: What was skipped while reading.
    """

    processes: dict[str, list[dict]]
    launcher: list[dict]
    warnings: list[str]


def read_run_events(trainer_dir: str) -> RunEvents:
    """Reads every event file under `<trainer_dir>/events`.

    Args:
        trainer_dir: The run's trainer dir.

    Returns:
        The events.

    Raises:
        NoEventsError: If there is no process event file.
    """
    directory = os.path.join(trainer_dir, EVENTS_DIR)
    warnings: list[str] = []
    paths = sorted(
        (p for p in glob.glob(os.path.join(directory, "*.jsonl")) if not p.endswith(LAUNCHER_FILE)),
        key=_process_sort_key,
    )
    if not paths:
        raise NoEventsError(
            f"{trainer_dir} has no event files ({directory}/*.jsonl): the run recorded no events "
            "(launch_trainer_main records them with --recorder_type=local, its default)."
        )
    processes = {os.path.basename(p): read_event_file(p, warnings=warnings) for p in paths}
    launcher_path = os.path.join(directory, LAUNCHER_FILE)
    launcher = (
        read_event_file(launcher_path, warnings=warnings, known=_LAUNCHER_EVENTS)
        if os.path.exists(launcher_path)
        else []
    )
    return RunEvents(processes=processes, launcher=launcher, warnings=warnings)


@dataclasses.dataclass
class Attempt:
    """One attempt of a run (all processes started together once).

    Attributes:
        number: 1, 2, ...
        start: Epoch seconds when it started.
        end: Epoch seconds when it ended (or its last event).
        status: "ok" (ended normally), "failed" or "unknown" (no end recorded).
        cause: Why it ended, for a failed attempt (the launcher's words, or what the events
            show).
        first_step: The first step it started (None: none).
        last_step: The last step it started.
        restored_step: The step it restored (from its first step), None if it trained none.
        committed_step: For a failed attempt, the step the next attempt resumed from.
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

    def to_dict(self) -> dict[str, Any]:
        """The attempt as JSON-ready values."""
        out = dataclasses.asdict(self)
        out.pop("_segment")
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
        warnings: What was skipped while reading.
    """

    trainer_dir: str
    wall_s: float
    parts: dict[str, float]
    attempts: list[Attempt]
    num_processes: int
    warnings: list[str]

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
        return dict(
            trainer_dir=self.trainer_dir,
            goodput=self.goodput,
            wall_s=self.wall_s,
            parts_s=dict(self.parts),
            parts_sum_s=sum(self.parts.values()),
            num_attempts=len(self.attempts),
            num_failed_attempts=len(self.failed_attempts),
            num_processes=self.num_processes,
            attempts=[a.to_dict() for a in self.attempts],
            warnings=list(self.warnings),
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
    first = segment[0]
    start = first.get("process_start") if first["event"] == Event.START_JOB.value else None
    return float(start) if isinstance(start, (int, float)) else float(first["time"])


def _attempts(run: RunEvents) -> list[Attempt]:
    """The attempts, from the launcher's file if any, matched with the first process's events."""
    segments = _segments(next(iter(run.processes.values())))
    launched: dict[int, dict[str, dict]] = {}
    for event in run.launcher:
        launched.setdefault(int(event.get("attempt", 0)), {})[event["event"]] = event
    attempts = []
    if launched:
        for number in sorted(launched):
            start_event = launched[number].get("ATTEMPT_START")
            end_event = launched[number].get("ATTEMPT_END")
            start = float((start_event or end_event)["time"])
            attempts.append(Attempt(number=number, start=start, end=start, status="unknown"))
            if end_event is not None:
                attempts[-1].end = float(end_event.get("failed_at") or end_event["time"])
                attempts[-1].stopped = float(end_event["time"])
                attempts[-1].status = "ok" if end_event.get("status") == "ok" else "failed"
                attempts[-1].cause = end_event.get("cause")
        for segment in segments:
            number = segment[0].get("attempt")
            if number is None:  # Match by time: the last attempt started before it.
                t = float(segment[0]["time"])
                number = max((a.number for a in attempts if a.start <= t), default=None)
            match = next((a for a in attempts if a.number == number), None)
            if match is not None and match._segment is None:
                match._segment = segment
        for a in attempts:
            if a.status == "unknown" and a._segment is not None:
                a.end = max(a.end, float(a._segment[-1]["time"]))
    else:
        for number, segment in enumerate(segments, start=1):
            ended = any(e["event"] == Event.END_JOB.value for e in segment)
            attempts.append(
                Attempt(
                    number=number,
                    start=_segment_start(segment),
                    end=float(segment[-1]["time"]),
                    status="ok" if ended else "unknown",
                    _segment=segment,
                )
            )
        for a in attempts[:-1]:
            if a.status == "unknown":
                a.status = "failed"
                a.cause = "ended without END_JOB (killed, crashed or hung; no launcher record)"
    return attempts


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
        part = kind if kind in ("checkpoint", "eval") else "other_badput"
        if event["event"] == Event.START_CUSTOM_BADPUT_EVENT.value:
            open_spans[kind] = (part, float(event["time"]))
        elif event["event"] == Event.END_CUSTOM_BADPUT_EVENT.value and kind in open_spans:
            p, t0 = open_spans.pop(kind)
            spans.append((p, t0, float(event["time"])))
    if keep_open:
        spans.extend((p, t0, end) for p, t0 in open_spans.values())
    return spans


def _split_attempt(attempt: Attempt, committed: Optional[int]) -> None:
    """Fills `attempt.parts` (and its step fields) from its events."""
    parts = {k: 0.0 for k in PARTS}
    segment = attempt._segment or []
    steps = [e for e in segment if e["event"] == Event.START_STEP.value and "step" in e]
    steps = [e for e in steps if attempt.start <= float(e["time"]) <= attempt.end]
    if not steps:
        parts["startup"] = attempt.end - attempt.start
        attempt.parts = parts
        return
    attempt.first_step, attempt.last_step = int(steps[0]["step"]), int(steps[-1]["step"])
    attempt.restored_step = attempt.first_step - 1
    parts["startup"] = float(steps[0]["time"]) - attempt.start
    spans = _badput_spans(segment, attempt.end, keep_open=attempt.status != "failed")
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
            cut = min(rest, max(0.0, float(steps[i + 1].get("input_s") or 0.0)))
            parts["input"] += cut
            rest -= cut
        step = int(event["step"])
        if committed is not None and step > committed:
            parts["redone"] += rest
            redone.add(step)
        else:
            parts["productive"] += rest
    attempt.committed_step = committed
    attempt.redone_steps = len(redone)
    attempt.parts = parts


def compute_goodput(trainer_dir: str, *, run: Optional[RunEvents] = None) -> GoodputReport:
    """Splits a run's wall time over all its attempts into parts (see the module docstring).

    Args:
        trainer_dir: The run's trainer dir.
        run: Its events (default: read from `trainer_dir`).

    Returns:
        The report.

    Raises:
        NoEventsError: If the run recorded no events.
    """
    run = run or read_run_events(trainer_dir)
    attempts = _attempts(run)
    for i, attempt in enumerate(attempts):
        committed = None
        if attempt.status == "failed":
            # The step the next attempt that trained resumed from.
            for later in attempts[i + 1 :]:
                later_steps = [
                    int(e["step"])
                    for e in (later._segment or [])
                    if e["event"] == Event.START_STEP.value and "step" in e
                ]
                if later_steps:
                    committed = later_steps[0] - 1
                    break
        _split_attempt(attempt, committed)
    parts = {k: 0.0 for k in PARTS}
    for attempt in attempts:
        for k, v in attempt.parts.items():
            parts[k] += v
    for prev, nxt in zip(attempts, attempts[1:]):
        parts["idle"] += max(0.0, nxt.start - prev.end)
    last_end = attempts[-1].end if attempts else 0.0
    if attempts and attempts[-1].stopped is not None and attempts[-1].stopped > last_end:
        parts["idle"] += attempts[-1].stopped - last_end  # Stopping the last attempt.
        last_end = attempts[-1].stopped
    wall = last_end - attempts[0].start if attempts else 0.0
    return GoodputReport(
        trainer_dir=trainer_dir,
        wall_s=wall,
        parts=parts,
        attempts=attempts,
        num_processes=len(run.processes),
        warnings=run.warnings,
    )


def goodput_summary(trainer_dir: str) -> Optional[dict[str, Any]]:
    """The goodput report for run_summary.json (the last attempt counted until now).

    Args:
        trainer_dir: The run's trainer dir.

    Returns:
        `GoodputReport.to_dict()`, or None if the run recorded no events (or they cannot be
        read).
    """
    try:
        return compute_goodput(trainer_dir).to_dict()
    except (NoEventsError, OSError):
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
    lines = [
        f"Goodput of {report.trainer_dir}: "
        + (f"{100 * goodput:.1f}%" if goodput is not None else "n/a")
        + f" ({report.parts['productive']:.1f} s productive of {wall:.1f} s wall time; "
        f"{len(report.attempts)} attempt(s), {len(failed)} failed; "
        f"{report.num_processes} process(es))",
        "",
        f"{'part':<24}{'seconds':>10}{'share':>9}",
    ]
    for key, label in PARTS.items():
        value = report.parts[key]
        share = f"{100 * value / wall:.1f}%" if wall > 0 else "-"
        lines.append(f"{label:<24}{value:>10.1f}{share:>9}")
    total = sum(report.parts.values())
    share = f"{100 * total / wall:.1f}%" if wall > 0 else "-"
    lines.append(f"{'total':<24}{total:>10.1f}{share:>9}")
    lines += ["", f"{'attempt':<9}{'start':>9}{'seconds':>9}  {'steps':<11}{'re-done':<9}status"]
    t0 = report.attempts[0].start if report.attempts else 0.0
    for a in report.attempts:
        redone = str(a.redone_steps) if a.status == "failed" else "-"
        status = {
            "failed": f"failed: {a.cause or 'unknown cause'}",
            "unknown": "no end recorded (still running, or killed with no launcher record)",
        }.get(a.status, a.status)
        if a.status == "failed" and a.committed_step is not None:
            status += f" (resumed from step {a.committed_step})"
        lines.append(
            f"{a.number:<9}{'+%.1f' % (a.start - t0):>9}{a.end - a.start:>9.1f}  "
            f"{_steps_text(a):<11}{redone:<9}{status}"
        )
    for warning in report.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)
