"""Tree helpers of `axlearn.common.utils` (AXLearn's names): merging, copying, cycles, VDicts.

Import them from `axlearn.common.utils`; this module only keeps `utils.py` short.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional, Union

import attr
import jax
import numpy as np
from jax.sharding import PartitionSpec

from axlearn.common.config import ConfigBase, is_named_tuple

Tensor = jax.Array


def _key_name(key: Any) -> str:
    for attr_name in ("key", "idx", "name"):
        if hasattr(key, attr_name):
            return str(getattr(key, attr_name))
    return str(key)


def tree_paths(
    tree: Any, separator: str = "/", is_leaf: Optional[Callable[[Any], bool]] = None
) -> Any:
    """Returns a tree of the same structure as `tree` whose leaves are their paths.

    Example: `tree_paths({"a": 1, "b": [2, {"c": 3}]}) == {"a": "a", "b": ["b/0", {"c": "b/1/c"}]}`.
    None is structure (not a leaf) and is kept as None. Dicts, lists, tuples and named tuples
    are walked directly; other registered pytree nodes (dataclasses such as
    `flax_struct.PyTreeNode`) through JAX's keys (attribute names for dataclasses).

    Args:
        tree: A pytree.
        separator: Joins the keys of a path.
        is_leaf: Optional predicate: nodes for which it returns True are leaves.

    Returns:
        The tree of paths.
    """

    def join(prefix: str, key: Any) -> str:
        return f"{prefix}{separator}{key}" if prefix else f"{key}"

    def visit(node, prefix):
        if node is None:
            return None
        if is_leaf is not None and is_leaf(node):
            return prefix
        if isinstance(node, Mapping):
            return type(node)((k, visit(v, join(prefix, k))) for k, v in node.items())
        if is_named_tuple(node):
            return type(node)(**visit(node._asdict(), prefix))
        if isinstance(node, (list, tuple)):
            return type(node)([visit(v, join(prefix, i)) for i, v in enumerate(node)])
        flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
        if not flat or any(len(path) != 1 for path, _ in flat):
            return prefix
        return jax.tree_util.tree_unflatten(
            treedef, [visit(child, join(prefix, _key_name(path[0]))) for path, child in flat]
        )

    return visit(tree, "")


@jax.tree_util.register_pytree_with_keys_class
class VDict(dict):
    """A dict whose tensor leaves have a leading "vectorized" (stacked) axis, e.g. repeated layers.

    It flattens like a dict (keys sorted, paths of `DictKey`s, as JAX flattens a dict) but keeps
    its type through tree maps.
    """

    def __repr__(self):
        return f"VDict({super().__repr__()})"

    def tree_flatten_with_keys(self):
        keys = sorted(self.keys())
        return [(jax.tree_util.DictKey(k), self[k]) for k in keys], tuple(keys)

    @classmethod
    def tree_unflatten(cls, keys, values):
        return cls(zip(keys, values))


def pytree_children(node: Any) -> list[tuple[Any, Any]]:
    """Returns the (key, child) pairs one level below `node` in JAX's pytree view.

    Keys are JAX's path entries (`DictKey`, `SequenceKey`, `GetAttrKey`, `FlattenedIndexKey`).

    Args:
        node: Any pytree node or leaf.

    Returns:
        The children of `node`; [] for a leaf or an empty container.
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [(path[0], child) for path, child in flat if len(path) == 1]


def find_cycles(tree: Any) -> dict[str, list]:
    """Finds a reference cycle in a tree (a node that contains itself).

    Args:
        tree: A pytree, possibly with shared or cyclic references.

    Returns:
        {} when there is no cycle, otherwise dict(ancestor=path, descendant=path): the key paths
        (lists of JAX path entries) of a node and of its descendant that is the same object.
    """
    stack_ids: dict[int, list] = {}

    def visit(node: Any, path: list) -> Optional[dict[str, list]]:
        stack_ids[id(node)] = path
        try:
            for key, child in pytree_children(node):
                child_path = path + [key]
                if id(child) in stack_ids:
                    return dict(ancestor=stack_ids[id(child)], descendant=child_path)
                found = visit(child, child_path)
                if found:
                    return found
        finally:
            del stack_ids[id(node)]
        return None

    return visit(tree, []) or {}


