"""axlearn/common/attention/bias_layers.py: ALiBi biases, alibi_get_slopes, ForwardMode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import attention
from axlearn.common.attention import (
    ALiBiAttentionLogitBiasLayer,
    ForwardMode,
    alibi_get_slopes,
)
from axlearn.common.attention_bias import NEG_INF
from axlearn.common.module import functional


def test_alibi_slopes_hand_computed():
    # Powers of two: 2 ** (-8 / n * (h + 1)).
    assert alibi_get_slopes(8) == [2.0**-k for k in range(1, 9)]
    np.testing.assert_allclose(alibi_get_slopes(4), [2**-2, 2**-4, 2**-6, 2**-8])
    # 6 heads: the 4-head slopes, then every other 8-head slope (2 of them).
    np.testing.assert_allclose(alibi_get_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    with pytest.raises(ValueError, match="num_heads must be positive, got 0"):
        alibi_get_slopes(0)


def test_alibi_layer_biases_match_numpy():
    layer = (
        ALiBiAttentionLogitBiasLayer.default_config()
        .set(name="alibi", num_heads=2)
        .instantiate(parent=None)
    )
    assert str(type(layer)) == "<class 'axlearn.common.attention.ALiBiAttentionLogitBiasLayer'>"
    segment_ids = jnp.asarray([[1, 1, 1, 2]])
    positions = jnp.asarray([[0, 1, 2, 0]])
    bias, _ = functional(
        layer,
        jax.random.PRNGKey(0),
        {},
        dict(segment_ids=segment_ids, positions=positions),
        is_training=False,
    )
    assert bias.shape == (1, 2, 4, 4)
    slopes = [2**-4, 2**-8]
    pos = np.asarray(positions[0])
    seg = np.asarray(segment_ids[0])
    for h in range(2):
        for i in range(4):
            for j in range(4):
                # The causal and the segment masks add up (as in AXLearn).
                mask = NEG_INF * (pos[j] > pos[i]) + NEG_INF * (seg[i] != seg[j])
                want = slopes[h] * (pos[j] - pos[i]) + mask
                np.testing.assert_allclose(bias[0, h, i, j], want, rtol=1e-6)


def test_forward_mode_members():
    assert [m.name for m in ForwardMode] == ["FORWARD", "INIT_STATES", "EXTEND_STEP"]
    assert ForwardMode.EXTEND_STEP.value == 2 and attention.ForwardMode is ForwardMode
