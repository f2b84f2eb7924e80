"""Tests trainer.aot_model_analysis against XLA's memory analysis numbers."""

import jax
import jax.numpy as jnp
import pytest

from axlearn.common.trainer import NonFiniteLossError, UndefinedLossException, aot_model_analysis


def test_aliased_buffer_counted_once():
    state = jnp.zeros((512, 512), jnp.float32)  # 1 MiB.
    compiled = jax.jit(lambda s, d: s + d, donate_argnums=(0,)).lower(state, state).compile()
    stats = compiled.memory_analysis()
    if stats is None:
        pytest.skip("No memory analysis on this platform.")
    text = aot_model_analysis(compiled)
    assert f"Aliased input/output memory: {stats.alias_size_in_bytes / 2**20:.1f}MB" in text
    total = (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
        + stats.temp_size_in_bytes
        + stats.generated_code_size_in_bytes
    )
    assert f"Total HBM memory: {total / 2**20:.1f}MB" in text
    assert f"Argument memory: {2.0:.1f}MB" in text  # Two 1 MiB arguments.


def test_undefined_loss_exception_is_our_error():
    assert UndefinedLossException is NonFiniteLossError
    with pytest.raises(UndefinedLossException, match="loss is nan"):
        raise NonFiniteLossError(step=3, loss=float("nan"))
