"""Building blocks: composing and partitioning optax transformations, EMAs, block-RMS ops."""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple, Optional

import jax
import optax
from jax import numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common import schedule
from axlearn.common.config import ConfigOr, maybe_instantiate
from axlearn.common.module import current_context
from axlearn.common.optimizer_base import (
    NestedOptParam,
    OptStateSpec,
    PartitionedGradientTransformation,
    TransformPartitionSpecFn,
)
from axlearn.common.utils import Tensor, VDict, flatten_items, tree_paths

# --------------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------------


def _add_summary(name: str, value: Any) -> None:
    """Adds a summary to the current invocation context, if any."""
    context = current_context()
    if context is not None:
        context.add_summary(name, value)


def _is_zero(x: Any) -> bool:
    """Whether `x` is a Python/NumPy number equal to zero (never true for traced values)."""
    return isinstance(x, (int, float)) and x == 0


def global_norm(tree: Any) -> Tensor:
    """The L2 norm of all leaves of `tree` together (computed in float32).

    Args:
        tree: A tree of arrays (None leaves are skipped).

    Returns:
        A float32 scalar.
    """
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros([], jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def _scalar_spec(dtype=jnp.int32) -> OptStateSpec:
    return OptStateSpec(shape=[], dtype=dtype, mesh_axes=PartitionSpec())


def _to_partitioned_transformation(
    transformation: ConfigOr[PartitionedGradientTransformation],
) -> PartitionedGradientTransformation:
    transformation = maybe_instantiate(transformation)
    if not isinstance(transformation, PartitionedGradientTransformation):
        raise ValueError(
            f"Expected a PartitionedGradientTransformation, got {type(transformation)}: "
            f"{transformation}"
        )
    return transformation


def opt_param_values(params: NestedOptParam) -> Any:
    """Returns the tree of values of a tree of OptParams.

    Args:
        params: A tree with OptParam leaves.

    Returns:
        The tree with each OptParam replaced by its value.
    """
    return jax.tree.map(lambda p: p.value, params)


def copy_partition(
    param_specs: Any, *, pattern: Optional[Any] = None, memory_kind: Optional[str] = None
) -> Any:
    """State specs equal to the parameter specs (shape, dtype, mesh_axes, memory kind).

    Args:
        param_specs: A tree of parameter (or state) specs.
        pattern: Optional regex (string or compiled) matched in full against each spec's tree path
            ('/'-separated); matched specs get `memory_kind`.
        memory_kind: The memory kind for matched specs.

    Returns:
        A tree of OptStateSpec.
    """

    def one(path, s):
        kind = getattr(s, "memory_kind", None)
        if pattern is not None and re.fullmatch(pattern, path):
            kind = memory_kind
        return OptStateSpec(shape=s.shape, dtype=s.dtype, mesh_axes=s.mesh_axes, memory_kind=kind)

    return jax.tree.map(one, tree_paths(param_specs), param_specs)


def _vectorized_tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    """Like jax.tree.map, but maps `fn` over the leading axis of subtrees under a VDict.

    Parameters of repeated layers are stacked under a VDict; statistics such as block RMS are
    computed per layer.
    """

    def as_dict(x):
        return dict(x) if isinstance(x, VDict) else x

    def apply(node, *others):
        if isinstance(node, VDict) and not jax.tree.leaves((node, *others)):
            # No arrays under it (e.g. every update is None): nothing to vectorize over.
            out = _vectorized_tree_map(fn, dict(node), *[as_dict(y) for y in others])
            return VDict(out)
        if isinstance(node, VDict):
            # Map over the children of the VDict, one layer at a time.
            out = jax.vmap(
                lambda x, *o: _vectorized_tree_map(fn, dict(x), *[as_dict(y) for y in o])
            )(node, *others)
            return VDict(out) if isinstance(out, dict) else out
        return fn(node, *others)

    return jax.tree.map(apply, tree, *rest, is_leaf=lambda x: isinstance(x, VDict))


def _expand_vdicts(tree: Any) -> Any:
    """Turns each VDict of stacked values into a list of per-layer dicts (for summaries)."""
    if isinstance(tree, VDict):
        leaves = jax.tree.leaves(tree)
        if not leaves:
            return {}
        num = leaves[0].shape[0]
        return [_expand_vdicts(jax.tree.map(lambda x, i=i: x[i], dict(tree))) for i in range(num)]
    if isinstance(tree, dict):
        return {k: _expand_vdicts(v) for k, v in tree.items()}
    return tree


def _add_per_param_summaries(stats: Any, *, suffix: str) -> None:
    """Adds `{param_path}/{suffix}` summaries for a tree of scalar statistics."""
    if current_context() is None:
        return
    for path, value in flatten_items(_expand_vdicts(stats)):
        _add_summary(f"{path}/{suffix}", value)


def _rms_norms(tree: Any, *, suffix: Optional[str] = None) -> Any:
    """Per-parameter (per-layer under a VDict) RMS of `tree`, optionally added as summaries."""
    norms = _vectorized_tree_map(lambda u: jnp.sqrt(jnp.mean(jnp.square(u))), tree)
    if suffix is not None:
        _add_per_param_summaries(norms, suffix=suffix)
    return norms


# --------------------------------------------------------------------------------------------
# Composition and wrapping of optax transformations.
# --------------------------------------------------------------------------------------------


def chain(*args: ConfigOr[PartitionedGradientTransformation]) -> PartitionedGradientTransformation:
    """Applies transformations in sequence (like optax.chain); the state is a tuple.

    Args:
        *args: Transformations or their configs.

    Returns:
        The chained transformation.
    """
    txs = [_to_partitioned_transformation(e) for e in args]
    base = optax.chain(*[optax.GradientTransformation(e.init, e.update) for e in txs])
    return PartitionedGradientTransformation(
        init=base.init,
        update=base.update,
        partition=lambda param_specs: tuple(e.partition(param_specs) for e in txs),
    )


def named_chain(**kwargs: ConfigOr[PartitionedGradientTransformation]):
    """Applies transformations in sequence; the state is a dict keyed by the given names.

    Args:
        **kwargs: name -> transformation (or config), applied in order.

    Returns:
        The chained transformation.
    """
    txs = {k: _to_partitioned_transformation(v) for k, v in kwargs.items()}

    def update_fn(updates, state, params):
        new_state = {}
        for k, tx in txs.items():
            updates, new_state[k] = tx.update(updates, state[k], params)
        return updates, new_state

    return PartitionedGradientTransformation(
        init=lambda params: {k: tx.init(params) for k, tx in txs.items()},
        update=update_fn,
        partition=lambda specs: {k: tx.partition(specs) for k, tx in txs.items()},
    )


def with_partition_fn(
    base: optax.GradientTransformation, partition_fn: TransformPartitionSpecFn
) -> PartitionedGradientTransformation:
    """Wraps an optax transformation (on plain arrays) to take OptParams, with `partition_fn`.

    Args:
        base: The optax transformation.
        partition_fn: Maps parameter specs to the specs of `base`'s state.

    Returns:
        The partitioned transformation.
    """

    def update_fn(updates, state, params):
        values = None if params is None else opt_param_values(params)
        return base.update(updates, state, values)

    return PartitionedGradientTransformation(
        init=lambda params: base.init(opt_param_values(params)),
        update=update_fn,
        partition=partition_fn,
    )


def trace_partition(base: optax.GradientTransformation) -> PartitionedGradientTransformation:
    """Partitions an `optax.trace` transformation (momentum sharded like the parameters)."""
    return with_partition_fn(base, lambda specs: optax.TraceState(trace=copy_partition(specs)))


def adam_partition(base: optax.GradientTransformation) -> PartitionedGradientTransformation:
    """Partitions an `optax.scale_by_adam` transformation (mu and nu sharded like the params)."""

    def partition_fn(specs):
        return optax.ScaleByAdamState(
            count=_scalar_spec(), mu=copy_partition(specs), nu=copy_partition(specs)
        )

    return with_partition_fn(base, partition_fn)


def replace_with_updates() -> PartitionedGradientTransformation:
    """Returns a transformation after which each parameter's new value is its update (gradient).

    The learner adds the returned delta to the parameter, so the delta is `update - param`. Used
    for parameters that carry statistics computed in the backward pass as their "gradients"
    (see gradient_monitor.py).

    Returns:
        The stateless transformation.
    """

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("replace_with_updates needs params (their values are replaced)")
        return jax.tree.map(lambda u, p: u - p.value, updates, params), state

    return PartitionedGradientTransformation(
        init=lambda params: optax.EmptyState(),
        update=update_fn,
        partition=lambda param_specs: optax.EmptyState(),
    )


def scale(step_size: float) -> PartitionedGradientTransformation:
    """Multiplies updates by a constant.

    Args:
        step_size: The constant.

    Returns:
        The transformation.
    """
    return with_partition_fn(optax.scale(step_size), lambda _: optax.ScaleState())


def scale_by_schedule(
    step_size_fn: schedule.Schedule, *, name: Optional[str] = None
) -> PartitionedGradientTransformation:
    """Multiplies updates by a schedule of the 1-based update step.

    Unlike optax.scale_by_schedule, the schedule sees `count + 1`: the first update is step 1,
    consistent with the step the trainer logs, summarizes and checkpoints. The state's `count`
    is the number of updates done. Adds `schedule_step` and `schedule_scale` summaries (prefixed
    by `name/` if given).

    Args:
        step_size_fn: The schedule.
        name: Optional summary prefix.

    Returns:
        The transformation.
    """
    fn = schedule.as_schedule_fn(step_size_fn)
    prefix = "" if name is None else f"{name}/"

    def init_fn(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        del params
        count_inc = optax.safe_increment(state.count)
        step_size = fn(count_inc)
        _add_summary(prefix + "schedule_step", count_inc)
        _add_summary(prefix + "schedule_scale", step_size)
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=count_inc)

    return PartitionedGradientTransformation(
        init_fn, update_fn, lambda _: optax.ScaleByScheduleState(count=_scalar_spec())
    )


def scale_from_learning_rate(
    learning_rate: schedule.Schedule, *, flip_sign: bool = True
) -> schedule.ScheduleFn:
    """A schedule equal to -learning_rate (or +learning_rate), adding `learning_rate` summaries.

    Args:
        learning_rate: The learning rate schedule.
        flip_sign: Whether to negate it (gradient descent).

    Returns:
        The schedule.
    """
    lr_fn = schedule.as_schedule_fn(learning_rate)

    def fn(step):
        lr = lr_fn(step)
        _add_summary("lr_schedule_step", step)
        _add_summary("learning_rate", lr)
        return -lr if flip_sign else lr

    return fn


class EmaState(NamedTuple):
    """State of `ema` (AXLearn's layout)."""

    # Number of times the EMA has been updated.
    count: Tensor
    # The moving averages (int8/int16 when quantized).
    ema: Any
    # Per tensor, the step size that turns a quantized average back into floats: shape
    # param.shape[1:] for quantized (int) accumulators, else a (1,) placeholder of zeros.
    scale: Any


class _Opaque:
    """Holds a value as a single pytree leaf (not a registered pytree node)."""

    def __init__(self, value):
        self.value = value


_EMA_FLOAT_DTYPES = (jnp.float32, jnp.bfloat16)
_EMA_INT_DTYPES = (jnp.int16, jnp.int8)


def ema(
    decay: schedule.Schedule, debias: bool = True, accumulator_dtype: Optional[Any] = jnp.float32
) -> PartitionedGradientTransformation:
    """Replaces updates by their exponential moving average (momentum).

    At update t (counting from 1): ema_t = (1 - decay(t)) * u_t + decay(t) * ema_{t-1}, and the
    output is ema_t / (1 - decay(t) ** t) when `debias`. With an int8/int16 accumulator, each
    non-scalar average is stored quantized symmetrically per slice along axis 0: its step size
    (the slice's max |value| / the int max) is kept in `EmaState.scale`.

    Args:
        decay: The decay, a schedule of the 1-based update step.
        debias: Whether to divide by (1 - decay**t).
        accumulator_dtype: dtype of the averages of non-scalar parameters: float32, bfloat16,
            int16 or int8 (None: the update dtype).

    Returns:
        The transformation.

    Raises:
        ValueError: If accumulator_dtype is not one of those.
    """
    decay_fn = schedule.as_schedule_fn(decay)
    if accumulator_dtype is not None:
        valid = list(_EMA_FLOAT_DTYPES) + list(_EMA_INT_DTYPES)
        accumulator_dtype = jax.dtypes.canonicalize_dtype(accumulator_dtype)
        if accumulator_dtype not in valid:
            raise ValueError(f"accumulator_dtype must be one of {valid} if set.")

    def quantized(shape) -> bool:
        return bool(len(shape)) and accumulator_dtype in _EMA_INT_DTYPES

    def acc_dtype(shape, dtype):
        return accumulator_dtype if (len(shape) and accumulator_dtype is not None) else dtype

    def init_fn(params):
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, acc_dtype(p.shape, p.dtype)), params)
        scales = jax.tree.map(
            lambda p: jnp.zeros(p.shape[1:] if quantized(p.shape) else (1,), jnp.float32), params
        )
        return EmaState(count=jnp.zeros([], jnp.int32), ema=zeros, scale=scales)

    def to_float(m, qstep):
        if not jnp.issubdtype(m.dtype, jnp.integer):
            return m
        return m.astype(qstep.dtype) * jnp.expand_dims(qstep, 0)

    def store(m, old):
        if not quantized(m.shape):
            return m.astype(old.dtype), jnp.zeros((1,), jnp.float32)
        num_steps = jnp.array(jnp.iinfo(accumulator_dtype).max, dtype=m.dtype)
        qstep = jnp.max(jnp.abs(m), axis=0, keepdims=True) / num_steps
        divisor = jnp.where(qstep > 0.0, qstep, jnp.ones_like(qstep))
        return jnp.round(m / divisor).astype(accumulator_dtype), qstep.squeeze(0)

    def update_fn(updates, state, params=None):
        del params
        count_inc = optax.safe_increment(state.count)
        decay_t = decay_fn(count_inc)
        new_ema = jax.tree.map(
            lambda u, m, q: (1 - decay_t) * u + decay_t * to_float(m, q),
            updates,
            state.ema,
            state.scale,
        )
        if debias:
            updates = jax.tree.map(lambda m: m / (1 - decay_t**count_inc).astype(m.dtype), new_ema)
        else:
            updates = new_ema
        # _Opaque wrappers are leaves, so a params tree holding tuples is not confused with them.
        stored = jax.tree.map(lambda m, old: _Opaque(store(m, old)), new_ema, state.ema)
        new_values = jax.tree.map(lambda r: r.value[0], stored)
        new_scales = jax.tree.map(lambda r: r.value[1], stored)
        return updates, EmaState(count=count_inc, ema=new_values, scale=new_scales)

    def partition_fn(specs):
        def scale_spec(s):
            if quantized(s.shape):
                axes = s.mesh_axes
                axes = PartitionSpec(*axes[1:]) if axes is not None else None
                return OptStateSpec(shape=list(s.shape[1:]), dtype=jnp.float32, mesh_axes=axes)
            return OptStateSpec(shape=(1,), dtype=jnp.float32, mesh_axes=PartitionSpec(None))

        return EmaState(
            count=_scalar_spec(),
            ema=jax.tree.map(
                lambda s: OptStateSpec(
                    shape=s.shape, dtype=acc_dtype(s.shape, s.dtype), mesh_axes=s.mesh_axes
                ),
                specs,
            ),
            scale=jax.tree.map(scale_spec, specs),
        )

    return PartitionedGradientTransformation(init_fn, update_fn, partition_fn)


