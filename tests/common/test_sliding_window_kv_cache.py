"""Tests of kv_cache.sliding_window_kv_cache.enable_sliding_window_attention."""

import jax
import numpy as np
import pytest

from axlearn.common.attention import MultiheadAttention
from axlearn.common.attention_bias import NEG_INF
from axlearn.common.kv_cache.sliding_window_kv_cache import enable_sliding_window_attention
from axlearn.common.layers import Linear
from axlearn.common.module import functional


def test_enable_sliding_window_attention_matches_explicit_biases():
    base = MultiheadAttention.default_config().set(
        name="attn", query_dim=8, key_dim=8, value_dim=8, num_heads=2, causal=True
    )
    cfg = enable_sliding_window_attention(base, 2)
    assert base.causal and base.mask is None  # The input config is unchanged.
    assert not cfg.causal
    layer = cfg.instantiate(parent=None)
    ref = base.clone(causal=False).instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 6, 8))
    q, k = np.arange(6)[:, None], np.arange(6)[None, :]
    # NumPy reference mask: itself and the 2 previous positions.
    biases = np.where((q >= k) & (q - k <= 2), 0.0, NEG_INF).astype(np.float32)
    outs = []
    for lyr, bias in ((layer, None), (ref, biases)):
        out, _ = functional(
            lyr,
            jax.random.PRNGKey(2),
            params,
            dict(query=x, attention_logit_biases=bias),
            is_training=False,
        )
        outs.append(out.data)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6)


def test_enable_sliding_window_attention_errors():
    with pytest.raises(ValueError, match="needs an attention config with a `mask` field"):
        enable_sliding_window_attention(Linear.default_config(), 2)
    with pytest.raises(ValueError, match="sliding_window_size must be an int >= 0, got -1"):
        enable_sliding_window_attention(MultiheadAttention.default_config(), -1)