def expand_vdicts(tree: Any) -> Any:
    """Replaces every non-empty `VDict` by the list of its slices along the leading axis.

    `VDict(a=[1, 2, 3])` becomes `[dict(a=1), dict(a=2), dict(a=3)]`; nested VDicts are
    expanded too.

    Args:
        tree: A tree of dicts/lists/tuples/VDicts whose VDict leaves are arrays.

    Returns:
        The expanded tree.

    Raises:
        ValueError: If a VDict holds a non-array leaf, a scalar, or leaves of different dim 0.
    """
    vdict = VDict
    if isinstance(tree, vdict):
        leaves = jax.tree.leaves(tree)
        if not leaves:
            return tree
        for leaf in leaves:
            if not isinstance(leaf, (jax.Array, np.ndarray)):
                raise ValueError(f"Expected a tree of Tensors, got {type(leaf)}: {leaf!r}")
            if leaf.ndim == 0:
                raise ValueError(f"Expected a tree of vectorized Tensors, got scalar {leaf!r}")
        dims = {leaf.shape[0] for leaf in leaves}
        if len(dims) != 1:
            raise ValueError(
                f"Expected a tree of vectorized Tensors of same dim 0, got dims {sorted(dims)}"
            )
        return [
            expand_vdicts(dict(jax.tree.map(lambda x, i=i: x[i], tree))) for i in range(dims.pop())
        ]
    if isinstance(tree, Mapping):
        return type(tree)((k, expand_vdicts(v)) for k, v in tree.items())
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(expand_vdicts(v) for v in tree)
    return tree


def _split_path(path: Union[str, Sequence[str]], separator: str) -> list[str]:
    if isinstance(path, str):
        return [p for p in path.split(separator) if p] if path else []
    return list(path)