def clip_by_block_rms(
    threshold: Optional[float], *, summary_suffix: Optional[str] = None
) -> PartitionedGradientTransformation:
    """Clips each parameter's update (each layer's, under a VDict) to RMS <= threshold.

    Args:
        threshold: The maximum RMS; None disables clipping.
        summary_suffix: If set, adds the pre-clipping RMS as `{param_path}/{summary_suffix}`.

    Returns:
        The transformation.
    """

    def update_fn(updates, state, params=None):
        del params
        if threshold is None and summary_suffix is None:
            return updates, state
        norms = _rms_norms(updates, suffix=summary_suffix)
        if threshold is not None:
            updates = _vectorized_tree_map(
                lambda u, n: u / jnp.maximum(1.0, n / threshold), updates, norms
            )
        return updates, state

    return PartitionedGradientTransformation(
        lambda _: optax.EmptyState(), update_fn, lambda _: optax.EmptyState()
    )


def scale_by_param_block_rms(min_scale: float = 1e-3) -> PartitionedGradientTransformation:
    """Multiplies each update by max(RMS(param), min_scale) (per layer under a VDict).

    Args:
        min_scale: The minimum multiplier.

    Returns:
        The transformation.
    """

    def update_fn(updates, state, params):
        values = opt_param_values(params)
        updates = _vectorized_tree_map(
            lambda u, p: u * optax.safe_root_mean_squares(p, min_scale), updates, values
        )
        return updates, state

    return PartitionedGradientTransformation(
        lambda _: optax.EmptyState(), update_fn, lambda _: optax.EmptyState()
    )


