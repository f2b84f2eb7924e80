"""Helpers for checkpointer tests that damage a saved step's index on purpose."""

from __future__ import annotations

import json
import os
from typing import Callable

from axlearn.common.checkpointer import layout


def our_index_path(step_dir: str) -> str:
    """The file holding our index of a step: `manifest.json` (format 2), else `index` (1)."""
    manifest = os.path.join(step_dir, layout.MANIFEST_FILE)
    return manifest if os.path.exists(manifest) else os.path.join(step_dir, layout.INDEX_FILE)


def edit_our_index(step_dir: str, edit: Callable[[dict], None]) -> None:
    """Applies `edit` to our index of a saved step and rewrites both index files consistently.

    The damage lands in our index (`manifest.json`) and AXLearn's list `index` is regenerated
    from it, as a writer that got its state wrong would leave them: the two files agree, so what
    a test sees is the damage itself, not their disagreement.

    Args:
        step_dir: A committed step directory.
        edit: Called with our index (a dict) to change it in place.
    """
    path = our_index_path(step_dir)
    with open(path, encoding="utf-8") as f:
        index = json.load(f)
    edit(index)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(index, f)
    if path.endswith(layout.MANIFEST_FILE):
        with open(os.path.join(step_dir, layout.INDEX_FILE), "w", encoding="utf-8") as f:
            json.dump(layout.axlearn_index_pairs(index), f)
