"""Reading a run's event files for goodput: every line validated, every skipped line named.

The files are `<trainer_dir>/events/process_<i>.jsonl` (the local recorder,
`axlearn.common.measurement_local`) and `<trainer_dir>/events/launcher.jsonl` (`axlearn local
launch`). They live in a directory others may write to and may come from an older or damaged
run, so each is read through the file layer (`axlearn.common.file_access`: no link followed,
regular files only) one bounded line at a time, and each line is checked before it is used:

- it is a JSON object of at most `MAX_LINE_BYTES` bytes, UTF-8, nested at most `MAX_DEPTH`
  deep, naming a known event, with a finite `time`;
- each field has its type: `step` a non-negative integer, `input_s` a non-negative number,
  `attempt` a positive integer, `process_start`/`failed_at` numbers, `status`/`cause` strings;
- the timeline goes forward: an event earlier than the one before it in its file (the clock
  stepped back, or lines out of order), and a START_STEP whose step is not after the previous
  one of its attempt, are excluded.

A skipped line is reported as `<file>:<line>: <reason>`, never with its bytes (a line may hold
anything). After `MAX_WARNINGS_PER_FILE` reports a file's further skips are counted in one line.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import re
from typing import Any, Optional

from axlearn.common import file_access
from axlearn.common.measurement_base import Event
from axlearn.common.measurement_local import EVENTS_DIR
from axlearn.common.measurement_local import LAUNCHER_EVENTS_FILE as LAUNCHER_FILE

# The longest line read (an event is ~150 bytes; a longer line is skipped unread).
MAX_LINE_BYTES = 64 * 1024
# The deepest JSON nesting accepted in a line (events are flat objects).
MAX_DEPTH = 8
# How many skipped lines of one file are reported one by one.
MAX_WARNINGS_PER_FILE = 20
# The most event files read from one events dir.
MAX_FILES = 4096

KNOWN_EVENTS = frozenset(e.value for e in Event)
LAUNCHER_EVENTS = frozenset({"ATTEMPT_START", "ATTEMPT_END"})
_PROCESS_FILE = re.compile(r"^(process_(\d+)|host_[A-Za-z0-9_.-]{1,200})\.jsonl$")
# A cause shown in the table: printable ASCII, bounded.
_SHOWN_TEXT = re.compile(r"^[ -~]{1,300}$")


class NoEventsError(ValueError):
    """A trainer dir holds no event files."""


@dataclasses.dataclass
class EventFile:
    """One file's events and what was skipped in it.

    Attributes:
        path: The file (as `<trainer_dir>/events/<name>`).
        events: The kept events, in file order; each has `_line` (its line number).
        skipped: How many lines were skipped.
        warnings: One `<file>:<line>: <reason>` per skipped line (the first
            `MAX_WARNINGS_PER_FILE`), then one line counting the rest.
    """

    path: str
    events: list[dict] = dataclasses.field(default_factory=list)
    skipped: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)

    def skip(self, line: int, reason: str) -> None:
        """Records a skipped line.

        Args:
            line: Its number (from 1; 0 for the file as a whole).
            reason: Why, without any of the line's content.
        """
        self.skipped += 1
        if self.skipped <= MAX_WARNINGS_PER_FILE:
            where = f"{self.path}:{line}" if line else self.path
            self.warnings.append(f"{where}: {reason}")

    def finish(self) -> None:
        """Adds the count of skips beyond those reported one by one."""
        extra = self.skipped - MAX_WARNINGS_PER_FILE
        if extra > 0:
            self.warnings.append(
                f"{self.path}: {extra} more line(s) skipped (only the first "
                f"{MAX_WARNINGS_PER_FILE} are listed)"
            )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), "a number"
    )


# Optional fields and their checks: (check, what it must be).
_FIELDS = {
    "step": (lambda v: _is_int(v) and v >= 0, "a non-negative integer"),
    "input_s": (lambda v: _is_number(v) and v >= 0, "a non-negative number of seconds"),
    "attempt": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
    "process_start": (lambda v: v is None or _is_number(v), "a number of epoch seconds or null"),
    "failed_at": (lambda v: v is None or _is_number(v), "a number of epoch seconds or null"),
    "status": (lambda v: isinstance(v, str), "a string"),
    "outcome": (lambda v: isinstance(v, str), "a string"),
    "cause": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "exit_code": (lambda v: v is None or _is_int(v), "an integer or null"),
    "custom_badput_event_type": (lambda v: isinstance(v, str), "a string"),
}


def check_event(event: Any, known: frozenset) -> Optional[str]:
    """Says why a parsed line is not a usable event (None: it is one).

    Args:
        event: The parsed JSON value.
        known: The event names accepted.

    Returns:
        The reason (naming the field and what it must be, never its value), or None.
    """
    if not isinstance(event, dict):
        return f"skipped: the line is {_type_name(event)}, not an event object"
    name = event.get("event")
    if not isinstance(name, str) or name not in known:
        return "skipped: unknown event name (field 'event')"
    if not _is_number(event.get("time")):
        return f"skipped: field 'time' of {name} is {_type_name(event.get('time'))}, not a number"
    if name == Event.START_STEP.value and "step" not in event:
        return "skipped: START_STEP without its field 'step'"
    for key, (ok, what) in _FIELDS.items():
        if key in event and not ok(event[key]):
            shown = _type_name(event[key])
            if shown == "a number":
                shown = "out of range"
            return f"skipped: field {key!r} of {name} is {shown}, not {what}"
    return None


def shown_text(text: Any) -> Optional[str]:
    """Returns `text` if it is safe to print (printable ASCII, at most 300 characters).

    Args:
        text: A value read from a file (e.g. the launcher's cause of a failure).

    Returns:
        The text, or None.
    """
    return text if isinstance(text, str) and _SHOWN_TEXT.match(text) else None


def _lines(root: str, relpath: str, file: EventFile):
    """Yields (line number, bytes) of a file, bounded; a too-long line is skipped unread."""
    with file_access.open_read(root, relpath) as f:
        number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # Skip the rest of the line unread.
                    raw = f.readline(MAX_LINE_BYTES)
                file.skip(number, f"skipped: the line is longer than {MAX_LINE_BYTES} bytes")
                continue
            yield number, raw, raw.endswith(b"\n")


def read_event_file(root: str, relpath: str, *, known: frozenset = KNOWN_EVENTS) -> EventFile:
    """Reads one JSON-lines event file, keeping the lines that are valid events in order.

    Args:
        root: The trainer dir (the file layer's root).
        relpath: The file below it (e.g. `events/process_0.jsonl`).
        known: The event names to keep.

    Returns:
        The file's kept events and its warnings. A file that cannot be opened (a link, a FIFO,
        not a regular file) is one warning and no events.
    """
    file = EventFile(path=f"{root.rstrip('/')}/{relpath}")
    last_time = None  # The time of the last kept event: the timeline goes forward.
    try:
        for number, raw, whole in _lines(root, relpath, file):
            if not raw.strip():
                continue
            try:
                brackets = raw.count(b"{") + raw.count(b"[")
                if brackets > MAX_DEPTH and file_access.json_depth(raw) > MAX_DEPTH:
                    raise ValueError(f"nested deeper than {MAX_DEPTH}")
                event = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                file.skip(number, "skipped: the line is not UTF-8")
                continue
            except (ValueError, RecursionError) as e:
                if not whole:
                    reason = "skipped a torn last line (the process died while writing it)"
                elif "nested deeper" in str(e):
                    reason = f"skipped: the line is JSON nested deeper than {MAX_DEPTH}"
                else:
                    reason = "skipped: the line is not JSON"
                file.skip(number, reason)
                continue
            reason = check_event(event, known)
            if reason is not None:
                file.skip(number, reason)
                continue
            t = float(event["time"])
            if last_time is not None and t < last_time:
                file.skip(
                    number,
                    f"excluded: its time is {last_time - t:.3f} s before the previous event's "
                    "(the clock stepped back, or lines out of order)",
                )
                continue
            last_time = t
            event["_line"] = number
            file.events.append(event)
    except OSError as e:  # file_access.FileAccessError names the file and the rule.
        rule = getattr(e, "rule", None) or e.strerror or type(e).__name__
        file.skip(0, f"not read: {rule}")
    file.finish()
    return file


def event_file_names(trainer_dir: str) -> list[str]:
    """The process event files of a run, lowest process index first.

    Args:
        trainer_dir: The trainer dir.

    Returns:
        File names under `<trainer_dir>/events` (process_<i>.jsonl, then host_<name>.jsonl).
    """
    try:
        names = file_access.listdir(trainer_dir, EVENTS_DIR)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return []
        raise NoEventsError(f"{e}; the run's events are not read.") from e
    found = []
    for name in names:
        match = _PROCESS_FILE.match(name)
        if match:
            found.append((0, int(match.group(2)), name) if match.group(2) else (1, 0, name))
    return [name for *_, name in sorted(found)[:MAX_FILES]]


@dataclasses.dataclass
class RunEvents:
    """The events of a run.

    Attributes:
        processes: Kept events by file name (process_0.jsonl, ...), lowest process first.
        launcher: The launcher's attempt events (empty if not launched by `local launch`).
        warnings: What was skipped while reading, `<file>:<line>: <reason>` each.
        files: The file path of each name in `processes`, and of "launcher".
    """

    processes: dict[str, list[dict]]
    launcher: list[dict]
    warnings: list[str]
    files: dict[str, str] = dataclasses.field(default_factory=dict)


def read_run_events(trainer_dir: str) -> RunEvents:
    """Reads every event file under `<trainer_dir>/events`.

    Args:
        trainer_dir: The run's trainer dir.

    Returns:
        The events.

    Raises:
        NoEventsError: If there is no process event file (or the events dir is refused).
    """
    names = event_file_names(trainer_dir)
    if not names:
        raise NoEventsError(
            f"{trainer_dir} has no event files ({trainer_dir.rstrip('/')}/{EVENTS_DIR}/"
            "process_*.jsonl): the run recorded no events (launch_trainer_main records them "
            "with --recorder_type=local, its default)."
        )
    warnings: list[str] = []
    processes, files = {}, {}
    for name in names:
        file = read_event_file(trainer_dir, f"{EVENTS_DIR}/{name}")
        processes[name] = file.events
        files[name] = file.path
        warnings += file.warnings
    launcher: list[dict] = []
    relpath = f"{EVENTS_DIR}/{LAUNCHER_FILE}"
    try:
        present = file_access.exists(trainer_dir, relpath)
    except OSError:
        present = True  # Let the read name the rule it breaks.
    if present:
        file = read_event_file(trainer_dir, relpath, known=LAUNCHER_EVENTS)
        launcher = file.events
        files["launcher"] = file.path
        warnings += file.warnings
    return RunEvents(processes=processes, launcher=launcher, warnings=warnings, files=files)
