"""Recording per-parameter settings (weight-decay scales, update scales, update types).

Optimizers and learners call `register_per_param_settings(tree, description=...)` when they
resolve a per-parameter setting. Normally that only logs (at vlog 1); inside
`collect_per_param_settings()` the registrations are also captured, so that an experiment can dump
them for review, e.g. as `_regularizer.txt` text with one `path: weight-decay scale` line per
parameter (see `per_param_settings_text` and `optimizers.regularizer_text`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from absl import logging

from axlearn.common.utils import flatten_items

# Descriptions used by this package.
WEIGHT_DECAY_SCALE = "weight_decay_scale"
L2_REGULARIZER_SCALE = "l2_regularizer_scale"
UPDATE_SCALE = "update_scale"
LEARNER_UPDATE_TYPE = "learner_update_type"


class _Collectors(threading.local):
    def __init__(self):
        super().__init__()
        self.stack: list[list[dict[str, Any]]] = []


_collectors = _Collectors()


def register_per_param_settings(
    settings: Any, *, description: str, path: Optional[str] = None
) -> Any:
    """Registers a tree of per-parameter settings.

    Args:
        settings: A tree with the parameters' structure whose leaves are the settings.
        description: What the settings are, e.g. "weight_decay_scale".
        path: Optional; where they were registered (e.g. a module path).

    Returns:
        `settings`, unchanged.
    """
    for records in _collectors.stack:
        records.append(dict(description=description, path=path, settings=settings))
    if logging.vlog_is_on(1):
        for param_path, value in flatten_items(settings):
            logging.info("Per-param setting %s (%s): %s=%s", description, path, param_path, value)
    return settings


@contextlib.contextmanager
def collect_per_param_settings() -> Iterator[list[dict[str, Any]]]:
    """Captures the registrations made inside the context.

    Yields:
        A list, filled as registrations happen, of dicts with keys "description", "path" and
        "settings".
    """
    records: list[dict[str, Any]] = []
    _collectors.stack.append(records)
    try:
        yield records
    finally:
        _collectors.stack.pop()


def per_param_settings_text(records: Sequence[dict[str, Any]], descriptions: Sequence[str]) -> str:
    """Formats captured registrations as `param/path: value` lines.

    Registrations of the same description with identical settings (e.g. one per traced call)
    are written once; distinct registrations are written in order, each preceded by a
    `# <description>` header line when more than one description or registration is present.

    Args:
        records: From `collect_per_param_settings`.
        descriptions: The descriptions to include.

    Returns:
        The text (lines joined by newlines, no trailing newline).
    """
    selected = []
    seen = []
    for record in records:
        if record["description"] not in descriptions:
            continue
        items = [(p, v) for p, v in flatten_items(record["settings"])]
        key = (record["description"], items)
        if key in seen:
            continue
        seen.append(key)
        selected.append((record["description"], items))
    lines = []
    for description, items in selected:
        if len(selected) > 1:
            lines.append(f"# {description}")
        lines.extend(f"{p}: {v}" for p, v in items)
    return "\n".join(lines)


def _is_empty_or_masked(value: Any) -> bool:
    """Whether a settings subtree is dropped from dumps (optax.MaskedNode or an empty dict)."""
    return type(value).__name__ == "MaskedNode" or (isinstance(value, dict) and not value)


def _prune(tree: Any) -> Any:
    """`tree` without MaskedNode leaves and without dicts that become empty (as AXLearn prunes)."""
    if isinstance(tree, dict):
        pruned = type(tree)()
        for k, v in tree.items():
            v = _prune(v)
            if not _is_empty_or_masked(v):
                pruned[k] = v
        return pruned
    return tree


def per_param_settings_golden_text(
    records: Sequence[dict[str, Any]], descriptions: Sequence[str]
) -> str:
    """Formats captured registrations as AXLearn's golden `_regularizer.txt` text.

    One block per (description, registration path), in order of first registration:

        ====================weight_decay_scale root.optimizer====================
        decoder/emb/token_emb/weight: 1
        ...

    A later registration of the same description and path replaces the earlier one; a
    registration without a path is keyed by its index among its description's registrations.
    Values print with `str` (the default scale is the int 1, rule scales are floats).

    Args:
        records: From `collect_per_param_settings`.
        descriptions: The descriptions to include (e.g. "weight_decay_scale",
            "l2_regularizer_scale").

    Returns:
        The text (lines joined by newlines, no trailing newline); empty when nothing matched.
    """
    by_description: dict[str, dict[str, Any]] = {}
    for record in records:
        settings = by_description.setdefault(record["description"], {})
        key = record.get("path") or str(len(settings))
        settings[key] = _prune(record["settings"])
    lines = []
    for description, by_path in by_description.items():
        if description not in descriptions:
            continue
        for path, settings in by_path.items():
            lines.append("=" * 20 + f"{description} {path}" + "=" * 20)
            lines.extend(f"{name}: {value}" for name, value in flatten_items(settings))
    return "\n".join(lines)
