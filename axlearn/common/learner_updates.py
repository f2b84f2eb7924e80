"""Gradient helpers of `axlearn.common.learner` with AXLearn's names (re-exported there).

- `_split_gradients(fun, should_compute_gradients=...)`: `fun` rewritten to take the parameters
  to differentiate as `model_params` and the others beside its inputs, and the function that
  splits a parameter tree that way.
- `_value_and_grad(fun, opt_params=..., inputs=...)`: one forward and backward pass as `Updates`
  (gradients as `delta_updates`, the forward's state updates as `inplace_updates`, the pass
  itself under `forward_pass["default"]`).
- `_apply_updates(base, updates)`: merges a nested update into a nested state in place.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import optax

from axlearn.common.optimizer_base import OptParam
from axlearn.common.update_transformation import ForwardFn, ForwardOutputs, ForwardPass, Updates
from axlearn.common.utils import Nested, Tensor


def _split_gradients(
    fun: ForwardFn, *, should_compute_gradients: Nested[bool]
) -> tuple[ForwardFn, Callable[[Nested[Any]], tuple[Nested[Any], Nested[Any]]]]:
    """Rewrites `fun` so that only the parameters to differentiate are its `model_params`.

    The rewritten function is called as
    `new_fun(model_params=params_grad, inputs=(params_nograd, inputs))`; the split function maps
    a parameter tree to `(params_grad, params_nograd)`, each with None where the other has the
    value.

    Args:
        fun: A forward function `fun(model_params=..., inputs=...) -> ForwardOutputs`.
        should_compute_gradients: A tree of bools shaped like `fun`'s parameters.

    Returns:
        The rewritten forward function and the split function.
    """

    def split(model_params: Nested[Any]) -> tuple[Nested[Any], Nested[Any]]:
        with_grad = jax.tree.map(
            lambda c, v: v if c else None, should_compute_gradients, model_params
        )
        without_grad = jax.tree.map(
            lambda c, v: None if c else v, should_compute_gradients, model_params
        )
        return with_grad, without_grad

    def split_forward(*, model_params: Nested[Any], inputs: Any) -> ForwardOutputs:
        params_nograd, fun_inputs = inputs
        merged = jax.tree.map(
            lambda c, g, n: g if c else n,
            should_compute_gradients,
            model_params,
            params_nograd,
            is_leaf=lambda x: x is None,
        )
        return fun(model_params=merged, inputs=fun_inputs)

    return split_forward, split


def _value_and_grad(
    fun: ForwardFn,
    *,
    opt_params: Nested[OptParam],
    inputs: Any,
    should_compute_gradients: Optional[Nested[bool]] = None,
) -> Updates:
    """Runs `fun` forward and backward; returns the pass as `Updates`.

    Args:
        fun: A forward function `fun(model_params=..., inputs=...) -> ForwardOutputs`.
        opt_params: The parameters, as `OptParam`s.
        inputs: `fun`'s inputs.
        should_compute_gradients: Which parameters to differentiate (all if None); the others'
            gradients are None.

    Returns:
        `Updates` with the gradients as `delta_updates`, the forward's state updates as
        `inplace_updates`, and under `forward_pass["default"]` the function that was
        differentiated with its `model_params` and `inputs` (for a split, the rewritten
        function of `_split_gradients`, the parameters differentiated, and
        `(other parameters, inputs)`).
    """
    if should_compute_gradients is None:
        forward = fun

        def split(params):
            return params, {}

        def call(grad_params, nograd_params):
            del nograd_params
            return forward(model_params=grad_params, inputs=inputs)

        def pass_inputs(nograd_params):
            del nograd_params
            return inputs

    else:
        forward, split = _split_gradients(fun, should_compute_gradients=should_compute_gradients)

        def call(grad_params, nograd_params):
            return forward(model_params=grad_params, inputs=(nograd_params, inputs))

        def pass_inputs(nograd_params):
            return (nograd_params, inputs)

    values = jax.tree.map(lambda p: p.value, opt_params)
    grad_values, nograd_values = split(values)

    def loss_fn(grad_params, nograd_params):
        outputs = call(grad_params, nograd_params)
        return outputs.loss, outputs

    (_, outputs), grads = jax.value_and_grad(loss_fn, has_aux=True)(grad_values, nograd_values)
    return _updates_from_forward(
        forward,
        opt_params=opt_params,
        model_params=grad_values,
        inputs=pass_inputs(nograd_values),
        outputs=outputs,
        grads=grads,
    )


def _forward_and_grads(
    forward: ForwardFn, *, values: Nested[Tensor], inputs: Any, should_compute: Nested[bool]
) -> tuple[ForwardOutputs, Nested[Optional[Tensor]]]:
    """Runs `forward` and differentiates its loss w.r.t. the values where `should_compute`.

    Args:
        forward: A forward function `forward(model_params=..., inputs=...) -> ForwardOutputs`.
        values: The parameter values.
        inputs: `forward`'s inputs (not differentiated).
        should_compute: A tree of bools shaped like `values`.

    Returns:
        The forward outputs and the gradients (None where `should_compute` is False).
    """
    split_forward, split = _split_gradients(forward, should_compute_gradients=should_compute)
    grad_values, nograd_values = split(values)

    def loss_fn(grad_params, nograd_params):
        outputs = split_forward(model_params=grad_params, inputs=(nograd_params, inputs))
        return outputs.loss, outputs

    (_, outputs), grads = jax.value_and_grad(loss_fn, has_aux=True)(grad_values, nograd_values)
    return outputs, grads


def _updates_from_forward(
    fn: ForwardFn,
    *,
    opt_params: Nested[OptParam],
    model_params: Nested[Any],
    inputs: Any,
    outputs: ForwardOutputs,
    grads: Nested[Optional[Tensor]],
) -> Updates:
    """The `Updates` of one forward/backward pass: gradients and the forward's state updates.

    Args:
        fn: The forward function recorded in `forward_pass["default"]`.
        opt_params: The parameters, as `OptParam`s.
        model_params: The parameter values `fn` was called with.
        inputs: The inputs `fn` was called with.
        outputs: What `fn` returned.
        grads: The gradients (`delta_updates`).

    Returns:
        The `Updates`, with the forward's state updates as `inplace_updates`.
    """
    collection = outputs.output_collection
    return Updates(
        opt_params=opt_params,
        delta_updates=grads,
        inplace_updates=collection.state_updates if hasattr(collection, "state_updates") else {},
        forward_pass=dict(
            default=ForwardPass(
                forward_fn=fn, model_params=model_params, inputs=inputs, outputs=outputs
            )
        ),
    )


def _apply_updates(base: Nested[Any], updates: Nested[Any]) -> Nested[Any]:
    """Writes `updates` into `base` in place: keys of `updates` replace or add, others stay.

    Where either side is `optax.MaskedNode()`, `base` is kept; a tensor in `updates` replaces
    `base`'s value; dicts merge recursively.

    Args:
        base: The nested state to update (modified in place).
        updates: The nested updates (not modified).

    Returns:
        `base`, updated.

    Raises:
        ValueError: If a tensor update meets a dict in `base` (or a dict update a tensor).
    """
    if isinstance(base, optax.MaskedNode) or isinstance(updates, optax.MaskedNode):
        return base
    if not isinstance(updates, dict):
        if isinstance(base, dict):
            raise ValueError(f"A leaf update {type(updates).__name__} cannot replace a subtree.")
        return updates
    if not isinstance(base, dict):
        raise ValueError(f"A subtree update cannot replace a leaf {type(base).__name__}.")
    for key, value in updates.items():
        base[key] = value if key not in base else _apply_updates(base[key], value)
    return base
