"""Common tree, sharding and misc utilities shared by modules, layers, learners and trainers.

Trees here are nested dicts (and lists/tuples) of arrays. Paths join keys with "/" by default,
e.g. `decoder/emb/token_emb/weight`, the form used by regex rules in configs.

This module imports jax but neither TensorFlow nor seqio.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import (
    Any,
    Callable,
    Collection,
    Optional,
    Protocol,
    TypeVar,
    Union,
    runtime_checkable,
)

import jax
import numpy as np
from jax import numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common import utils_data
from axlearn.common.utils_data import (  # noqa: F401
    DataPartitionType,
    StackedKeyArray,
    cast_floats_per_param,
    current_mesh,
    host_to_global_device_array,
    host_to_global_specs,
    input_partition_spec,
    replicate_to_local_data,
    runtime_checks,
    split_prng_key,
)

# Dtype and mask helpers live in utils_dtypes and utils_masks (kept apart for length), re-exported.
from axlearn.common.utils_dtypes import validate_float_dtype  # noqa: F401
from axlearn.common.utils_manual import (  # noqa: F401
    _manual_axes,
    _manual_axes_to_unconstrained,
    manual_axes_to_none,
)
from axlearn.common.utils_masks import safe_not, sequence_mask  # noqa: F401

# AXLearn keeps its remat policies in `utils`; ours live in utils_remat and are re-exported here.
from axlearn.common.utils_remat import (  # noqa: F401
    SavePattern,
    combine_remat_policies,
    default_remat_combine_fn,
    extended_checkpoint_policies,
    offload_dots_saveable,
    save_and_offload_only_these_names_regex,
)

# AXLearn keeps its mesh helpers in `utils`; ours live in utils_spmd and are re-exported here.
from axlearn.common.utils_spmd import (  # noqa: F401
    HybridMeshShape,
    MeshShape,
    create_device_mesh,
    infer_mesh_shape,
)
from axlearn.common.utils_tree import (  # noqa: F401
    VDict,
    as_numpy_array,
    check_param_shape_alignment,
    complete_partition_spec_tree,
    copy_recursively,
    expand_vdicts,
    find_cycles,
    non_empty_leaf_merge_fn,
    own_fields,
    pytree_children,
    replace_layer_config_recursively,
    tree_merge,
    tree_paths,
    validate_contains_paths,
)

Tensor = jax.Array
T = TypeVar("T")
# A nested structure (dicts/lists/tuples) whose leaves are of type T. `Nested[Tensor]`.
Nested = Union[T, dict[str, Any], list, tuple]
NestedTree = Union[Any, dict[str, Any]]
NestedTensor = Union[Tensor, dict[str, Any]]
NestedPartitionSpec = Optional[Union[PartitionSpec, dict[str, Any]]]

__all__ = [
    "DeviceUsage",
    "HybridMeshShape",
    "MeshShape",
    "Nested",
    "PerParamFn",
    "NestedPartitionSpec",
    "NestedTensor",
    "NestedTensorSpec",
    "PartitionSpec",
    "Tensor",
    "TensorSpec",
    "VDict",
    "check_numerics",
    "create_device_mesh",
    "safe_not",
    "sequence_mask",
    "validate_float_dtype",
    "get_data_dir",
    "infer_mesh_shape",
    "numeric_checks",
    "per_param_dtype_by_path",
    "pop_data_dir",
    "push_data_dir",
    "set_data_dir",
]


@dataclasses.dataclass
class DeviceUsage:
    """One device's usage, as a `monitoring.device_monitor` client reads it (None: not read)."""

    # The device's index on its host.
    device_id: int
    # Percent of the sampling period the device was busy (0-100).
    device_duty_cycle_percent: Optional[float] = None
    # Fraction of the device's compute in use (0-1).
    device_utilization: Optional[float] = None
    # Bytes of device memory in use.
    hbm_memory_usage_bytes: Optional[int] = None
    # Bytes of device memory in all.
    hbm_memory_total_bytes: Optional[int] = None
    # Fraction of the device memory's bandwidth in use (0-1).
    hbm_memory_bandwidth_utilization: Optional[float] = None


