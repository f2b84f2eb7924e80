"""axlearn/common/attention_bias.py: make_causal_biases, make_sliding_window_causal_biases."""

import numpy as np

from axlearn.common.attention_bias import (
    NEG_INF,
    make_causal_biases,
    make_sliding_window_causal_biases,
)


def test_make_causal_biases_hand_computed():
    n = np.float32(NEG_INF)
    np.testing.assert_array_equal(
        make_causal_biases(4),
        [[0, n, n, n], [0, 0, n, n], [0, 0, 0, n], [0, 0, 0, 0]],
    )
    assert make_causal_biases(4).shape == (4, 4)


def test_make_sliding_window_causal_biases_hand_computed():
    n = np.float32(NEG_INF)
    # Each query sees itself and one earlier key.
    np.testing.assert_array_equal(
        make_sliding_window_causal_biases(4, sliding_window_size=1),
        [[0, n, n, n], [0, 0, n, n], [n, 0, 0, n], [n, n, 0, 0]],
    )
