"""Per-parameter scales by path regex, weight decay, and the per-parameter settings dump."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional

import jax
import optax
from absl import logging
from jax import numpy as jnp

from axlearn.common import schedule
from axlearn.common.config import ConfigOr, maybe_instantiate
from axlearn.common.module import current_context
from axlearn.common.optimizer_base import (
    NestedOptParam,
    OptParam,
    PartitionedGradientTransformation,
)
from axlearn.common.optimizers.transforms import (
    _is_zero,
    _scalar_spec,
    _to_partitioned_transformation,
    opt_param_values,
)
from axlearn.common.per_param_settings import (
    L2_REGULARIZER_SCALE,
    UPDATE_SCALE,
    WEIGHT_DECAY_SCALE,
    collect_per_param_settings,
    per_param_settings_text,
    register_per_param_settings,
)
from axlearn.common.utils import Tensor, flatten_items, tree_paths

# --------------------------------------------------------------------------------------------
# Per-parameter scales.
# --------------------------------------------------------------------------------------------


def per_param_scale_by_path(
    *, scale_by_path: Sequence[tuple[str, float]], description: str, default_scale: float = 1.0
) -> Callable[[NestedOptParam], Any]:
    """Per-parameter scales from regex rules over parameter paths (e.g. `decoder/emb/weight`).

    The first rule whose regex fully matches a parameter's path gives its scale; parameters no
    rule matches get `default_scale`. A rule that matches no parameter at all is an error (it is
    almost always a typo or a renamed layer), except when it names another layout of a layer that
    a matching rule covers: its regex up to the last "/" is a prefix of a matching rule's regex
    (the reference 3B config scales both `.*feed_forward/linear1_0/weight` and the fused layout's
    `.*feed_forward/wi_0_weight`); such a rule is logged and skipped.

    Args:
        scale_by_path: (regex, scale) pairs.
        description: What the scales are for (used in logs and error messages).
        default_scale: The scale of parameters that no rule matches.

    Returns:
        A function from a tree of OptParams (or specs) to a tree of float scales. It has a
        `description` attribute.
    """
    rules = []
    for i, (regex, value) in enumerate(scale_by_path):
        try:
            rules.append((re.compile(regex), regex, value))
        except re.error as e:
            raise ValueError(
                f"{description} per_param_scale_by_path: bad regex "
                f"scale_by_path[{i}] {regex!r}: {e}"
            ) from e

    def fn(params: NestedOptParam) -> Any:
        paths = tree_paths(params, separator="/")
        all_paths = [p for _, p in flatten_items(paths)]
        matched = [regex for pattern, regex, _ in rules if any(map(pattern.fullmatch, all_paths))]
        for i, (_, regex, _) in enumerate(rules):
            if regex not in matched:
                # The layer is any leading part of the path (".*ff" of ".*ff/linear1_0/weight"):
                # a rule of the same layer in another layout (".*ff/wi_0_weight") matched.
                parts = regex.split("/")
                layers = ["/".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)]
                layer = next((x for x in layers if any(m.startswith(x + "/") for m in matched)), "")
                if layer:
                    logging.info(
                        "%s: rule %r matches no parameter; another layout of layer %r is "
                        "matched by other rules.",
                        description,
                        regex,
                        layer,
                    )
                    continue
                examples = ", ".join(all_paths[:5]) + (", ..." if len(all_paths) > 5 else "")
                raise ValueError(
                    f"{description} per_param_scale_by_path: rule scale_by_path[{i}] "
                    f"{regex!r} matches no parameter (parameters: {examples})"
                )

        def per_param(path: str) -> float:
            for pattern, regex, value in rules:
                if pattern.fullmatch(path):
                    logging.vlog(1, "%s: %s matches %s: scale=%s", description, regex, path, value)
                    return value
            return default_scale

        return jax.tree.map(per_param, paths)

    fn.description = description
    return fn


def scale_update_per_param(
    per_param_scale: ConfigOr[Callable[[NestedOptParam], Any]],
) -> PartitionedGradientTransformation:
    """Multiplies each parameter's update by its scale (0 freezes the parameter).

    The scales are registered as per-parameter settings ("update_scale").

    Args:
        per_param_scale: A function (or its config, e.g. of `per_param_scale_by_path`) from the
            OptParam tree to a tree of scales.

    Returns:
        The transformation.
    """
    scale_fn = maybe_instantiate(per_param_scale)

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("scale_update_per_param needs params.")
        scales = register_per_param_settings(scale_fn(params), description=UPDATE_SCALE)
        return jax.tree.map(lambda u, s: u * s, updates, scales), state

    return PartitionedGradientTransformation(
        init=lambda params: optax.EmptyState(),
        update=update_fn,
        partition=lambda specs: optax.EmptyState(),
    )


def _weight_decay_scales(
    params: NestedOptParam,
    *,
    per_param_scale: Optional[ConfigOr[Callable]] = None,
    description: str = WEIGHT_DECAY_SCALE,
) -> Any:
    """Per-parameter weight-decay scales: OptParam.weight_decay_scale, else the rule, else 1.

    The result is registered as per-parameter settings under `description`, with the current
    invocation context's path (e.g. "root.optimizer") as AXLearn registers it. Without a rule the
    default scale is the int 1, which `_regularizer.txt` dumps print as `1` (as AXLearn's do).
    """
    if per_param_scale is None:
        scales = jax.tree.map(lambda _: 1, params)
    else:
        scales = maybe_instantiate(per_param_scale)(params)

    def override(param: OptParam, current: float) -> float:
        if getattr(param, "weight_decay_scale", None) is not None:
            return param.weight_decay_scale
        return current

    scales = jax.tree.map(override, params, scales)
    context = current_context()
    return register_per_param_settings(
        scales, description=description, path=context.path() if context is not None else None
    )


class AddDecayedWeightsState(NamedTuple):
    """State of add_decayed_weights."""

    # Number of updates, when the decay is scaled by a learning-rate schedule; else None.
    count: Optional[Tensor]


def add_decayed_weights(
    weight_decay: float,
    *,
    learning_rate_exponent: Optional[float] = None,
    learning_rate: Optional[schedule.Schedule] = None,
    per_param_scale: Optional[ConfigOr[Callable]] = None,
) -> PartitionedGradientTransformation:
    """Adds weight_decay * scale * lr**exponent * param to each update.

    Args:
        weight_decay: The base rate.
        learning_rate_exponent: If set, the rate of the k-th update (k = 1, 2, ...) is multiplied
            by learning_rate(k) ** exponent (AXLearn's convention).
        learning_rate: The learning-rate schedule (needed with `learning_rate_exponent`).
        per_param_scale: Optional per-parameter scales (e.g. `per_param_scale_by_path`); a
            parameter's `weight_decay_scale` (from its ParameterSpec) takes precedence.

    Returns:
        The transformation.

    Raises:
        ValueError: If learning_rate_exponent is set without learning_rate.
    """
    if learning_rate_exponent is not None and learning_rate is None:
        raise ValueError("add_decayed_weights: learning_rate_exponent needs learning_rate.")
    lr_fn = None if learning_rate is None else schedule.as_schedule_fn(learning_rate)

    def init_fn(params):
        del params
        count = None if learning_rate_exponent is None else jnp.zeros([], jnp.int32)
        return AddDecayedWeightsState(count=count)

    def update_fn(updates, state, params):
        if params is None:
            raise ValueError("add_decayed_weights needs params.")
        rate = weight_decay
        if learning_rate_exponent is not None:
            # As in AXLearn: the k-th update (k = 1, 2, ...) uses learning_rate(k), the schedule
            # at the incremented count, like `scale_by_schedule` after its own increment.
            state = AddDecayedWeightsState(count=optax.safe_increment(state.count))
            rate = weight_decay * lr_fn(state.count) ** learning_rate_exponent
        scales = _weight_decay_scales(params, per_param_scale=per_param_scale)
        if weight_decay:
            updates = jax.tree.map(
                lambda u, p, s: u if _is_zero(s) else u + (rate * s) * p.value,
                updates,
                params,
                scales,
            )
        return updates, state

    def partition_fn(specs):
        del specs
        return AddDecayedWeightsState(
            count=None if learning_rate_exponent is None else _scalar_spec()
        )

    return PartitionedGradientTransformation(init_fn, update_fn, partition_fn)


def l2_regularizer(
    regularizer_weight: Optional[float] = 0.0,
    per_param_scale: Optional[ConfigOr[Callable]] = None,
) -> PartitionedGradientTransformation:
    """Adds regularizer_weight * scale * param to the gradients (L2 regularization).

    Args:
        regularizer_weight: The L2 weight (0 or None disables it).
        per_param_scale: Optional per-parameter scales; `weight_decay_scale` takes precedence.

    Returns:
        The transformation.
    """

    def update_fn(updates, state, params):
        if regularizer_weight:
            if params is None:
                raise ValueError("l2_regularizer needs params.")
            scales = _weight_decay_scales(
                params, per_param_scale=per_param_scale, description=L2_REGULARIZER_SCALE
            )
            updates = jax.tree.map(
                lambda u, p, s: u + (regularizer_weight * s) * p.value, updates, params, scales
            )
        return updates, state

    return PartitionedGradientTransformation(
        init=lambda _: optax.EmptyState(),
        update=update_fn,
        partition=lambda _: optax.EmptyState(),
    )


# --------------------------------------------------------------------------------------------
# Per-parameter settings dump.
# --------------------------------------------------------------------------------------------


def opt_params_from_specs(param_specs: Any) -> Any:
    """Abstract OptParams (ShapeDtypeStruct values) from a tree of parameter specs.

    Args:
        param_specs: A tree of specs with .shape and .dtype (and optionally .weight_decay_scale
            and .factorization).

    Returns:
        A tree of OptParam whose values are jax.ShapeDtypeStruct.
    """
    return jax.tree.map(
        lambda s: OptParam(
            value=jax.ShapeDtypeStruct(tuple(s.shape), s.dtype or jnp.float32),
            factorization_spec=getattr(s, "factorization", None),
            weight_decay_scale=getattr(s, "weight_decay_scale", None),
        ),
        param_specs,
    )


def per_param_settings_of_optimizer(
    optimizer: ConfigOr[PartitionedGradientTransformation],
    param_specs: Any,
    *,
    descriptions: Sequence[str],
) -> str:
    """Runs one abstract optimizer step and returns the registered per-parameter settings as text.

    Args:
        optimizer: The optimizer or its config.
        param_specs: A tree of parameter specs (shape, dtype, optional weight_decay_scale).
        descriptions: The setting descriptions to dump (e.g. "weight_decay_scale").

    Returns:
        `path: value` lines (see `per_param_settings.per_param_settings_text`).
    """
    tx = _to_partitioned_transformation(optimizer)
    opt_params = opt_params_from_specs(param_specs)
    values = opt_param_values(opt_params)

    def step(values):
        params = jax.tree.map(lambda p, v: dataclasses.replace(p, value=v), opt_params, values)
        state = tx.init(params)
        return tx.update(jax.tree.map(jnp.zeros_like, values), state, params)

    with collect_per_param_settings() as records:
        jax.eval_shape(step, values)
    return per_param_settings_text(records, descriptions)


def regularizer_text(
    optimizer: ConfigOr[PartitionedGradientTransformation], param_specs: Any
) -> str:
    """One `param/path: weight-decay scale` line per parameter of one optimizer.

    (`golden_config.regularizer_text` gives a trainer config's AXLearn-format `_regularizer.txt`,
    with its `====` header.)

    Args:
        optimizer: The optimizer or its config.
        param_specs: A tree of parameter specs.

    Returns:
        The text (weight-decay and L2-regularizer scales).
    """
    return per_param_settings_of_optimizer(
        optimizer, param_specs, descriptions=(WEIGHT_DECAY_SCALE, L2_REGULARIZER_SCALE)
    )