@dataclasses.dataclass
class TensorSpec:
    """Specification of a tensor: shape, dtype and how it is partitioned over the mesh.

    A dataclass (not a pytree node), so `jax.tree.map` treats it as a leaf.
    """

    # The tensor shape.
    shape: Sequence[int]
    # The dtype; None means "the owner's default".
    dtype: Optional[Any] = None
    # The partition spec: None (replicated) or a PartitionSpec/sequence with one entry per axis.
    mesh_axes: Optional[PartitionSpec] = None
    # The memory the tensor lives in ("device", "pinned_host"); None: the default (device).
    memory_kind: Optional[str] = None

    @property
    def sharding(self) -> NamedSharding:
        """The NamedSharding of this spec on the current mesh (see `current_mesh`)."""
        mesh = current_mesh()
        if mesh is None:
            raise ValueError("TensorSpec.sharding needs a mesh: call inside `with mesh:`.")
        return NamedSharding(mesh, PartitionSpec(*(self.mesh_axes or ())))


NestedTensorSpec = Optional[Union[TensorSpec, dict[str, Any]]]


# --------------------------------------------------------------------------------------------
# Trees and paths.
# --------------------------------------------------------------------------------------------


def _concat_path(prefix: str, key: Any, separator: str) -> str:
    return f"{prefix}{separator}{key}" if prefix else f"{key}"


def flatten_items(
    tree: NestedTree, separator: str = "/", is_leaf: Optional[Callable[[Any], bool]] = None
) -> list[tuple[str, Any]]:
    """Flattens `tree` into a list of (path, leaf) pairs, in `jax.tree_util` leaf order.

    Args:
        tree: A nested structure.
        separator: Joins the keys of a path.
        is_leaf: Optional predicate: nodes for which it returns True are leaves.

    Returns:
        The (path, value) pairs.
    """
    keyed, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [(separator.join(_key_str(k) for k in path), value) for path, value in keyed]


def _key_str(key: Any) -> str:
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return str(key.name)
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def shapes(nested_tensor: NestedTree) -> NestedTree:
    """Returns a tree of the same structure with each array replaced by its shape.

    Args:
        nested_tensor: A tree of arrays (or ShapeDtypeStructs).

    Returns:
        The tree of shapes (tuples); non-array leaves are kept.
    """
    return jax.tree.map(lambda x: getattr(x, "shape", x), nested_tensor)


def get_recursively(
    x: NestedTree, path: Union[str, Sequence[str]], separator: str = "/"
) -> NestedTree:
    """Returns `x[k1][k2]...` for the keys of `path`.

    Args:
        x: A nested dict.
        path: "a/b/c" (split on `separator`) or a sequence of keys; empty returns `x`.
        separator: The separator of a string path.

    Returns:
        The subtree at `path`.

    Raises:
        KeyError: If a key is missing; the message names the path up to that key.
    """
    if not path:
        return x
    keys = path.split(separator) if isinstance(path, str) else list(path)
    for i, key in enumerate(keys):
        if not isinstance(x, Mapping) or key not in x:
            raise KeyError(f"No entries found at path '{separator.join(map(str, keys[: i + 1]))}'")
        x = x[key]
    return x


def set_recursively(
    x: NestedTree, *, value: Any, path: Union[str, Sequence[str]], separator: str = "/"
) -> None:
    """Sets `x[k1][k2]...[kn] = value`, creating intermediate dicts as needed.

    Args:
        x: A nested dict (modified in place).
        value: The value to set.
        path: "a/b/c" or a sequence of keys; must not be empty.
        separator: The separator of a string path.

    Raises:
        ValueError: If `path` is empty.
    """
    if not path:
        raise ValueError("path must not be empty")
    keys = path.split(separator) if isinstance(path, str) else list(path)
    for key in keys[:-1]:
        x = x.setdefault(key, {})
    x[keys[-1]] = value


def get_or_none(x: Optional[Mapping], key: Any) -> Any:
    """Returns `x.get(key)`, or None when `x` is None."""
    return None if x is None else x.get(key)


