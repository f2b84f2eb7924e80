"""Partition specs inside `shard_map` regions whose mesh axes are partly Manual.

Inside `jax.shard_map(..., axis_names={"data"})` the "data" axis is Manual: sharding
constraints may only name the remaining (Auto) axes. `manual_axes_to_none` drops Manual axes
from a spec (for shard_map `in_specs`/`out_specs`); `_manual_axes_to_unconstrained` turns dims
that named only Manual axes into `PartitionSpec.UNCONSTRAINED` (for best-effort constraints, see
`utils.maybe_shard`). Both are re-exported by `axlearn.common.utils`.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec


def _manual_axes() -> tuple[frozenset, frozenset]:
    """(Manual axis names, all axis names) of the abstract mesh being traced."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return frozenset(), frozenset()
    return frozenset(getattr(mesh, "manual_axes", ()) or ()), frozenset(mesh.axis_names)


def _replace_manual(spec: PartitionSpec, manual: frozenset, replacement: Any) -> PartitionSpec:
    entries = []
    for entry in spec:
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            entries.append(entry)
            continue
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        kept = tuple(n for n in names if n not in manual)
        if not kept:
            entries.append(replacement)
        elif len(kept) == 1 and len(names) > 1:
            entries.append(kept[0])
        else:
            entries.append(entry if len(kept) == len(names) else kept)
    return PartitionSpec(*entries)


def manual_axes_to_none(spec: Any) -> Any:
    """Replaces the current mesh's Manual axes by None in a PartitionSpec (or a tree of them).

    Args:
        spec: A PartitionSpec, or a tree with PartitionSpec leaves.

    Returns:
        The spec(s) without Manual axes; unchanged outside a partly Manual mesh.
    """
    manual, _ = _manual_axes()
    if not manual:
        return spec
    return jax.tree.map(
        lambda s: _replace_manual(s, manual, None) if isinstance(s, PartitionSpec) else s,
        spec,
        is_leaf=lambda s: isinstance(s, PartitionSpec),
    )


def _manual_axes_to_unconstrained(spec: PartitionSpec) -> PartitionSpec:
    """Drops Manual axes from `spec`; a dim left with no axis becomes UNCONSTRAINED.

    None (replicated) and UNCONSTRAINED dims are kept. Without an abstract mesh, `spec` is
    returned unchanged.

    Raises:
        AssertionError: If every mesh axis is Manual (there is nothing left to constrain).
    """
    manual, axes = _manual_axes()
    if not axes:
        return spec
    assert manual != axes, f"All mesh axes {sorted(axes)} are Manual; nothing to constrain."
    return _replace_manual(spec, manual, PartitionSpec.UNCONSTRAINED)
