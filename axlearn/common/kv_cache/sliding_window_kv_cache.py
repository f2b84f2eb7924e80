"""Sliding-window attention for an attention config: `enable_sliding_window_attention`.

`enable_sliding_window_attention(cfg, sliding_window_size)` returns a copy of an attention
layer's config (`MultiheadAttention` and its subclasses) whose mask is
`SlidingWindowAttentionBias.default_config(sliding_window_size=...)`: a query at position q
attends to keys at positions `q - sliding_window_size ... q`. The causal flag is cleared (the
sliding-window mask is causal itself).

Difference from AXLearn: AXLearn also switches the decoding cache to a rolling cache of
`sliding_window_size` slots. Here decoding keeps the layer's dense KV cache (the same outputs;
the cache still holds `max_len` positions), see docs/axlearn_differences.md.
"""

from axlearn.common.attention_bias import SlidingWindowAttentionBias
from axlearn.common.config import ConfigBase


def enable_sliding_window_attention(cfg: ConfigBase, sliding_window_size: int) -> ConfigBase:
    """Returns a copy of the attention config `cfg` with a sliding-window causal mask.

    Args:
        cfg: An attention layer config with `mask` and `causal` fields (e.g.
            `MultiheadAttention.Config`).
        sliding_window_size: How many previous positions each query sees besides itself (>= 0).

    Returns:
        The modified copy.

    Raises:
        ValueError: If `cfg` has no `mask` field or the window size is negative.
    """
    if "mask" not in cfg:
        raise ValueError(
            f"enable_sliding_window_attention needs an attention config with a `mask` field "
            f"(e.g. MultiheadAttention.Config), got {type(cfg).__name__}"
        )
    if not isinstance(sliding_window_size, int) or sliding_window_size < 0:
        raise ValueError(f"sliding_window_size must be an int >= 0, got {sliding_window_size!r}")
    cfg = cfg.clone()
    if "causal" in cfg:
        cfg.causal = False
    cfg.mask = SlidingWindowAttentionBias.default_config(sliding_window_size=sliding_window_size)
    return cfg