def scale_by_trust_ratio(
    min_norm: float = 0.0, trust_coefficient: float = 1.0, eps: float = 0.0
) -> PartitionedGradientTransformation:
    """Scales each update by trust_coefficient * |param| / (|update| + eps) (LAMB).

    As optax.scale_by_trust_ratio, but per layer under a VDict (repeated layers). Norms are at
    least `min_norm`; where either norm is 0 the ratio is 1.

    Args:
        min_norm: Minimum of the parameter and update norms.
        trust_coefficient: Multiplier of the ratio.
        eps: Added to the update norm.

    Returns:
        The transformation.

    Raises:
        ValueError: If called without params.
    """

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("Params must not be None for trust ratio scaling!")

        def one(u, p):
            p_norm = optax.safe_norm(p, min_norm)
            u_norm = optax.safe_norm(u, min_norm)
            ratio = trust_coefficient * p_norm / (u_norm + eps)
            zero = jnp.logical_or(p_norm == 0.0, u_norm == 0.0)
            return u * jnp.where(zero, jnp.array(1.0, dtype=p.dtype), ratio)

        return _vectorized_tree_map(one, updates, opt_param_values(params)), state

    return PartitionedGradientTransformation(
        lambda _: optax.ScaleByTrustRatioState(),
        update_fn,
        lambda _: optax.ScaleByTrustRatioState(),
    )


