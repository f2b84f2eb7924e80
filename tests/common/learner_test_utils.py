"""Shared helpers for the learner tests: a jitted `forward_and_backward` step."""

from __future__ import annotations

from typing import Any, Callable

import jax

from axlearn.common.module import functional as F
from axlearn.common.optimizer_base import OptParam

KEY = jax.random.PRNGKey(0)


def opt_params(params: Any) -> Any:
    """Wraps every parameter as an OptParam without factorization or weight-decay scale."""
    return jax.tree.map(lambda v: OptParam(v, None, None), params)


def forward_and_backward_step(learner: Any, fn: Callable) -> Callable:
    """A jitted (params, state, batch) -> (outputs, output collection) step.

    Args:
        learner: An instantiated learner.
        fn: The forward function `fn(*, model_params, inputs) -> ForwardOutputs`; `inputs` is
            `{"input_batch": batch}`.

    Returns:
        The step, running `learner.forward_and_backward` with PRNG key KEY in training mode.
    """

    @jax.jit
    def step(params, state, batch):
        return F(
            learner,
            method="forward_and_backward",
            prng_key=KEY,
            state=state,
            inputs=dict(fn=fn, opt_params=opt_params(params), inputs=dict(input_batch=batch)),
            is_training=True,
        )

    return step