def copy_recursively(
    *,
    source: Any,
    target: Optional[dict],
    path: Union[str, Sequence[str]],
    separator: str = "/",
    copy_fn: Callable[[Any], Any] = copy.deepcopy,
) -> Any:
    """Copies the subtree of `source` at `path` into `target` at the same path.

    Dicts missing (or not dicts) along the path in `target` are created; `target` is changed in
    place and returned. The copied value is `copy_fn(value)` (a deep copy by default), so
    mutating `target` afterwards does not change `source`.

    Args:
        source: A nested dict.
        target: The nested dict to copy into; None starts from {}.
        path: "a/b" (with `separator`) or ("a", "b"); "" or () copies all of `source`.
        separator: The separator of a string `path`.
        copy_fn: How the copied value is copied.

    Returns:
        `target` with the value set, or a copy of `source` when `path` is empty.

    Raises:
        KeyError: If `path` is not in `source`.
    """
    keys = _split_path(path, separator)
    if not keys:
        return copy_fn(source)
    value = source
    for i, key in enumerate(keys):
        if not isinstance(value, Mapping) or key not in value:
            raise KeyError(f"copy_recursively: {separator.join(keys[: i + 1])} not in source")
        value = value[key]
    if target is None:
        target = {}
    node = target
    for key in keys[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[keys[-1]] = copy_fn(value)
    return target


def _is_empty_leaf(x: Any) -> bool:
    return x is None or (isinstance(x, (tuple, list, dict)) and not x)


def non_empty_leaf_merge_fn(primary: Any, secondary: Any) -> Any:
    """Leaf merge for `tree_merge`: the non-empty one of two leaves (None, (), [] are empty).

    Args:
        primary: The leaf of the primary tree.
        secondary: The leaf of the secondary tree.

    Returns:
        The non-empty leaf; `primary` when both are empty.

    Raises:
        ValueError: If both leaves are non-empty.
    """
    if _is_empty_leaf(secondary):
        return primary
    if _is_empty_leaf(primary):
        return secondary
    raise ValueError(f"Cannot merge two non-empty leaves: primary={primary!r}, {secondary=!r}")


def tree_merge(primary: Any, *, secondary: Any, leaf_merge_fn: Callable[[Any, Any], Any]) -> Any:
    """Merges two trees of dicts: keys of both, values of shared keys merged recursively.

    Where both trees hold a dict (or VDict), the result is a dict of `primary`'s type with the
    union of keys; elsewhere the two values are merged by `leaf_merge_fn(primary, secondary)`.

    Args:
        primary: The first tree; its dict types are kept.
        secondary: The second tree.
        leaf_merge_fn: Merges two non-dict values (e.g. `non_empty_leaf_merge_fn`).

    Returns:
        The merged tree (inputs are not changed).

    Raises:
        ValueError: If one tree holds a dict where the other holds a non-empty leaf.
    """

    def merge(a: Any, b: Any, path: str) -> Any:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out = dict(a)
            for key, value in b.items():
                out[key] = merge(a[key], value, f"{path}/{key}") if key in a else value
            return type(a)(out)
        if isinstance(a, Mapping) or isinstance(b, Mapping):
            if b is None:
                return a
            if a is None:
                return b
            raise ValueError(
                f"tree_merge: at '{path or '/'}' one tree has a dict and the other a leaf: "
                f"primary={a!r}, secondary={b!r}"
            )
        return leaf_merge_fn(a, b)

    return merge(primary, secondary, "")


def _is_partition_leaf(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def complete_partition_spec_tree(treedef: Any, partition_spec_tree: Any) -> Any:
    """Expands a prefix tree of partition specs to the full tree structure `treedef`.

    Each leaf of `partition_spec_tree` (None, a PartitionSpec or any other non-container value,
    e.g. a ParameterSpec) is repeated over every leaf of the matching subtree.

    Args:
        treedef: The full tree's structure (`jax.tree_util.tree_structure(data)`).
        partition_spec_tree: A tree whose structure is a prefix of `treedef`.

    Returns:
        A tree with `treedef`'s structure whose leaves are the specs.
    """
    sentinel = object()
    full = jax.tree_util.tree_unflatten(treedef, [sentinel] * treedef.num_leaves)
    return jax.tree.map(
        lambda spec, subtree: jax.tree.map(lambda _: spec, subtree),
        partition_spec_tree,
        full,
        is_leaf=_is_partition_leaf,
    )


def check_param_shape_alignment(source_tree: Any, target_tree: Any) -> Optional[str]:
    """Compares the shapes of two trees of arrays dimension by dimension.

    Args:
        source_tree: A tree of arrays (or anything with `.shape`).
        target_tree: A tree with the same structure.

    Returns:
        None when all shapes agree, otherwise one line per differing dimension, e.g.
        "(linear1/weight/0) shape is different: source: (32), target: (15).".
    """
    paths = jax.tree.leaves(tree_paths(source_tree))
    errors = []
    for path, src, tgt in zip(paths, jax.tree.leaves(source_tree), jax.tree.leaves(target_tree)):
        src_shape, tgt_shape = tuple(np.shape(src)), tuple(np.shape(tgt))
        if len(src_shape) != len(tgt_shape):
            errors.append(f"({path}) rank is different: source: {src_shape}, target: {tgt_shape}.")
            continue
        for dim, (a, b) in enumerate(zip(src_shape, tgt_shape)):
            if a != b:
                errors.append(f"({path}/{dim}) shape is different: source: ({a}), target: ({b}).")
    return "\n".join(errors) if errors else None


def as_numpy_array(x: Any) -> Any:
    """Converts numbers, NumPy/JAX arrays and TF tensors (recursively in a tree) to NumPy.

    Args:
        x: A tree whose leaves are numbers or arrays.

    Returns:
        The same tree of `np.ndarray`s.

    Raises:
        NotImplementedError: For a leaf of another type.
    """

    def convert(leaf: Any) -> np.ndarray:
        if isinstance(leaf, np.ndarray):
            return leaf
        if isinstance(leaf, (int, float, bool, complex, np.generic, jax.Array)):
            return np.asarray(leaf)
        if type(leaf).__module__.startswith("tensorflow") and hasattr(leaf, "numpy"):
            return leaf.numpy()
        raise NotImplementedError(f"as_numpy_array: cannot convert {type(leaf)}: {leaf!r}")

    return jax.tree.map(convert, x)


def own_fields(cfg: ConfigBase) -> list[str]:
    """Returns the names of the fields `cfg`'s class declares itself (not inherited ones).

    Args:
        cfg: A config instance.

    Returns:
        The field names defined on `type(cfg)` and not on a parent config class.
    """
    return [field.name for field in attr.fields(type(cfg)) if not field.inherited]


def replace_layer_config_recursively(
    config: ConfigBase,
    *,
    target_cls: type,
    source_config: ConfigBase,
    exclude_keys: Optional[Sequence[str]] = None,
) -> list[str]:
    """Replaces, below `config`, every layer config of `target_cls` by a copy of `source_config`.

    The replacement keeps the replaced config's values of the fields both configs have, except
    `klass` and `exclude_keys` (those come from `source_config`). Replacements are searched
    recursively, inside replacements and inside list/tuple fields too.

    Args:
        config: The root config (changed in place; the root itself is never replaced).
        target_cls: The layer class whose configs are replaced (subclasses included).
        source_config: The config the replacements are copied from.
        exclude_keys: Field names not copied from the replaced configs.

    Returns:
        The paths ("a.b[0]") of the replaced configs.
    """
    exclude = set(exclude_keys or ()) | {"klass"}
    replaced = []

    def matches(value: Any) -> bool:
        klass = getattr(value, "klass", None)
        return (
            isinstance(value, ConfigBase)
            and isinstance(klass, type)
            and issubclass(klass, target_cls)
        )

    def substitute(value: ConfigBase) -> ConfigBase:
        new = source_config.clone()
        for key in value.keys():
            if key not in exclude and key in new:
                setattr(new, key, getattr(value, key))
        return new

    def visit(cfg: ConfigBase, path: str) -> None:
        for key in cfg.keys():
            value = getattr(cfg, key)
            child_path = f"{path}.{key}" if path else key
            if isinstance(value, (list, tuple)):
                items = list(value)
                for i, item in enumerate(items):
                    if matches(item):
                        items[i] = substitute(item)
                        replaced.append(f"{child_path}[{i}]")
                    if isinstance(items[i], ConfigBase):
                        visit(items[i], f"{child_path}[{i}]")
                setattr(cfg, key, type(value)(items))
            elif isinstance(value, ConfigBase):
                if matches(value):
                    value = substitute(value)
                    setattr(cfg, key, value)
                    replaced.append(child_path)
                visit(value, child_path)

    visit(config, "")
    return replaced


class MissingPathsError(KeyError, ValueError):
    """Paths an input must hold are missing (a KeyError, and a ValueError as in AXLearn)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def validate_contains_paths(x: Any, paths: Sequence[str]) -> None:
    """Raises `MissingPathsError` naming the missing paths if `x` lacks any of `paths`.

    Args:
        x: A nested dict (e.g. an input batch).
        paths: "/"-separated paths, e.g. ["prefix"] or ["inputs/input_ids"].

    Raises:
        MissingPathsError: (a KeyError and ValueError) If a path is missing.
    """
    missing = []
    for path in paths:
        node = x
        for part in path.split("/"):
            if not isinstance(node, Mapping) or part not in node:
                missing.append(path)
                break
            node = node[part]
    if missing:
        keys = sorted(x) if isinstance(x, Mapping) else type(x).__name__
        raise MissingPathsError(f"Input is missing required path(s) {missing}; it has keys {keys}.")
