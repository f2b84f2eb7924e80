"""What to restore when checkpoints are damaged: refuse, or set the damaged step aside.

The policy (docs/checkpoints.md, "Damaged checkpoints"):
- A step directory without an `index` is *uncommitted* (its save did not finish): it is skipped
  and later removed by garbage collection, as always.
- A step directory whose `index` exists but cannot be read, or whose chunks fail their
  checksums, is *corrupt*. A corrupt checkpoint is never deleted. By default the trainer refuses
  to start, naming the file and the flags that choose what to do: `--restore_fallback=previous`
  (the checkpointer field `restore_fallback`) sets the corrupt directory aside as
  `step_%08d.corrupt-<UTC time>` and restores the newest older step that restores intact;
  `--restore_step=N` restores step N and sets every newer step directory aside as
  `step_%08d.superseded-<UTC time>`.
- Set-aside directories no longer match `step_%08d`, so neither restore nor garbage collection
  ever touches them; `axlearn checkpoint list` shows them. Delete them by hand once inspected.
"""

from __future__ import annotations

import os
import re
import time
from typing import Optional

from absl import logging

from axlearn.common.checkpointer import layout
from axlearn.common.checkpointer.tensorstore_restore import CheckpointCorruptionError

# Values of `Checkpointer.Config.restore_fallback` / `--restore_fallback`.
FALLBACK_REFUSE = "none"
FALLBACK_PREVIOUS = "previous"
RESTORE_FALLBACKS = (FALLBACK_REFUSE, FALLBACK_PREVIOUS)

_SET_ASIDE_RE = re.compile(r"^step_(\d{8})\.(corrupt|superseded)-[0-9TZ]+(\.\d+)?$")

_WHAT_TO_DO = (
    "Nothing was deleted. To restore the newest older step that is intact (setting this one "
    "aside as step_%08d.corrupt-<time>), pass --restore_fallback=previous (checkpointer field "
    "restore_fallback='previous'); to restore a chosen step, pass --restore_step=N (or run "
    "`axlearn checkpoint select DIR --step N`); `axlearn checkpoint verify DIR` checks every step."
)


class CorruptCheckpointError(CheckpointCorruptionError):
    """A committed checkpoint (its `index` exists) is unreadable or fails its checksums."""


def corrupt_message(step_dir: str, error: Exception) -> str:
    """The refusal message for a corrupt `step_dir`: what is wrong and the flags to choose.

    Args:
        step_dir: The corrupt step directory.
        error: What is wrong with it.

    Returns:
        The message.
    """
    return f"Checkpoint {step_dir} is corrupt: {error}\n{_WHAT_TO_DO}"


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def set_aside(step_dir: str, *, reason: str) -> str:
    """Renames `step_dir` to `<step_dir>.<reason>-<UTC time>` (never deletes anything).

    Args:
        step_dir: A `step_%08d` directory.
        reason: "corrupt" or "superseded".

    Returns:
        The new path.
    """
    base = f"{step_dir.rstrip('/')}.{reason}-{_utc_stamp()}"
    new_path, n = base, 0
    while os.path.exists(new_path):
        n += 1
        new_path = f"{base}.{n}"
    os.rename(step_dir, new_path)
    parent = os.path.dirname(new_path) or "."
    try:
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # Some filesystems cannot fsync a directory; the rename still happened.
        pass
    logging.error("Checkpoint directory %s set aside as %s (%s).", step_dir, new_path, reason)
    return new_path


def set_aside_dirs(base_dir: str) -> list[str]:
    """Returns the set-aside (corrupt or superseded) directories under `base_dir`, sorted.

    Args:
        base_dir: The checkpointer directory.

    Returns:
        Their paths.
    """
    try:
        names = os.listdir(base_dir)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(base_dir, n) for n in names if _SET_ASIDE_RE.match(n))


def choose_restore_step(base_dir: str, *, fallback: Optional[str]) -> Optional[int]:
    """Returns the newest step to restore under `base_dir`, applying the corruption policy.

    Uncommitted directories are skipped with a warning. A committed directory whose index is
    unreadable raises `CorruptCheckpointError` (fallback "none"/None), or is set aside and the
    next older one considered (fallback "previous").

    Args:
        base_dir: The checkpointer directory.
        fallback: `restore_fallback`.

    Returns:
        The step, or None if no committed checkpoint remains.

    Raises:
        CorruptCheckpointError: On a corrupt index, unless falling back.
    """
    for step, path in reversed(layout.step_dirs(base_dir)):
        if not layout.is_committed(path):
            logging.warning(
                "Skipping uncommitted checkpoint %s (no %s file: its save did not finish).",
                path,
                layout.INDEX_FILE,
            )
            continue
        try:
            layout.read_index_file(path)
        except layout.CheckpointIndexError as e:
            if fallback != FALLBACK_PREVIOUS:
                raise CorruptCheckpointError(corrupt_message(path, e)) from e
            logging.error("Checkpoint %s is corrupt (%s); falling back to an older step.", path, e)
            set_aside(path, reason="corrupt")
            continue
        return step
    return None


def supersede_newer(base_dir: str, step: int) -> list[str]:
    """Sets aside every step directory newer than `step` (for a chosen `--restore_step`).

    A run resumed from an older step would otherwise collide with (and on its next restart
    resume from) the newer steps of the abandoned timeline.

    Args:
        base_dir: The checkpointer directory.
        step: The step being restored.

    Returns:
        The new paths of the directories set aside.
    """
    return [set_aside(p, reason="superseded") for s, p in layout.step_dirs(base_dir) if s > step]