def per_param_scale_by_rms(*, min_scale: float = 1e-4) -> Callable[[Any], Any]:
    """Returns a function mapping a tree of OptParams to max(RMS(param), min_scale) per leaf.

    Args:
        min_scale: The minimum scale.

    Returns:
        The per-parameter scale function (e.g. for `scale_update_per_param`).
    """

    def fn(params):
        return jax.tree.map(lambda p: optax.safe_root_mean_squares(p.value, min_scale), params)

    return fn


def _memory_space(kind: str):
    spaces = {"device": jax.memory.Space.Device, "pinned_host": jax.memory.Space.Host}
    if kind not in spaces:
        raise ValueError(f"Unsupported memory kind {kind!r}; expected one of {sorted(spaces)}.")
    return spaces[kind]


def offload_optimizer(
    optimizer: ConfigOr[PartitionedGradientTransformation],
    *,
    pattern: Any = ".*",
    offload_src: str = "device",
    offload_dst: str = "pinned_host",
) -> PartitionedGradientTransformation:
    """Keeps the optimizer states whose path matches `pattern` in `offload_dst` memory.

    The returned transformation's `partition` gives matched state specs `memory_kind=offload_dst`
    (so the trainer places them there); `update` moves them to `offload_src` before calling the
    wrapped optimizer and back afterwards. Paths are the state tree's '/'-joined keys (named
    tuple fields by name, e.g. "0/mu/decoder/..." for a chain): use ".*/mu/.*" to offload only
    Adam's first moments. Wrap a whole `skip_and_clip_by_global_norm`, not its inner optimizer
    (its `jnp.where` over states does not take host-memory operands).

    Args:
        optimizer: The optimizer (or its config).
        pattern: Regex matched in full against each state path.
        offload_src: The memory kind the update computes in ("device").
        offload_dst: The memory kind the states live in between updates ("pinned_host").

    Returns:
        The wrapped optimizer; its `update` must run under `jax.jit`.

    Raises:
        ValueError: If a memory kind is None or unsupported.
    """
    optimizer = _to_partitioned_transformation(optimizer)
    if offload_src is None or offload_dst is None:
        raise ValueError(
            "offload_src and offload_dst cannot be None when using optimizer offloading."
        )
    src, dst = _memory_space(offload_src), _memory_space(offload_dst)

    def move(state, space):
        paths = tree_paths(state)
        return jax.tree.map(
            lambda path, x: jax.device_put(x, space) if re.fullmatch(pattern, path) else x,
            paths,
            state,
        )

    def update_fn(updates, state, params):
        updates, new_state = optimizer.update(updates, move(state, src), params)
        return updates, move(new_state, dst)

    def partition_fn(param_specs):
        return copy_partition(
            optimizer.partition(param_specs), pattern=pattern, memory_kind=offload_dst
        )

    return PartitionedGradientTransformation(optimizer.init, update_fn, partition_fn)


