"""Reading and removing the files of one step directory (shared by save, GC and recovery).

`read_manifest` reads what each process of a multi-process save left for process 0 to index,
refusing a bytes leaf whose file would lie outside the step directory; `remove_step_dir` removes
a step directory commit marker first, and a step "directory" that is a symbolic link as a link
only (never through it). Both go through `axlearn.common.file_access`: relative to a directory
descriptor, no link followed at any component, reads bounded.
"""

from __future__ import annotations

import errno
import os
import stat

from absl import logging

from axlearn.common import file_access
from axlearn.common.checkpointer import layout
from axlearn.common.path_containment import contained_relpath

# The most bytes a process's manifest may hold (its chunk checksums: ~20 bytes per chunk).
MAX_MANIFEST_BYTES = 256 << 20


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
    rel = f"{layout.MANIFESTS_DIR}/process_{process}.json"
    path = os.path.join(ckpt_dir, rel)
    with layout.open_step_dir(ckpt_dir) as step:
        manifest = file_access.read_json(
            step, rel, max_bytes=MAX_MANIFEST_BYTES, max_depth=layout.MAX_INDEX_DEPTH
        )
    if (
        not isinstance(manifest, dict)
        or not isinstance(manifest.get("bytes"), dict)
        or not isinstance(manifest.get("chunks"), dict)
    ):
        raise file_access.FileAccessError(
            path, "is not a manifest (a JSON object with 'chunks' and 'bytes' objects)"
        )
    for leaf, entry in manifest["bytes"].items():
        contained_relpath(
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
    parent, name = os.path.split(os.path.normpath(step_dir))
    parent = parent or "."
    try:
        st = file_access.lstat(parent, name)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        logging.warning("Removing the symbolic link %s only (its target is not touched).", step_dir)
        file_access.remove(parent, name)
        return
    try:
        file_access.remove(parent, f"{name}/{layout.INDEX_FILE}")
    except file_access.FileAccessError as e:
        if e.errno not in (errno.ENOENT, errno.ELOOP):
            raise
    file_access.rmtree(parent, name, missing_ok=True)
