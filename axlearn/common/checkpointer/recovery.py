"""What to restore when checkpoints are damaged: refuse, or set the damaged step aside.

The policy (docs/checkpoints.md, "Damaged checkpoints"):
- A step directory without an `index` is *uncommitted* (its save did not finish): it is skipped
  and later removed by garbage collection, as always; except when every chunk its `.zarray`
  files describe is present at full size (the save was interrupted just before its index, or
  the index was lost): then it is set aside as `step_%08d.unindexed-<UTC time>`, and garbage
  collection removes it only once newer steps have committed and the keep policy would not keep
  its step (`keep_last_n` counts it as if it were committed): a committed step whose index was
  lost is never deleted while it would be kept.
- A step directory whose `index` exists but cannot be read, or whose chunks fail their
  checksums, is *corrupt*. A corrupt checkpoint is never deleted. By default the trainer refuses
  to start, naming the file and the flags that choose what to do: `--restore_fallback=previous`
  (the checkpointer field `restore_fallback`) sets the corrupt directory aside as
  `step_%08d.corrupt-<UTC time>` and restores the newest older step that restores intact;
  `--restore_step=N` restores step N and sets every newer step directory aside as
  `step_%08d.superseded-<UTC time>`.
- A corrupt step is also one whose metadata disagrees with its index (`metadata.py`: a leaf
  missing from the index, a `.zarray` missing, unreadable or of another shape or dtype).
- When `--restore_fallback=previous` has set every step aside, restore is an error naming them:
  starting over from step 0 is a choice the user makes by moving them out of the directory.
- Set-aside directories no longer match `step_%08d`, so neither restore nor garbage collection
  ever touches them; `axlearn checkpoint list` shows them. Delete them by hand once inspected.
"""

from __future__ import annotations

import os
import re
import time
from typing import Optional

from absl import logging

from axlearn.common import file_access
from axlearn.common.checkpointer import layout, metadata, tensorstore_save
from axlearn.common.checkpointer.tensorstore_restore import CheckpointCorruptionError

# Values of `Checkpointer.Config.restore_fallback` / `--restore_fallback`.
FALLBACK_REFUSE = "none"
FALLBACK_PREVIOUS = "previous"
RESTORE_FALLBACKS = (FALLBACK_REFUSE, FALLBACK_PREVIOUS)

# Reasons a step directory is set aside (the suffix of its new name).
REASON_CORRUPT = "corrupt"
REASON_SUPERSEDED = "superseded"
REASON_UNINDEXED = "unindexed"

_SET_ASIDE_RE = re.compile(r"^step_(\d{8})\.(corrupt|superseded|unindexed)-[0-9TZ]+(\.\d+)?$")

_WHAT_TO_DO = (
    "Nothing was deleted. To restore the newest older step that is intact (setting this one "
    "aside as step_%08d.corrupt-<time>), pass --restore_fallback=previous (checkpointer field "
    "restore_fallback='previous'); to restore a chosen step, pass --restore_step=N (or run "
    "`axlearn checkpoint select DIR --step N`); `axlearn checkpoint verify DIR` checks every step."
)


class RestoreStepError(ValueError):
    """`--restore_step` names a step that is not a committed checkpoint of the directory."""


def restore_step_message(field: str, base_dir: str, step: int) -> str:
    """Why `--restore_step=step` cannot be restored, naming a set-aside copy of it if any.

    Args:
        field: The config path of `restore_step` (named in the message).
        base_dir: The checkpointer directory.
        step: The requested step.

    Returns:
        One line: the committed steps, and how to bring back a set-aside copy of `step`.
    """
    committed = [s for s, p in layout.step_dirs(base_dir) if layout.is_committed(p)]
    step_dir = os.path.join(base_dir, layout.step_dir_name(step))
    message = f"{field}={step} (--restore_step): {step_dir} is not a committed checkpoint"
    copies = [p for p in set_aside_dirs(base_dir) if _SET_ASIDE_RE.match(os.path.basename(p))]
    copies = [p for p in copies if int(_SET_ASIDE_RE.match(os.path.basename(p)).group(1)) == step]
    if copies:
        newest = copies[-1]
        reason = _SET_ASIDE_RE.match(os.path.basename(newest)).group(2)
        why = {
            REASON_SUPERSEDED: "by an earlier --restore_step of an older step",
            REASON_CORRUPT: "as corrupt (`axlearn checkpoint verify` on it says why)",
            REASON_UNINDEXED: "without its index (it cannot be restored)",
        }[reason]
        message += f"; it was set aside {why} as {newest} (nothing deleted)"
        if reason != REASON_UNINDEXED:
            message += (
                f": to restore it, move it back (mv {newest} {step_dir}) and rerun with "
                f"--restore_step={step}"
            )
    return f"{message}. Committed steps: {committed}."


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


