"""Dtype checks re-exported by `axlearn.common.utils`: `validate_float_dtype`."""

import jax.numpy as jnp

# The float dtypes parameters and activations may use.
_SUPPORTED_FLOAT_DTYPES = (jnp.float32, jnp.bfloat16)


def validate_float_dtype(dtype) -> None:
    """Raises unless `dtype` is float32 or bfloat16 (float16 is not supported).

    Args:
        dtype: A dtype (or a value jnp.dtype accepts).

    Raises:
        ValueError: Naming the dtype and the supported float dtypes.
    """
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in _SUPPORTED_FLOAT_DTYPES]:
        raise ValueError(
            f"Unsupported float dtype {jnp.dtype(dtype).name}: use float32 or bfloat16"
        )
