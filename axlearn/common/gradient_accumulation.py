"""Gradient accumulation: run a ForwardFn over microbatches and average loss and gradients.

`with_minibatch_steps(steps=N)` turns a ForwardFn into one that splits `inputs["input_batch"]`
into N microbatches along axis 0, runs forward and backward on each in a `jax.lax.scan` (so only
one microbatch's activations are live), and returns the average loss, aux outputs and
gradients. When the loss is a mean over equally weighted examples, this equals one step on the
whole batch. Use it as `Learner.Config.forward_fn_transformation`:

    learner_cfg.forward_fn_transformation = config_for_function(with_minibatch_steps).set(steps=4)

Microbatch i takes examples i, i + N, i + 2N, ... so that each microbatch stays spread over the
devices the batch is sharded on. Summaries that are `summary.Summary` instances (`WeightedSummary`,
`MinSummary`, ...) are combined in microbatch order by a `metrics.MetricAccumulator` (weighted
means by weight, a min as the min, ...); other summaries, aux outputs and state updates are
averaged (`WeightedScalar` state updates are combined by weight).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
from jax import numpy as jnp

from axlearn.common.config import ConfigOr, maybe_instantiate
from axlearn.common.metrics import MetricAccumulator
from axlearn.common.summary import Summary
from axlearn.common.utils import Nested, Tensor, cast_floats, flatten_items


def _is_weighted(x: Any) -> bool:
    # WeightedScalar (axlearn.common.metrics) and similar: combined by their own `+`.
    return hasattr(x, "accumulate") and hasattr(x, "weight")


def _is_summary(x: Any) -> bool:
    return isinstance(x, Summary)


def _split_summaries(summaries: Nested[Any]) -> tuple[Nested[Any], Nested[Any]]:
    """Splits a summaries tree into (Summary leaves, other leaves), each with None elsewhere."""
    kw = dict(is_leaf=_is_summary)
    return (
        jax.tree.map(lambda x: x if _is_summary(x) else None, summaries, **kw),
        jax.tree.map(lambda x: None if _is_summary(x) else x, summaries, **kw),
    )


def _accumulate_stacked(
    stacked: Nested[Any], *, steps: int, accumulator: MetricAccumulator
) -> Nested[Any]:
    """Accumulates Summary leaves stacked on axis 0 (one entry per microbatch) in order.

    Args:
        stacked: A tree whose leaves are Summary objects with a leading [steps] axis (or None).
        steps: The number of microbatches.
        accumulator: A fresh MetricAccumulator.

    Returns:
        The tree with each Summary leaf replaced by its accumulated value.
    """
    leaves, treedef = jax.tree.flatten(stacked, is_leaf=_is_summary)
    if not leaves:
        return stacked
    keys = [f"{j:08d}" for j in range(len(leaves))]
    for i in range(steps):
        accumulator.update(
            {k: jax.tree.map(lambda x, i=i: x[i], leaf) for k, leaf in zip(keys, leaves)}
        )
    accumulated = accumulator.summaries()
    return jax.tree.unflatten(treedef, [accumulated[k] for k in keys])


def _split_minibatches(input_batch: Nested[Tensor], steps: int) -> Nested[Tensor]:
    """Reshapes each [B, ...] leaf to [steps, B // steps, ...], minibatch i = examples i::steps."""
    for path, x in flatten_items(input_batch):
        if not getattr(x, "shape", ()):
            raise ValueError(
                f"with_minibatch_steps: input_batch leaf {path!r} has no batch axis "
                f"(shape {getattr(x, 'shape', ())})."
            )
    sizes = {x.shape[0] for x in jax.tree.leaves(input_batch)}
    if not sizes:
        raise ValueError("with_minibatch_steps: the input batch is empty.")
    if len(sizes) > 1:
        raise ValueError(f"with_minibatch_steps: ambiguous batch sizes {sorted(sizes)}.")
    (size,) = sizes
    if size % steps:
        raise ValueError(
            f"with_minibatch_steps: batch size {size} must be divisible by steps={steps}."
        )

    def split(x):
        x = x.reshape((size // steps, steps) + x.shape[1:])
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(split, input_batch)


def with_minibatch_steps(
    *,
    steps: int,
    metric_accumulator: Optional[ConfigOr[MetricAccumulator]] = None,
    grad_dtype: Optional[Any] = None,
    minibatch_partitioner: Optional[ConfigOr[Callable[[Nested[Tensor]], Nested[Tensor]]]] = None,
) -> Callable[[Callable], Callable]:
    """Returns a ForwardFn transformation that accumulates gradients over `steps` microbatches.

    The returned function maps `fn(*, model_params, inputs) -> ForwardOutputs` to a function of
    the same signature that is differentiable with respect to `model_params` (a custom VJP: the
    gradients are computed microbatch by microbatch in the forward pass and accumulated in
    float32). `inputs["input_batch"]` is split; other entries of `inputs` are passed to every
    microbatch, except PRNG keys "forward_key" and "param_noise_key", which are split so that
    each microbatch gets its own.

    Args:
        steps: The number of microbatches (>= 1); must divide the batch size.
        metric_accumulator: The MetricAccumulator (or its config) that combines the `Summary`
            summaries of the microbatches; default: `MetricAccumulator.default_config()`.
        grad_dtype: Optional dtype to cast the accumulated gradients to (default: the params').
        minibatch_partitioner: Optional function (or config) applied to each microbatch, e.g. to
            add sharding constraints.

    Returns:
        The ForwardFn transformation.

    Raises:
        ValueError: If steps < 1.
    """
    if steps < 1:
        raise ValueError(f"with_minibatch_steps: steps must be >= 1, got {steps}.")
    partitioner = maybe_instantiate(minibatch_partitioner) or (lambda x: x)
    if metric_accumulator is None:
        metric_accumulator = MetricAccumulator.default_config()

    def new_accumulator() -> MetricAccumulator:
        # A fresh accumulator per call: MetricAccumulator keeps state.
        if isinstance(metric_accumulator, MetricAccumulator):
            return type(metric_accumulator)(metric_accumulator.config)
        return maybe_instantiate(metric_accumulator)

    def transformation(fn: Callable) -> Callable:
        def loss_and_outputs(model_params, inputs):
            outputs = fn(model_params=model_params, inputs=inputs)
            return outputs.loss, outputs

        def split_outputs(outputs):
            """Returns (outputs with only the non-Summary summaries, the Summary summaries)."""
            summary_part, plain_part = _split_summaries(outputs.output_collection.summaries)
            collection = outputs.output_collection._replace(summaries=plain_part)
            return outputs._replace(output_collection=collection), summary_part

        def run(model_params, inputs, compute_grad: bool):
            minibatches = _split_minibatches(inputs["input_batch"], steps)
            keys = {k: inputs[k] for k in ("forward_key", "param_noise_key") if k in inputs}
            others = {k: v for k, v in inputs.items() if k != "input_batch" and k not in keys}
            split_keys = {k: jax.random.split(v, steps) for k, v in keys.items()}

            def minibatch_inputs(batch, mb_keys):
                return dict(others, input_batch=partitioner(batch), **mb_keys)

            # Shapes of one microbatch's (averaged) outputs, for the scan carry.
            sample = jax.tree.map(lambda x: x[0], (minibatches, split_keys))
            out_shape = jax.eval_shape(
                lambda p, i: split_outputs(loss_and_outputs(p, i)[1])[0],
                model_params,
                minibatch_inputs(*sample),
            )
            zero_outputs = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)
            zero_outputs = jax.tree.map(
                lambda x: type(x)(x.mean, jnp.zeros_like(x.weight)) if _is_weighted(x) else x,
                zero_outputs,
                is_leaf=_is_weighted,
            )
            zero_grads = (
                jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), model_params)
                if compute_grad
                else None
            )

            def add(acc, new):
                return jax.tree.map(
                    lambda a, b: a + b if _is_weighted(a) else a + b.astype(a.dtype),
                    acc,
                    new,
                    is_leaf=_is_weighted,
                )

            def body(carry, xs):
                acc_outputs, acc_grads = carry
                batch, mb_keys = xs
                mb_inputs = minibatch_inputs(batch, mb_keys)
                if compute_grad:
                    (_, outputs), grads = jax.value_and_grad(loss_and_outputs, has_aux=True)(
                        model_params, mb_inputs
                    )
                    acc_grads = jax.tree.map(
                        lambda a, g: a + g.astype(jnp.float32), acc_grads, grads
                    )
                else:
                    _, outputs = loss_and_outputs(model_params, mb_inputs)
                outputs, summaries = split_outputs(outputs)
                # Summary summaries are stacked (scan outputs) and accumulated after the scan.
                return (add(acc_outputs, outputs), acc_grads), summaries

            (outputs, grads), stacked = jax.lax.scan(
                body, (zero_outputs, zero_grads), (minibatches, split_keys)
            )
            outputs = jax.tree.map(
                lambda x: x if _is_weighted(x) else (x / steps).astype(x.dtype),
                outputs,
                is_leaf=_is_weighted,
            )
            accumulated = _accumulate_stacked(stacked, steps=steps, accumulator=new_accumulator())
            summaries = jax.tree.map(
                lambda s, p: s if _is_summary(s) else p,
                accumulated,
                outputs.output_collection.summaries,
                is_leaf=lambda x: x is None or _is_summary(x),
            )
            outputs = outputs._replace(
                output_collection=outputs.output_collection._replace(summaries=summaries)
            )
            if compute_grad:
                grads = jax.tree.map(lambda g: g / steps, grads)
                if grad_dtype is not None:
                    grads = cast_floats(grads, grad_dtype)
                else:
                    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, model_params)
            return outputs, grads

        @jax.custom_vjp
        def accumulated(model_params, inputs):
            return run(model_params, inputs, compute_grad=False)[0]

        def accumulated_fwd(model_params, inputs):
            outputs, grads = run(model_params, inputs, compute_grad=True)
            return outputs, grads

        def accumulated_bwd(grads, outputs_cotangent):
            # Only the loss is differentiated: d(loss)/d(params) scaled by the loss cotangent.
            ct = outputs_cotangent.loss
            param_grads = jax.tree.map(lambda g: (g * ct).astype(g.dtype), grads)
            return param_grads, None

        accumulated.defvjp(accumulated_fwd, accumulated_bwd)

        def wrapped(model_params, inputs):
            # Positional or keyword arguments, like a plain ForwardFn called by pjit.
            return accumulated(model_params, inputs)

        return wrapped

    return transformation
