"""The built-in recorder: each process appends its events to a file in the trainer directory.

`--recorder_type=local` (the default of `launch_trainer_main`) writes one JSON object per line to
`<trainer_dir>/events/process_<i>.jsonl` (i: `--process_id`, or the launcher's PROCESS_ID, or
TPU_WORKER_ID; 0 for a single process; else the host name is used). Each line is written with
a single `write()` to a file opened for appending, so a crash leaves whole lines, or at worst one
torn last line, which the readers skip with a warning; the next attempt starts on a fresh line.
Lines look like:

    {"event": "START_STEP", "time": 1764244000.123, "step": 12, "pid": 4242, "attempt": 1}

`time` is the wall clock (seconds since the epoch); `START_JOB` also carries `process_start`,
when the operating system started the process (so import time counts as start-up). `attempt` is
the launcher's attempt number (AXLEARN_ATTEMPT, set by `axlearn local launch`), if any.

`--recorder_spec` keys: `dir=PATH` (default: `<--trainer_dir>/events`), `name=NAME`.
"""

from __future__ import annotations

import enum
import json
import os
import socket
import threading
import time
from typing import Any, Optional

from absl import flags

from axlearn.common import file_access
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.measurement_base import Event, Recorder, register_recorder

# The events directory under a trainer dir.
EVENTS_DIR = "events"
# The launcher's record of attempts in the events dir (`axlearn local launch`; read by
# `axlearn goodput`): ATTEMPT_START and ATTEMPT_END lines with the cause of a failure.
LAUNCHER_EVENTS_FILE = "launcher.jsonl"
# The environment variable holding the launcher's attempt number (1, 2, ...).
ATTEMPT_ENV = "AXLEARN_ATTEMPT"


def events_dir(trainer_dir: str) -> str:
    """Returns the directory of a run's event files.

    Args:
        trainer_dir: The trainer dir.

    Returns:
        `<trainer_dir>/events`.
    """
    return os.path.join(trainer_dir, EVENTS_DIR)


def process_label() -> str:
    """Returns this process's label in its event file's name.

    Returns:
        `process_<i>` with i from PROCESS_ID (local launch, JobSet pods) or TPU_WORKER_ID;
        `process_0` for a single-process run (no NUM_PROCESSES, or 1); else `host_<hostname>`.
    """
    for var in ("PROCESS_ID", "TPU_WORKER_ID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return f"process_{int(value)}"
    if os.environ.get("NUM_PROCESSES", "1") == "1":
        return "process_0"
    return f"host_{socket.gethostname()}"


def process_start_time() -> Optional[float]:
    """Returns when the operating system started this process (epoch seconds), if known.

    Returns:
        The start time from /proc (Linux), or None elsewhere.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # Field 22 (starttime, clock ticks after boot); the command name may hold spaces.
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


@register_recorder("local")
class LocalRecorder(Recorder):
    """Appends this process's events to `<dir>/<process label>.jsonl`, one line each."""

    @config_class
    class Config(Recorder.Config):
        """Configures LocalRecorder."""

        # The directory of the event files (usually `<trainer_dir>/events`).
        dir: Required[str] = REQUIRED
        # The file's name without `.jsonl`; None: `process_label()`.
        file_label: Optional[str] = None

    @classmethod
    def from_flags(cls, fv: Optional[flags.FlagValues]) -> LocalRecorder:
        """Builds the recorder from `--recorder_spec=dir=...` or `--trainer_dir`.

        Args:
            fv: The parsed flags.

        Returns:
            The recorder.

        Raises:
            ValueError: If a spec is not key=value with a known key, or no directory is known.
        """
        spec = {}
        for item in (fv.recorder_spec if fv is not None else None) or []:
            key, sep, value = item.partition("=")
            if not sep or key not in ("dir", "name"):
                raise ValueError(
                    f"--recorder_spec={item}: the local recorder takes dir=PATH and name=NAME."
                )
            spec[key] = value
        trainer_dir = getattr(fv, "trainer_dir", None) if fv is not None else None
        directory = spec.get("dir") or (events_dir(trainer_dir) if trainer_dir else None)
        if not directory:
            raise ValueError(
                "--recorder_type=local needs --trainer_dir or --recorder_spec=dir=PATH (where "
                "the event files go)."
            )
        if "://" in directory:
            raise ValueError(
                f"--recorder_type=local writes local files, not {directory} (object stores "
                "cannot be appended to): pass --recorder_spec=dir=LOCAL_PATH."
            )
        cfg = cls.default_config().set(name=spec.get("name", "local"), dir=directory)
        process_id = getattr(fv, "process_id", None) if fv is not None else None
        if isinstance(process_id, int):
            cfg.file_label = f"process_{process_id}"  # --process_id of a multi-process run.
        return cfg.instantiate()

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self._lock = threading.Lock()
        self._fd: Optional[int] = None
        self._attempt = os.environ.get(ATTEMPT_ENV)

    @property
    def path(self) -> str:
        """The event file of this process."""
        cfg = self._config
        return os.path.join(cfg.dir, f"{cfg.file_label or process_label()}.jsonl")

    def _open(self) -> int:
        if self._fd is None:
            # Through the file layer, from the directory above the events dir: neither a linked
            # `events/` nor a link planted under the event file's name is followed.
            directory = os.path.normpath(self._config.dir)
            root, name = os.path.dirname(directory) or ".", os.path.basename(directory)
            os.makedirs(root, exist_ok=True)
            file_access.makedirs(root, name)
            fd = file_access.open_fd(
                root, f"{name}/{os.path.basename(self.path)}", os.O_RDWR | os.O_APPEND | os.O_CREAT
            )
            size = os.fstat(fd).st_size
            if size:
                # A previous attempt may have died mid-line: start on a fresh line.
                if os.pread(fd, 1, size - 1) != b"\n":
                    os.write(fd, b"\n")
            self._fd = fd
        return self._fd

    def record(self, event: Event, *args: Any, **kwargs: Any) -> None:
        """Appends the event as one JSON line.

        Args:
            event: The event.
            *args: For START_STEP, the step number (stored as `step`); others as `args`.
            **kwargs: Stored as fields (enums by value, other objects as strings).
        """
        line: dict[str, Any] = {"event": Event(event).value, "time": time.time()}
        if args:
            if event == Event.START_STEP and len(args) == 1:
                line["step"] = int(args[0])
            else:
                line["args"] = [_json_value(a) for a in args]
        for key, value in kwargs.items():
            line[key] = _json_value(value)
        line["pid"] = os.getpid()
        if self._attempt and self._attempt.isdigit():
            line["attempt"] = int(self._attempt)
        if event == Event.START_JOB and "process_start" not in line:
            line["process_start"] = process_start_time()
        data = (json.dumps(line, sort_keys=True) + "\n").encode("utf-8")
        with self._lock:
            os.write(self._open(), data)

    def close(self) -> None:
        """Closes the file (later events reopen it)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
