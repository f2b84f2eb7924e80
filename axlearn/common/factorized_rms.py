"""Adafactor's factored second-moment scaling, with the factored axes named by each parameter.

`scale_by_factored_rms` divides each gradient by a running estimate of its root mean square
(Shazeer & Stern, 2018, arXiv:1804.04235). For a parameter whose `factorization_spec` names one
axis "row" and one axis "col", the estimate of the squared gradient is the outer product of two
running means: `v_row` (the mean over the "row" axis, so it keeps the "col" axis) and `v_col`
(the mean over the "col" axis), normalized by the mean of `v_row`; only these two vectors are
kept, not a tensor of the parameter's size. Any other parameter (no spec, a spec without
"row"/"col" entries, or `factored=False`) keeps the full running mean `v`.

With "row" on the largest axis and "col" on the second largest, the numbers equal optax's
`scale_by_factored_rms` (which picks those two axes by size); unlike optax, the axes follow the
parameter's `ParameterSpec.factorization`, and `partition` gives the state the parameters'
shardings (the factored statistics drop one axis and its mesh axis).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from optax import FactoredState

from axlearn.common.base_layer import FactorizationSpec, NestedParameterSpec, ParameterSpec
from axlearn.common.config import config_for_function
from axlearn.common.optimizer_base import OptStateSpec, PartitionedGradientTransformation
from axlearn.common.schedule import Schedule, adafactor_decay_rate, as_schedule_fn
from axlearn.common.utils import PartitionSpec, Tensor


def _factored_dims(
    factored: bool, factorization_spec: Optional[FactorizationSpec]
) -> Optional[tuple[int, int]]:
    """Returns the (col, row) axes to factor over, or None for the full second moment.

    Args:
        factored: Whether factoring is enabled.
        factorization_spec: The parameter's factorization spec (None: not factored).

    Returns:
        None, or (the "col" axis, the "row" axis).

    Raises:
        ValueError: If the spec names "row" or "col" but not exactly one of each.
    """
    if not factored or factorization_spec is None:
        return None
    axes = list(factorization_spec.axes)
    rows = [i for i, name in enumerate(axes) if name == "row"]
    cols = [i for i, name in enumerate(axes) if name == "col"]
    if not rows and not cols:
        return None
    if len(rows) != 1 or len(cols) != 1:
        raise ValueError(
            f"Invalid factorization_spec: {factorization_spec} (needs exactly one 'row' and "
            "one 'col' axis, or neither)"
        )
    return cols[0], rows[0]


def _one() -> Tensor:
    return jnp.zeros((1,), jnp.float32)


def _dummy_spec() -> OptStateSpec:
    """The spec of a statistic a parameter does not use (a length-1 placeholder)."""
    return OptStateSpec(dtype=jnp.float32, shape=(1,), mesh_axes=PartitionSpec(None))


def _by_path(fn, tree: Any) -> Any:
    """`jax.tree.map(fn(path, leaf), tree)`, with `path` as "a/b" text (for error messages)."""

    def one(path, leaf):
        return fn("/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path), leaf)

    return jax.tree_util.tree_map_with_path(one, tree)


def scale_by_factored_rms(
    factored: bool = True,
    decay_rate: Schedule = config_for_function(adafactor_decay_rate),
    epsilon: float = 1e-30,
) -> PartitionedGradientTransformation:
    """Scales updates by a (factored) estimate of the gradients' root mean square (Adafactor).

    Args:
        factored: Whether to factor the second moment of parameters whose factorization spec
            names a "row" and a "col" axis.
        decay_rate: The second-moment decay as a schedule of the 1-based update step (the
            default, 1 - t ** -0.8, replaces the average at the first step).
        epsilon: Added to the squared gradients.

    Returns:
        The transformation; its state is an `optax.FactoredState(count, v_row, v_col, v)` with
        length-1 placeholders for the statistics a parameter does not use.
    """
    decay_rate_fn = as_schedule_fn(decay_rate)

    def init_fn(params: Any) -> FactoredState:
        paths_and_params, treedef = jax.tree_util.tree_flatten_with_path(params)
        flat_params = [p for _, p in paths_and_params]
        flat_dims = []
        for path, param in paths_and_params:
            try:
                flat_dims.append(_factored_dims(factored, param.factorization_spec))
            except ValueError as e:
                raise ValueError(f"Parameter {jax.tree_util.keystr(path)}: {e}") from e
        v_row, v_col, v = [], [], []
        for param, d in zip(flat_params, flat_dims):
            shape = tuple(param.shape)
            if d is None:
                v_row.append(_one())
                v_col.append(_one())
                v.append(jnp.zeros(shape, jnp.float32))
            else:
                col, row = d
                v_row.append(jnp.zeros(shape[:row] + shape[row + 1 :], jnp.float32))
                v_col.append(jnp.zeros(shape[:col] + shape[col + 1 :], jnp.float32))
                v.append(_one())
        return FactoredState(
            count=jnp.zeros([], jnp.int32),
            v_row=treedef.unflatten(v_row),
            v_col=treedef.unflatten(v_col),
            v=treedef.unflatten(v),
        )

    def update_fn(updates: Any, state: FactoredState, params: Any = None):
        if params is None:
            raise ValueError("scale_by_factored_rms needs params (for their factorization specs)")
        count = optax.safe_int32_increment(state.count)
        beta = decay_rate_fn(count)  # The schedule's steps start at 1.
        treedef = jax.tree_util.tree_structure(updates)
        flat = zip(
            treedef.flatten_up_to(updates),
            treedef.flatten_up_to(state.v_row),
            treedef.flatten_up_to(state.v_col),
            treedef.flatten_up_to(state.v),
            treedef.flatten_up_to(params),
        )
        outputs, new_row, new_col, new_v = [], [], [], []
        for grad, v_row, v_col, v, param in flat:
            grad = grad.astype(jnp.float32)
            sq = jnp.square(grad) + epsilon
            d = _factored_dims(factored, param.factorization_spec)
            if d is None:
                v = beta * v + (1.0 - beta) * sq
                outputs.append(grad * jax.lax.rsqrt(v))
                new_row.append(_one())
                new_col.append(_one())
                new_v.append(v)
                continue
            col, row = d
            v_row = beta * v_row + (1.0 - beta) * jnp.mean(sq, axis=row)
            v_col = beta * v_col + (1.0 - beta) * jnp.mean(sq, axis=col)
            # v_row lost the row axis: the col axis moved one left if it came after it.
            col_in_row = col - 1 if col > row else col
            row_scale = jax.lax.rsqrt(v_row / jnp.mean(v_row, axis=col_in_row, keepdims=True))
            col_scale = jax.lax.rsqrt(v_col)
            outputs.append(grad * jnp.expand_dims(row_scale, row) * jnp.expand_dims(col_scale, col))
            new_row.append(v_row)
            new_col.append(v_col)
            new_v.append(_one())
        new_state = FactoredState(
            count=count,
            v_row=treedef.unflatten(new_row),
            v_col=treedef.unflatten(new_col),
            v=treedef.unflatten(new_v),
        )
        return treedef.unflatten(outputs), new_state

    def partition_fn(param_specs: NestedParameterSpec) -> FactoredState:
        def specs_of(path: str, spec: ParameterSpec) -> dict[str, OptStateSpec]:
            try:
                d = _factored_dims(factored, spec.factorization)
            except ValueError as e:
                raise ValueError(f"Parameter {path}: {e}") from e
            shape = list(spec.shape)
            mesh_axes = spec.mesh_axes
            mesh_axes = [None] * len(shape) if mesh_axes is None else list(mesh_axes)
            if len(mesh_axes) != len(shape):
                raise ValueError(
                    f"Parameter {path}: mesh_axes {spec.mesh_axes} do not match shape {shape}"
                )
            if d is None:
                full = OptStateSpec(dtype=spec.dtype, shape=spec.shape, mesh_axes=spec.mesh_axes)
                return dict(v_row=_dummy_spec(), v_col=_dummy_spec(), v=full)

            def without(axis: int) -> OptStateSpec:
                keep = [i for i in range(len(shape)) if i != axis]
                return OptStateSpec(
                    dtype=spec.dtype,
                    shape=[shape[i] for i in keep],
                    mesh_axes=PartitionSpec(*[mesh_axes[i] for i in keep]),
                )

            col, row = d
            return dict(v_row=without(row), v_col=without(col), v=_dummy_spec())

        specs = _by_path(specs_of, param_specs)
        is_entry = lambda x: isinstance(x, dict) and set(x) == {"v_row", "v_col", "v"}  # noqa: E731
        return FactoredState(
            count=OptStateSpec(dtype=jnp.int32, shape=[], mesh_axes=PartitionSpec()),
            v_row=jax.tree.map(lambda s: s["v_row"], specs, is_leaf=is_entry),
            v_col=jax.tree.map(lambda s: s["v_col"], specs, is_leaf=is_entry),
            v=jax.tree.map(lambda s: s["v"], specs, is_leaf=is_entry),
        )

    return PartitionedGradientTransformation(init=init_fn, update=update_fn, partition=partition_fn)
