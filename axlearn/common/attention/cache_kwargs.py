"""Lets a decoding layer's `init_states` create an empty cache from sizes instead of a spec.

`layer.init_states(batch_size=B, max_len=L, dtype=jnp.bfloat16)` returns the empty state of
`layer.init_states(time_step=None, data=jax.ShapeDtypeStruct((B, L, input_dim), ...))` (the state
only, as AXLearn's form does, not a (state, None) pair) where `dtype` (default: the layer
dtype) is the activation dtype: caches store in it unless their `cache_dtype` says otherwise.
The `time_step=`/`data=` form keeps returning (state, output).
"""

import functools
from typing import Any, Callable, Optional

import jax

from axlearn.common.module import current_context, functional


def accepts_empty_cache_kwargs(*, input_name: str, dim_field: str) -> Callable:
    """Decorates `init_states(self, *, time_step, <input_name>, **kwargs)`.

    Args:
        input_name: The keyword of the input tensor (e.g. "data" or "query").
        dim_field: The config field holding the input feature dim (e.g. "input_dim").

    Returns:
        A decorator adding the keyword-only `batch_size`, `max_len` and `dtype` arguments (with
        them, the decorated method returns the empty state only).
    """

    def decorator(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def init_states(
            self,
            *,
            batch_size: Optional[int] = None,
            max_len: Optional[int] = None,
            dtype: Optional[Any] = None,
            **kwargs,
        ):
            if batch_size is None and max_len is None and dtype is None:
                return fn(self, **kwargs)
            if batch_size is None or max_len is None:
                raise ValueError(
                    f"{self.path()}.init_states: batch_size and max_len go together, got "
                    f"batch_size={batch_size}, max_len={max_len}"
                )
            if kwargs.get("time_step") is not None or kwargs.get(input_name) is not None:
                raise ValueError(
                    f"{self.path()}.init_states: batch_size/max_len create an empty cache; "
                    f"do not also pass time_step or {input_name}"
                )
            kwargs.update(time_step=None)
            kwargs.update(_sizes_input(self, input_name, dim_field, batch_size, max_len, dtype))
            if current_context() is None:
                # Called directly on the layer (not inside `functional`): an empty cache needs
                # no parameters, so it runs in a parameterless root context.
                (state, _), _ = functional(
                    self, None, None, kwargs, method=fn.__name__, is_training=False
                )
                return state
            state, _ = fn(self, **kwargs)
            return state

        return init_states

    return decorator


def _sizes_input(layer, input_name: str, dim_field: str, batch_size: int, max_len: int, dtype):
    """{input_name: ShapeDtypeStruct [batch_size, max_len, dim]} in `dtype` (or the layer's)."""
    dim = getattr(layer.config, dim_field)
    return {input_name: jax.ShapeDtypeStruct((batch_size, max_len, dim), dtype or layer.dtype())}
