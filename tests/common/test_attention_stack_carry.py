"""Tests of the transformer stacks' `carry` and `scan_kwargs` against a hand computation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import (
    BaseTransformerLayer,
    RepeatedTransformerLayer,
    StackedTransformerLayer,
)
from axlearn.common.module import functional


class _AffineLayer(BaseTransformerLayer):
    """data -> 2 * data + offset (+ the previous layer's self_attention_probs, if passed)."""

    def forward(self, data, *, offset=0.0, self_attention_probs=None):
        out = 2 * data + offset
        if self_attention_probs is not None:
            out = out + self_attention_probs
        return BaseTransformerLayer.Output(data=out, self_attention_probs=data)


def _stack(cls, **kwargs):
    cfg = cls.default_config().set(
        name="stack", input_dim=1, num_layers=3, layer=_AffineLayer.default_config(), **kwargs
    )
    return cfg.instantiate(parent=None)


def _run(layer, **inputs):
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    out, _ = functional(layer, jax.random.PRNGKey(1), params, inputs, is_training=False)
    return out


@pytest.mark.parametrize("cls", [StackedTransformerLayer, RepeatedTransformerLayer])
def test_scan_kwargs_slice_per_layer(cls):
    layer = _stack(cls, scan_kwargs=("offset",))
    offsets = jnp.array([1.0, 10.0, 100.0])
    out = _run(layer, data=jnp.zeros((2, 1)), offset=offsets)
    # ((0 * 2 + 1) * 2 + 10) * 2 + 100.
    np.testing.assert_allclose(out.data, np.full((2, 1), 124.0))
    with pytest.raises(ValueError, match="stack.scan_kwargs names \\['offset'\\]"):
        _run(layer, data=jnp.zeros((2, 1)))


def test_stacked_carry_passes_output_fields():
    layer = _stack(StackedTransformerLayer, carry=("data", "self_attention_probs"))
    out = _run(layer, data=jnp.ones((1,)))
    # x0 = 1; x1 = 2; x2 = 2 * 2 + 1 (layer 0's input) = 5; x3 = 2 * 5 + 2 = 12.
    np.testing.assert_allclose(out.data, [12.0])
    plain = _run(_stack(StackedTransformerLayer, carry=("data",)), data=jnp.ones((1,)))
    np.testing.assert_allclose(plain.data, [8.0])


def test_carry_errors():
    with pytest.raises(ValueError, match="stack.carry=\\('self_attention_probs',\\) must include"):
        _stack(StackedTransformerLayer, carry=("self_attention_probs",))
    with pytest.raises(ValueError, match="must include 'data'"):
        _stack(StackedTransformerLayer, carry=("data", "nope"))
    with pytest.raises(NotImplementedError, match="carries only 'data'"):
        _stack(RepeatedTransformerLayer, carry=("data", "self_attention_probs"))