# --------------------------------------------------------------------------------------------
# Parameter EMA.
# --------------------------------------------------------------------------------------------


class ParamEmaState(NamedTuple):
    """State of param_ema."""

    # Number of EMA updates.
    count: Tensor
    # The moving averages of the parameters.
    ema: Any


def _no_op() -> PartitionedGradientTransformation:
    return PartitionedGradientTransformation(
        init=lambda params: optax.EmptyState(),
        update=lambda updates, state, params: (updates, state),
        partition=lambda specs: optax.EmptyState(),
    )


def param_ema(*, decay: Optional[schedule.Schedule] = None) -> PartitionedGradientTransformation:
    """Polyak averaging: an EMA of the parameters (its `update` is called with new params).

    ema_t = (1 - decay(t)) * param_t + decay(t) * ema_{t-1}, from zeros, with t the 1-based
    update step (wrap a constant decay in `schedule.decay_bias_correction` for a debiased
    average). Non-float parameters (e.g. int step counters) are copied, not averaged.

    Args:
        decay: The decay schedule; None disables the EMA (a no-op transformation).

    Returns:
        The transformation; updates pass through unchanged.
    """
    if decay is None:
        return _no_op()
    decay_fn = schedule.as_schedule_fn(decay)

    def init_fn(params):
        return ParamEmaState(
            count=jnp.zeros([], jnp.int32),
            ema=jax.tree.map(lambda p: jnp.zeros_like(p.value), params),
        )

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("param_ema needs params.")
        count_inc = optax.safe_increment(state.count)
        decay_t = decay_fn(count_inc)

        def interpolate(p, e):
            if not jnp.issubdtype(p.value.dtype, jnp.floating):
                return p.value
            return ((1 - decay_t) * p.value + decay_t * e).astype(e.dtype)

        new_ema = jax.tree.map(interpolate, params, state.ema)
        return updates, ParamEmaState(count=count_inc, ema=new_ema)

    def partition_fn(specs):
        return ParamEmaState(count=_scalar_spec(), ema=copy_partition(specs))

    return PartitionedGradientTransformation(init_fn, update_fn, partition_fn)
