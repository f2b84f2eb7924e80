"""The run's record: the config dump and launch flags a trainer dir was trained with, versioned.

A run writes its record only once it is known to start: after the restore succeeded, the config
was validated (the trainer instantiated) and there is at least one step to train. A rerun that
fails (a model that does not match the checkpoint, a rejected value) or has nothing to do
("Already reached max_step") leaves the record as it was.

Layout, in the trainer dir:

```
trainer_config            the dump of the newest record (what `config diff` reads)
launch_trainer_flags      its flags (JSON)
run_records/1/            every record, numbered from 1, never rewritten:
    trainer_config, launch_trainer_flags, record.json ({"record", "start_step", "time"})
```

A start whose dump and flags equal the newest record's (a plain resume) adds no record. A record
covers the checkpoints of steps after its `start_step` (the step it restored; -1 for a start
from scratch), until the next record's `start_step`: `record_dir_for_step` finds the record a
checkpoint was made with, which `axlearn generate`/`eval` use to rebuild the model that step
belongs to. A trainer dir written before records were versioned has only the two top-level
files: they are taken as record 1, covering every step before the first versioned start.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Optional

from absl import logging

from axlearn.common.path_containment import (
    PathContainmentError,
    contained_path,
    write_text_no_follow,
)

# The newest record's files in the trainer dir.
TRAINER_CONFIG_FILE = "trainer_config"
LAUNCH_FLAGS_FILE = "launch_trainer_flags"
# The numbered records.
RECORDS_DIR = "run_records"
RECORD_FILE = "record.json"


def _write_text(path: str, text: str) -> None:
    """Writes `text` to `path` via a temporary file and a rename (never half-written, never
    through a symbolic link)."""
    write_text_no_follow(path, text)


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _record_numbers(trainer_dir: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(trainer_dir, RECORDS_DIR))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def _flags_text(flags_json: dict[str, Any]) -> str:
    return json.dumps(flags_json, indent=2, sort_keys=True)


def records(trainer_dir: str) -> list[dict[str, Any]]:
    """Returns the records of `trainer_dir`, oldest first.

    Args:
        trainer_dir: The trainer dir.

    Returns:
        [{"record": n, "start_step": s, "time": t, "dir": path}, ...]; empty if none is
        versioned.
    """
    out = []
    for n in _record_numbers(trainer_dir):
        path = os.path.join(trainer_dir, RECORDS_DIR, str(n))
        try:
            contained_path(
                trainer_dir,
                os.path.join(RECORDS_DIR, str(n), RECORD_FILE),
                source=trainer_dir,
                what=f"run record {n}",
            )
        except PathContainmentError as e:
            logging.warning("Ignoring %s", e)
            continue
        try:
            with open(os.path.join(path, RECORD_FILE), encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue  # A record whose write was cut short: never the one a step belongs to.
        out.append(dict(info, record=n, dir=path))
    return out


def write_run_record(
    trainer_dir: str, *, trainer_config: str, launch_flags: dict[str, Any], start_step: int
) -> str:
    """Makes the given config and flags the newest record of `trainer_dir` (see module doc).

    Args:
        trainer_dir: The trainer dir.
        trainer_config: The config dump (`debug_string()`).
        launch_flags: The flags, JSON-ready.
        start_step: The step the run restored (-1 if it starts from scratch).

    Returns:
        The directory of the record now newest (a new one, or the previous one if equal).
    """
    config_text = trainer_config.rstrip("\n") + "\n"
    flags_text = _flags_text(launch_flags)
    numbers = _record_numbers(trainer_dir)
    root = os.path.join(trainer_dir, RECORDS_DIR)
    top_config = os.path.join(trainer_dir, TRAINER_CONFIG_FILE)
    top_flags = os.path.join(trainer_dir, LAUNCH_FLAGS_FILE)
    # Never written through a link out of the trainer dir (a planted `run_records` link).
    contained_path(trainer_dir, RECORDS_DIR, source=trainer_dir, what="run records directory")
    if not numbers and os.path.isfile(top_config) and not os.path.islink(top_config):
        # A trainer dir from before records were versioned: keep its record as record 1.
        legacy = os.path.join(root, "1")
        os.makedirs(legacy, exist_ok=True)
        shutil.copyfile(top_config, os.path.join(legacy, TRAINER_CONFIG_FILE))
        if os.path.isfile(top_flags) and not os.path.islink(top_flags):
            shutil.copyfile(top_flags, os.path.join(legacy, LAUNCH_FLAGS_FILE))
        _write_text(
            os.path.join(legacy, RECORD_FILE),
            json.dumps(dict(start_step=-1, time=None, note="written before versioned records")),
        )
        numbers = [1]
    if numbers:
        newest = os.path.join(root, str(numbers[-1]))
        if (
            _read_text(os.path.join(newest, TRAINER_CONFIG_FILE)) == config_text
            and _read_text(os.path.join(newest, LAUNCH_FLAGS_FILE)) == flags_text
        ):
            return newest  # A plain resume: the same record goes on.
    number = (numbers[-1] if numbers else 0) + 1
    record_dir = os.path.join(root, str(number))
    # Never written through a link out of the trainer dir (a planted `run_records/<n>` link).
    contained_path(
        trainer_dir, os.path.join(RECORDS_DIR, str(number)), source=trainer_dir, what="run record"
    )
    os.makedirs(record_dir, exist_ok=True)
    _write_text(os.path.join(record_dir, TRAINER_CONFIG_FILE), config_text)
    _write_text(os.path.join(record_dir, LAUNCH_FLAGS_FILE), flags_text)
    # Last: a record without record.json is not one (see `records`).
    _write_text(
        os.path.join(record_dir, RECORD_FILE),
        json.dumps(
            dict(start_step=start_step, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        ),
    )
    _write_text(top_config, config_text)
    _write_text(top_flags, flags_text)
    return record_dir


def record_dir_for_step(trainer_dir: str, step: Optional[int]) -> str:
    """Returns the directory holding the record a checkpoint of `step` was made with.

    Args:
        trainer_dir: The trainer dir.
        step: The checkpoint step; None: the newest record.

    Returns:
        A `run_records/<n>` directory, or `trainer_dir` itself when no record is versioned (its
        top-level `trainer_config` and `launch_trainer_flags` are the record).
    """
    found = records(trainer_dir)
    if not found:
        return trainer_dir
    if step is None:
        return found[-1]["dir"]
    matching = [r for r in found if r.get("start_step", -1) < step]
    return (matching or found[:1])[-1]["dir"]