def fallback_not_applied_message(step_dir: str, error: Exception) -> str:
    """The refusal of a multi-process run that has `--restore_fallback=previous` already.

    Chunk damage is found by the process that reads the chunk; the others cannot agree to fall
    back in the middle of a restore, so a multi-process run falls back only from an unreadable
    index (found by process 0 before reading). The message says so, instead of asking for the
    flag the run already has.

    Args:
        step_dir: The corrupt step directory.
        error: The `CorruptCheckpointError` (its first line names the damage).

    Returns:
        The message.
    """
    what = str(error).split("\n", 1)[0]
    return (
        f"{what}\n--restore_fallback=previous is set, but a multi-process run falls back only "
        "from an unreadable index, not from damage found while reading chunks (as here). "
        "Nothing was deleted. Choose the step to resume from: pass --restore_step=N of an older "
        f"step (or run `axlearn checkpoint select {os.path.dirname(step_dir)} --step N`; "
        f"`axlearn checkpoint verify {os.path.dirname(step_dir)}` shows which steps are intact)."
    )


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def set_aside(step_dir: str, *, reason: str) -> str:
    """Renames `step_dir` to `<step_dir>.<reason>-<UTC time>` (never deletes anything).

    Args:
        step_dir: A `step_%08d` directory.
        reason: "corrupt", "superseded" (logged as info: the user chose it) or "unindexed".

    Returns:
        The new path.
    """
    parent, name = os.path.split(os.path.normpath(step_dir))
    parent = parent or "."
    base = f"{name}.{reason}-{_utc_stamp()}"
    new_name, n = base, 0
    with file_access.RunDir(parent) as root:
        while file_access.exists(root, new_name):
            n += 1
            new_name = f"{base}.{n}"
        # By the directory's descriptor: a link at either name is moved, never followed.
        file_access.rename(root, name, new_name)
        try:
            os.fsync(root.fd)
        except OSError:  # Some filesystems cannot fsync a directory; the rename still happened.
            pass
    new_path = os.path.join(parent, new_name)
    # A supersede is the user's choice (info); a lost index is recovered from (warning).
    log = {REASON_SUPERSEDED: logging.info, REASON_UNINDEXED: logging.warning}.get(
        reason, logging.error
    )
    log(
        "Checkpoint directory %s set aside as %s (%s; nothing deleted).", step_dir, new_path, reason
    )
    return new_path


def set_aside_dirs(base_dir: str) -> list[str]:
    """Returns the set-aside (corrupt or superseded) directories under `base_dir`, sorted.

    Args:
        base_dir: The checkpointer directory.

    Returns:
        Their paths.
    """
    try:
        root = file_access.RunDir(base_dir)
    except file_access.FileAccessError:
        return []
    with root:
        return sorted(
            os.path.join(base_dir, n)
            for n in file_access.listdir(root)
            if _SET_ASIDE_RE.match(n) and file_access.is_dir(root, n)
        )


def kept_as_if_committed(
    step: int,
    committed: list[int],
    *,
    keep_last_n: int,
    keep_every_n_steps: Optional[int] = None,
) -> bool:
    """Whether garbage collection would keep `step` if it were committed.

    An unindexed step (its index lost after the save, or a save cut just before its index) may
    be a committed step: it is kept exactly as long as the keep policy would keep its step.

    Args:
        step: The step of an unindexed directory.
        committed: The committed steps of the directory.
        keep_last_n: `Checkpointer.Config.keep_last_n`.
        keep_every_n_steps: `Checkpointer.Config.keep_every_n_steps`.

    Returns:
        True if `step` is among the newest `keep_last_n` of `committed` plus itself, or a
        multiple of `keep_every_n_steps`.
    """
    if keep_every_n_steps and step % keep_every_n_steps == 0:
        return True
    return sum(1 for s in committed if s > step) < keep_last_n


