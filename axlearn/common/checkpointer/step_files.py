"""Reading and removing the files of one step directory (shared by save, GC and recovery).

`read_manifest` reads what each process of a multi-process save left for process 0 to index,
refusing a bytes leaf whose file would lie outside the step directory; `remove_step_dir` removes
a step directory commit marker first, and a step "directory" that is a symbolic link as a link
only (never through it).
"""

from __future__ import annotations

import json
import os
import shutil

from absl import logging

from axlearn.common.checkpointer import layout
from axlearn.common.path_containment import contained_path


def read_manifest(ckpt_dir: str, process: int) -> dict:
    """Reads the manifest process `process` left in `ckpt_dir/manifests/` (multi-process saves).

    The manifest is opened without following a link, and every bytes leaf `file` it names must
    stay inside `ckpt_dir` (`axlearn.common.path_containment`), before it reaches the index.

    Args:
        ckpt_dir: The step directory being saved.
        process: The process index.

    Returns:
        The manifest: {"chunks": {leaf: {chunk key: crc}}, "bytes": {leaf: {"file", ...}}}.

    Raises:
        PathContainmentError: If a bytes leaf's file is outside `ckpt_dir` (naming the manifest,
            the leaf and the rule).
        OSError: If the manifest is missing or a symbolic link.
    """
    path = os.path.join(ckpt_dir, layout.MANIFESTS_DIR, f"process_{process}.json")
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        manifest = json.loads(f.read().decode("utf-8"))
    for leaf, entry in manifest["bytes"].items():
        contained_path(
            ckpt_dir,
            entry.get("file") if isinstance(entry, dict) else None,
            source=path,
            what=f"bytes leaf {leaf!r:.200}",
        )
    return manifest


def remove_step_dir(step_dir: str) -> None:
    """Removes a step directory, its commit marker first (so a half-removed one is uncommitted).

    A step "directory" that is a symbolic link is removed as a link: nothing is removed through
    it (its target may be another run's step).

    Args:
        step_dir: The directory.
    """
    if os.path.islink(step_dir):
        logging.warning("Removing the symbolic link %s only (its target is not touched).", step_dir)
        os.unlink(step_dir)
        return
    index_path = os.path.join(step_dir, layout.INDEX_FILE)
    try:
        os.remove(index_path)
    except FileNotFoundError:
        pass
    shutil.rmtree(step_dir, ignore_errors=True)
    if os.path.exists(step_dir):
        shutil.rmtree(step_dir)  # Raise the error this time.
