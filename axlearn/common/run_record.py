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

import errno
import importlib.util
import json
import os
import re
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


def _read_text(trainer_dir: str, path: str) -> Optional[str]:
    """A record file's text through the file layer (None if missing or refused)."""
    from axlearn.common import file_access  # pylint: disable=import-outside-toplevel

    try:
        return file_access.read_text(
            trainer_dir, _relpath(trainer_dir, path), max_bytes=MAX_DUMP_BYTES
        )
    except (OSError, ValueError):
        return None  # Missing or refused: not the same record (a new one is written).


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
    from axlearn.common import file_access  # pylint: disable=import-outside-toplevel

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
            info = file_access.read_json(
                trainer_dir,
                os.path.join(RECORDS_DIR, str(n), RECORD_FILE),
                max_bytes=MAX_FLAGS_BYTES,
                max_depth=8,
            )
            if not isinstance(info, dict):
                raise ValueError("not an object")
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
            _read_text(trainer_dir, os.path.join(newest, TRAINER_CONFIG_FILE)) == config_text
            and _read_text(trainer_dir, os.path.join(newest, LAUNCH_FLAGS_FILE)) == flags_text
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


# The most bytes read from a record's flags (JSON) and dump (text): both are a few KB.
MAX_FLAGS_BYTES = 1 << 20
MAX_DUMP_BYTES = 32 << 20
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,20}$")


class RunRecordError(ValueError):
    """A run record cannot be used (unreadable, malformed, or naming a module not named by the
    user); the message names the file and the fix, never the file's content beyond a module
    name."""


def _relpath(trainer_dir: str, path: str) -> str:
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(trainer_dir))
    if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
        raise RunRecordError(f"{path} is not inside the trainer dir {trainer_dir}")
    return rel


def read_launch_flags(trainer_dir: str, record_dir: str) -> dict[str, Any]:
    """Reads a record's `launch_trainer_flags` through the file layer (bounded, no link).

    Args:
        trainer_dir: The trainer dir (the file layer's root).
        record_dir: The record's directory (`record_dir_for_step`).

    Returns:
        The flags.

    Raises:
        FileNotFoundError: If the file does not exist.
        RunRecordError: If it is refused (a link, not a regular file, too large, not a JSON
            object), naming the file and the rule.
    """
    from axlearn.common import file_access  # pylint: disable=import-outside-toplevel

    rel = os.path.join(_relpath(trainer_dir, record_dir), LAUNCH_FLAGS_FILE)
    path = os.path.join(trainer_dir, rel)
    try:
        flags_json = file_access.read_json(
            trainer_dir, os.path.normpath(rel), max_bytes=MAX_FLAGS_BYTES, max_depth=16
        )
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "does not exist", path) from e
        raise RunRecordError(str(e)) from e
    except ValueError as e:
        raise RunRecordError(f"{path}: not valid JSON ({type(e).__name__})") from e
    if not isinstance(flags_json, dict):
        raise RunRecordError(f"{path}: not a JSON object of flags")
    return flags_json


def read_dump(trainer_dir: str, record_dir: str) -> Optional[str]:
    """Reads a record's `trainer_config` dump through the file layer (None if it is missing).

    Args:
        trainer_dir: The trainer dir.
        record_dir: The record's directory.

    Returns:
        The dump's text, or None.

    Raises:
        RunRecordError: If it is refused (naming the file and the rule).
    """
    from axlearn.common import file_access  # pylint: disable=import-outside-toplevel

    rel = os.path.normpath(os.path.join(_relpath(trainer_dir, record_dir), TRAINER_CONFIG_FILE))
    try:
        return file_access.read_text(trainer_dir, rel, max_bytes=MAX_DUMP_BYTES)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        raise RunRecordError(str(e)) from e
    except ValueError as e:
        raise RunRecordError(f"{os.path.join(trainer_dir, rel)}: {type(e).__name__}") from e


def _short(module: str) -> str:
    from axlearn.common.experiment_registry import EXPERIMENTS_PACKAGE  # pylint: disable=C0415

    prefix = EXPERIMENTS_PACKAGE + "."
    return module[len(prefix) :] if module.startswith(prefix) else module


def _is_installed_experiment(module: str) -> bool:
    """Whether the module is one of axlearn's own experiments (code the user installed)."""
    from axlearn.common.experiment_registry import EXPERIMENTS_PACKAGE  # pylint: disable=C0415

    full = f"{EXPERIMENTS_PACKAGE}.{_short(module)}"
    try:
        spec = importlib.util.find_spec(full)  # Imports axlearn's packages only.
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.name.startswith(EXPERIMENTS_PACKAGE + ".")


def module_to_import(
    recorded: Any, named: Optional[str], *, source: str, module_file: Any = None
) -> str:
    """The experiment module to import for a run record: never one the user did not name.

    A record is a file in the run's directory, which others may have written: the module it
    names is imported (its code runs) only when it is the module named on the command line
    (`--module`: the recorded module, or the same module under another import path, i.e. the
    same last component), or one of axlearn's own installed experiments (`axlearn.experiments.*`).

    Args:
        recorded: The record's `module` value.
        named: The `--module` the user passed (None: none).
        source: The record's flags file (named in errors).
        module_file: The record's `module_file` (the file the module was imported from when the
            run trained), named in the fix; never imported.

    Returns:
        The module to import.

    Raises:
        RunRecordError: If the record names no module, or one the user did not name (one line
            naming the fix: pass --module).
    """
    if not isinstance(recorded, str) or not _MODULE_NAME.match(recorded):
        raise RunRecordError(f"{source} names no valid --module (field 'module').")
    if named is not None:
        if _short(named) != _short(recorded) and _last(named) != _last(recorded):
            raise RunRecordError(
                f"--module={named}, but {source} records the run's module as {recorded}: pass "
                f"--module={recorded} (the run's own experiment module)."
            )
        return named
    if _is_installed_experiment(recorded):
        return recorded
    if isinstance(module_file, str) and module_file.endswith(".py"):
        root = import_root(module_file, recorded)
        where = (
            f"it was imported from {module_file[:300]} when the run trained; add {root[:300]} to "
            f"PYTHONPATH: PYTHONPATH={root[:300]} axlearn ..."
        )
    else:
        where = "it must be importable: add its folder to PYTHONPATH"
    raise RunRecordError(
        f"{source} names the experiment module {recorded}, which is not one of axlearn's: a "
        "module named only by a file in the run's directory is never imported (its code would "
        f"run). If it is yours, pass --module={recorded} ({where}), or --module=MODULE naming "
        "it as it imports here."
    )


def _last(module: str) -> str:
    """The last component of a dotted module name."""
    return module.rsplit(".", 1)[-1]


def import_root(file: str, name: str) -> str:
    """The sys.path entry from which module `name` imported as `file` (its top package's parent).

    Args:
        file: The module's file.
        name: The module's dotted name.

    Returns:
        The directory to put on PYTHONPATH.
    """
    root = os.path.dirname(file)
    levels = name.count(".") + (os.path.basename(file) == "__init__.py")
    for _ in range(levels):
        root = os.path.dirname(root)
    return root