def remove_unindexed_older_than(
    base_dir: str,
    step: int,
    *,
    keep_last_n: int = 1,
    keep_every_n_steps: Optional[int] = None,
) -> list[str]:
    """Removes the `step_%08d.unindexed-<time>` directories the keep policy no longer keeps.

    A save interrupted after its chunks but before its index looks like a step whose index was
    lost: restore and garbage collection set it aside rather than delete it. It is removed only
    once a newer step has committed *and* the keep policy would not keep its step if it were
    committed (`kept_as_if_committed`): a committed step that lost its index is never deleted
    while `keep_last_n` would keep it. Removal never follows a link (a linked one is removed
    as a link).

    Args:
        base_dir: The checkpointer directory.
        step: The newest committed step.
        keep_last_n: `Checkpointer.Config.keep_last_n`.
        keep_every_n_steps: `Checkpointer.Config.keep_every_n_steps`.

    Returns:
        The directories removed.
    """
    removed = []
    committed = [s for s, p in layout.step_dirs(base_dir) if layout.is_committed(p)]
    for path in set_aside_dirs(base_dir):
        match = _SET_ASIDE_RE.match(os.path.basename(path))
        if match.group(2) != REASON_UNINDEXED or int(match.group(1)) >= step:
            continue
        if kept_as_if_committed(
            int(match.group(1)),
            committed,
            keep_last_n=keep_last_n,
            keep_every_n_steps=keep_every_n_steps,
        ):
            continue
        logging.info(
            "Removing %s: newer steps have committed and the keep policy (keep_last_n=%d) "
            "would not keep its step.",
            path,
            keep_last_n,
        )
        try:
            tensorstore_save.remove_step_dir(path)
            removed.append(path)
        except OSError as e:
            logging.warning("Failed to remove %s: %s", path, e)
    return removed


def choose_restore_step(base_dir: str, *, fallback: Optional[str]) -> Optional[int]:
    """Returns the newest step to restore under `base_dir`, applying the corruption policy.

    Uncommitted directories are skipped with a warning (set aside if their chunks are complete).
    A committed directory whose index is unreadable raises `CorruptCheckpointError` (fallback
    "none"/None), or is set aside and the next older one considered (fallback "previous").

    Args:
        base_dir: The checkpointer directory.
        fallback: `restore_fallback`.

    Returns:
        The step, or None if there is no committed checkpoint and none was set aside as corrupt.

    Raises:
        CorruptCheckpointError: On a corrupt index, unless falling back; if no committed step is
            left and some were set aside as corrupt (naming them).
    """
    for step, path in reversed(layout.step_dirs(base_dir)):
        if not layout.is_committed(path):
            if metadata.chunks_complete(path):
                logging.warning(
                    "Checkpoint %s has no %s file but every chunk of its arrays is present: its "
                    "index was lost after the save. It cannot be restored without the index; "
                    "setting it aside (nothing deleted).",
                    path,
                    layout.INDEX_FILE,
                )
                set_aside(path, reason=REASON_UNINDEXED)
                continue
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
            set_aside(path, reason=REASON_CORRUPT)
            continue
        return step
    corrupt = [p for p in set_aside_dirs(base_dir) if f".{REASON_CORRUPT}-" in os.path.basename(p)]
    if corrupt:
        raise CorruptCheckpointError(
            f"No intact checkpoint is left under {base_dir}: set aside as corrupt: "
            f"{[os.path.basename(p) for p in corrupt]} (nothing deleted). Starting over is your "
            "choice: move those directories out of it (or pass another --trainer_dir) to train "
            "from step 0; `axlearn checkpoint verify` on one shows what is wrong with it."
        )
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
    return [
        set_aside(p, reason=REASON_SUPERSEDED) for s, p in layout.step_dirs(base_dir) if s > step
    ]