def prune_tree(
    in_tree: NestedTree,
    should_prune: Callable[[str, NestedTree], bool],
    prefix: str = "",
    separator: str = "/",
):
    """Returns a shallow copy of `in_tree` without the dict entries for which `should_prune` holds.

    Args:
        in_tree: A nested dict.
        should_prune: Called with (path, subtree) after the subtree itself was pruned; True drops
            the entry.
        prefix: Path of `in_tree` (used in recursion).
        separator: Joins the keys of a path.

    Returns:
        The pruned tree.
    """
    if isinstance(in_tree, dict):
        out = type(in_tree)()
        for k, v in in_tree.items():
            path = _concat_path(prefix, k, separator)
            v = prune_tree(v, should_prune, prefix=path, separator=separator)
            if not should_prune(path, v):
                out[k] = v
        return out
    return in_tree


def prune_empty(in_tree: NestedTree) -> NestedTree:
    """Returns a copy of `in_tree` with empty dicts (recursively) removed."""
    return prune_tree(in_tree, lambda _, v: isinstance(v, dict) and not v)


def count_model_params(tree: NestedTree) -> int:
    """Returns the total number of elements over all array (or spec) leaves of `tree`."""
    return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree_util.tree_leaves(tree)))


def match_regex_rules(
    x: str, *, rules: Sequence[tuple[str, T]], default_value: Optional[T] = None
) -> Optional[T]:
    """Returns the value of the first rule whose regex fully matches `x`.

    Args:
        x: The string (usually a parameter path) to match.
        rules: (regex, value) pairs, tried in order.
        default_value: Returned when no rule matches.

    Returns:
        The matched value or `default_value`.
    """
    for regex, value in rules:
        if re.fullmatch(regex, x):
            return value
    return default_value


@runtime_checkable
class PerParamFn(Protocol[T]):
    """A callable mapping a tree of parameters (or their specs) to one value per parameter."""

    def __call__(self, params: Union[NestedTensor, NestedTree]) -> Nested[T]: ...


def per_param_dtype_by_path(
    default_dtype: Optional[Any] = None,
    *,
    update_rules: Optional[Sequence[tuple[str, Optional[Any]]]] = None,
) -> PerParamFn:
    """Returns a function giving each parameter a dtype by regex rules on its path (AXLearn's).

    Example: with `default_dtype=jnp.float32, update_rules=[(".*/bias", jnp.bfloat16)]`, the
    returned function maps `{"w": ..., "b": {"bias": ...}}` to
    `{"w": jnp.float32, "b": {"bias": jnp.bfloat16}}`.

    Args:
        default_dtype: The dtype of a parameter no rule matches; None keeps the parameter's own
            dtype (the per-parameter value is None).
        update_rules: (regex, dtype) pairs; the first regex that fully matches a parameter's
            path ("a/b/c") gives its dtype.

    Returns:
        A function from a tree of parameters or `TensorSpec`s to the same tree of dtypes.
    """

    def fn(tree: Union[NestedTensor, NestedTree]) -> NestedTree:
        return jax.tree.map(
            lambda path: match_regex_rules(
                path, rules=update_rules or (), default_value=default_dtype
            ),
            tree_paths(tree),
        )

    return fn


def canonicalize_per_param_dtype(dtype: Any) -> Any:
    """Turns a dtype (or None) into a config of a `PerParamFn` giving that dtype to every param.

    Args:
        dtype: None, a dtype, or already a per-param function / its config.

    Returns:
        A config (or function) that instantiates to a `PerParamFn`.
    """
    if dtype is None or isinstance(dtype, (type, np.dtype)) or hasattr(dtype, "dtype"):
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.config import config_for_function

        return config_for_function(per_param_dtype_by_path).set(default_dtype=dtype)
    return dtype


def data_partition_type_to_spec(partition: Any) -> Any:
    """Resolves a `DataPartitionType` (or spec, or tree of specs) to partition spec(s).

    `DataPartitionType.FULL` calls this module's `input_partition_spec` (so patching
    `axlearn.common.utils.input_partition_spec` applies); the rest is `utils_data`'s.

    Args:
        partition: `DataPartitionType.FULL`, `DataPartitionType.REPLICATED`, a PartitionSpec, or a
            dict tree of PartitionSpecs.

    Returns:
        The PartitionSpec (or the tree of them, unchanged).
    """
    if partition == DataPartitionType.FULL:
        return input_partition_spec()
    return utils_data.data_partition_type_to_spec(partition)


# --------------------------------------------------------------------------------------------
# Numeric checks.
# --------------------------------------------------------------------------------------------

_numeric_checks_state = {"enabled": False}


