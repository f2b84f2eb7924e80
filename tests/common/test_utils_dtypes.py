"""Tests of utils.validate_float_dtype."""

import jax.numpy as jnp
import pytest

from axlearn.common import utils


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, "float32"])
def test_supported(dtype):
    utils.validate_float_dtype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.int32, jnp.float64])
def test_unsupported(dtype):
    with pytest.raises(ValueError, match="Unsupported float dtype"):
        utils.validate_float_dtype(dtype)
