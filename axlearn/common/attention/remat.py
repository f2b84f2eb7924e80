"""Regexes of remat (checkpoint) names for `save_and_offload_only_these_names_regex` policies.

Public names are re-exported by `axlearn.common.attention`. Layers tag activations with
`BaseLayer._remat_name` as f"{ClassName}.{name}", e.g. "GroupedQueryAttention.q_proj",
"TransformerFeedForwardLayer.linear1_0"; these patterns fully match such names.
"""

import enum


class RematRegexSavePatterns(enum.Enum):
    """Named regexes of activations to save (or offload) in rematerialized layers."""

    QKV_PROJ = r".*[kqv]_proj"  # Query, key and value projections.
    O_PROJ = r".*o_proj"  # The attention output projection.
    CONTEXT = r".*context"  # The attention context (before the output projection).
    LINEAR1_X = r".*linear1_[01]"  # The (gated) first feed-forward projections.
    LINEAR2_X = r".*linear2"  # The second feed-forward projection.
    # Everything of self-attention (the default of `build_remat_spec`).
    SELF_ATTENTION = r".*([qkvo]_proj|context)"
    # Both feed-forward projections.
    FEED_FORWARD = r".*(linear1_[01]|linear2)"