@contextlib.contextmanager
def numeric_checks(enabled: bool = True):
    """Context in which `check_numerics` asserts and JAX raises on NaNs (`jax_debug_nans`).

    The previous state (of both) is restored on exit, also when the body raises.

    Args:
        enabled: Whether checks are on inside the context.

    Yields:
        None.
    """
    previous = (_numeric_checks_state["enabled"], jax.config.jax_debug_nans)
    _numeric_checks_state["enabled"] = enabled
    jax.config.update("jax_debug_nans", enabled)
    try:
        yield
    finally:
        _numeric_checks_state["enabled"] = previous[0]
        jax.config.update("jax_debug_nans", previous[1])


def check_numerics(x: Tensor, msg_fmt: str = "", **msg_kwargs) -> Tensor:
    """Returns `x`; inside `numeric_checks()`, first asserts that every element is finite.

    Args:
        x: The tensor (concrete: the check reads its values).
        msg_fmt: A format string for the failure message, filled with `msg_kwargs`.
        **msg_kwargs: Values for `msg_fmt`.

    Returns:
        `x`.

    Raises:
        AssertionError: Inside `numeric_checks()`, if `x` has a NaN or infinity.
    """
    if _numeric_checks_state["enabled"] and not bool(jnp.isfinite(x).all()):
        raise AssertionError(f"Check numerics {msg_fmt.format(**msg_kwargs)}: {x}")
    return x


def all_finite(tree: Any) -> Tensor:
    """Whether every float leaf of `tree` holds only finite values (no NaN, no infinity).

    The one home of this check: the trainer (before saves), the learner (skipping non-finite
    steps) and `skip_and_clip_by_global_norm` use it. Works inside and outside jit.

    Args:
        tree: A tree of arrays; leaves of integer or boolean dtype are always finite.

    Returns:
        A scalar boolean array (True for a tree without float leaves).
    """
    leaves = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    if not leaves:
        return jnp.array(True)
    return jnp.all(jnp.stack(leaves))


# --------------------------------------------------------------------------------------------
# Data dir.
# --------------------------------------------------------------------------------------------


class _DataDirStack(threading.local):
    """The per-thread stack of `set_data_dir` values."""

    def __init__(self):
        super().__init__()
        self.stack: list[Optional[str]] = []


_data_dir_stack = _DataDirStack()


def push_data_dir(data_dir: Optional[str]) -> None:
    """Makes `data_dir` the innermost data dir of this thread (pair with `pop_data_dir`).

    Args:
        data_dir: A data dir, "FAKE" or None.
    """
    _data_dir_stack.stack.append(data_dir)


def pop_data_dir() -> Optional[str]:
    """Removes and returns the innermost data dir pushed by `push_data_dir`/`set_data_dir`.

    Returns:
        The removed data dir.
    """
    return _data_dir_stack.stack.pop()


@contextlib.contextmanager
def set_data_dir(data_dir: Optional[str]):
    """Context in which `get_data_dir()` returns `data_dir` (AXLearn's semantics).

    Contexts nest. "FAKE" and None combine with anything; two different real dirs conflict.

    Args:
        data_dir: A data dir, "FAKE" (fake inputs) or None.

    Yields:
        None.

    Raises:
        ValueError: If `data_dir` conflicts with the data dir already in effect.
    """
    current = get_data_dir()
    if None not in (data_dir, current) and "FAKE" not in (data_dir, current):
        if data_dir != current:
            raise ValueError(
                f"set_data_dir conflict: data_dir={data_dir} but DATA_DIR={current} is already in "
                "effect; use one data dir (or FAKE) per run"
            )
    push_data_dir(data_dir)
    try:
        yield
    finally:
        pop_data_dir()


def get_data_dir() -> Optional[str]:
    """Returns the innermost `set_data_dir` value, else env `DATA_DIR` (`--data_dir`), else None.

    Returns:
        The data dir, "FAKE" (fake inputs), or None (inputs read their default data).
    """
    if _data_dir_stack.stack:
        return _data_dir_stack.stack[-1]
    return os.environ.get("DATA_DIR") or None


def partial_with_fn_metadata(fn: Callable, *args, **kwargs) -> Callable:
    """`functools.partial` that keeps `fn`'s name, docstring and other metadata."""
    partial_fn = functools.partial(fn, *args, **kwargs)
    return functools.update_wrapper(partial_fn, fn)


def as_tensor(x: Any) -> NestedTensor:
    """Converts numbers, NumPy arrays (recursively in a tree) to jax arrays."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (int, float, complex, np.ndarray, np.generic)):
        return jnp.asarray(x)
    if isinstance(x, (Mapping, list, tuple)):
        return jax.tree.map(as_tensor, x)
    if type(x).__module__.startswith("tensorflow") and hasattr(x, "numpy"):
        return jnp.asarray(x.numpy())
    raise NotImplementedError(f"Cannot convert {type(x)} to a Tensor: {x}")


def cast_floats(in_tree: NestedTensor, to_dtype: Optional[Any]) -> NestedTensor:
    """Casts every floating-point array leaf of `in_tree` to `to_dtype` (None: no cast).

    Args:
        in_tree: A tree of arrays.
        to_dtype: The target floating dtype, or None to return a copy of the tree.

    Returns:
        The cast tree; non-float leaves are unchanged.
    """
    if to_dtype is None:
        return jax.tree.map(lambda x: x, in_tree)

    def cast(x):
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(to_dtype)
        return x

    return jax.tree.map(cast, in_tree)


def check_jax_type(
    *,
    args: Sequence = (),
    kwargs: Optional[dict] = None,
    pretty_named_args: Optional[dict] = None,
    msg: str = "",
) -> None:
    """Raises ValueError if a leaf of the arguments is not a JAX/NumPy array or scalar.

    `pretty_named_args` ({name: value}) report as "Argument <name> has leaf with non-JAX type".
    """
    for name, value in (pretty_named_args or {}).items():
        for path, leaf in flatten_items(value):
            if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex)):
                where = f"{name}/{path}" if path else name
                raise ValueError(
                    f"Argument {where} has leaf with non-JAX type {type(leaf)}: {leaf!r}. {msg}"
                )
    for path, leaf in flatten_items(dict(args=list(args), kwargs=kwargs or {})):
        if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool, complex)):
            raise ValueError(f"{msg} Leaf {path} has non-JAX type {type(leaf)}: {leaf!r}")


# --------------------------------------------------------------------------------------------
# Meshes and shardings.
# --------------------------------------------------------------------------------------------


def _current_abstract_mesh():
    """The mesh visible while tracing (concrete or abstract), or None outside any mesh."""
    mesh = current_mesh()
    if mesh is not None:
        return mesh
    abstract = jax.sharding.get_abstract_mesh()
    if abstract is not None and not abstract.empty:
        return abstract
    return None


def with_sharding_constraint(x: Tensor, shardings: Any) -> Tensor:
    """`jax.lax.with_sharding_constraint` inside a mesh of more than one device; else a no-op.

    Args:
        x: A tensor (or tree).
        shardings: A PartitionSpec/NamedSharding (or a tree of them).

    Returns:
        `x`, constrained.
    """
    mesh = _current_abstract_mesh()
    if mesh is None or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, shardings)


# The key of the [physical_batch, logical_batch] bool dispatch tensor that
# `input_dispatch.InputDispatcher.logical_to_physical_batch` adds to a physical input batch.
PHYSICAL_TO_LOGICAL_DISPATCH_KEY = "__physical_to_logical_batch_dispatch"


def dispatch_input_batch(
    input_batch: NestedTensor, *, batch_axis_names: Optional[Union[str, Sequence[str]]] = "data"
) -> NestedTensor:
    """Turns a physical input batch into a logical one via its dispatch tensors.

    Every dict in `input_batch` holding `PHYSICAL_TO_LOGICAL_DISPATCH_KEY` (a bool tensor
    [physical_batch, logical_batch] with at most one True per row; an all-False row marks a
    padding example) has that key removed and each leaf x [physical_batch, ...] of its other
    entries replaced by the logical rows x'[l] = x[p] where dispatch[p, l]. Dicts without the key
    are traversed; other values are returned unchanged.

    Args:
        input_batch: A (nested) physical batch.
        batch_axis_names: Mesh axes the batch axis of the dispatched leaves is sharded over;
            None leaves them unconstrained.

    Returns:
        The logical batch (a new tree; `input_batch` is not modified).
    """

    def traverse(data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if PHYSICAL_TO_LOGICAL_DISPATCH_KEY not in data:
            return {key: traverse(value) for key, value in data.items()}
        data = dict(data)
        dispatch = data.pop(PHYSICAL_TO_LOGICAL_DISPATCH_KEY)

        def apply(x: Tensor) -> Tensor:
            out = jnp.einsum("p...,pl->l...", x, dispatch.astype(x.dtype))
            if batch_axis_names is None:
                return out
            return with_sharding_constraint(out, PartitionSpec(batch_axis_names))

        return jax.tree.map(apply, data)

    return traverse(input_batch)


def maybe_shard(x: Tensor, partition_spec: Optional[Sequence]) -> Tensor:
    """Applies `with_sharding_constraint(x, PartitionSpec(*partition_spec))` unless spec is None.

    Args:
        x: The tensor.
        partition_spec: One entry per axis of `x` (None entries replicate), or None.

    Returns:
        `x`, possibly constrained.

    Raises:
        ValueError: If the spec's length differs from `x.ndim`.
    """
    if partition_spec is None:
        return x
    if len(partition_spec) != x.ndim:
        raise ValueError(
            f"Partition spec {tuple(partition_spec)} has {len(partition_spec)} entries but the "
            f"tensor has shape {x.shape}"
        )
    manual, axes = _manual_axes()
    if manual:
        # Inside a partly Manual shard_map: constrain only the Auto axes (best effort).
        if manual == axes:
            return x
        spec = _manual_axes_to_unconstrained(PartitionSpec(*partition_spec))
        return jax.lax.with_sharding_constraint(x, spec)
    return with_sharding_constraint(x, PartitionSpec(*partition_spec))


def _is_spec_leaf(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def unknown_mesh_axes(spec: PartitionSpec, axis_names: Collection[str]) -> list[str]:
    """The mesh axis names `spec` uses that are not in `axis_names`, in order.

    Args:
        spec: A PartitionSpec (entries: None, an axis name, or a tuple of axis names).
        axis_names: The mesh's axis names.

    Returns:
        The unknown names (empty if all are known).
    """
    return [
        name
        for entry in spec
        for name in (entry if isinstance(entry, (tuple, list)) else (entry,))
        if name is not None and name not in axis_names
    ]


def partition_spec_to_named_sharding(
    mesh: jax.sharding.Mesh, partition_specs: NestedPartitionSpec
) -> Nested[NamedSharding]:
    """Turns a tree of PartitionSpecs (None = fully replicated) into NamedShardings on `mesh`.

    Args:
        mesh: The device mesh.
        partition_specs: A tree whose leaves are PartitionSpecs or None.

    Returns:
        The tree of NamedShardings.

    Raises:
        ValueError: If a spec names an axis the mesh does not have (the message gives the path).
    """
    axis_names = set(mesh.axis_names)

    def to_sharding(path: str, spec: Optional[PartitionSpec]) -> NamedSharding:
        spec = PartitionSpec() if spec is None else spec
        for name in unknown_mesh_axes(spec, axis_names):
            raise ValueError(
                f"Partition spec {spec} at '{path}' names mesh axis '{name}', which is not "
                f"among the mesh axes {tuple(mesh.axis_names)}"
            )
        return NamedSharding(mesh, spec)

    paths = tree_paths(partition_specs)
    return jax.tree.map(
        lambda p, s: to_sharding(p, s), paths, partition_specs, is_leaf=_is_spec_leaf
    )


def vectorized_tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    """Like `jax.tree.map`, but maps `fn` over the leading axis of every subtree under a VDict.

    Decoding caches of repeated layers are stacked on a leading layer axis under a VDict; with
    this map, `fn` sees each layer's tensors (e.g. [batch, ...]) rather than the stacked ones.

    Args:
        fn: Function of one leaf (and the matching leaves of `rest`).
        tree: The tree to map.
        *rest: Trees with the same structure as `tree`.

    Returns:
        The mapped tree (VDicts stay VDicts).
    """

    def apply(node, *others):
        if isinstance(node, VDict):
            out = jax.vmap(lambda x, *o: vectorized_tree_map(fn, dict(x), *map(dict, o)))(
                node, *others
            )
            return VDict(out)
        return fn(node, *others)

    return jax.tree.map(apply, tree, *rest, is_leaf=lambda x: isinstance(x, VDict))
