"""Attention layers, transformer layers and transformer stacks.

The implementation is split over submodules (qkv, scale, multihead, transformer, stack,
bias_layers); every public name lives at `axlearn.common.attention.<Name>`, which is also its
`__module__`, so configs dump it as e.g. 'axlearn.common.attention.GroupedQueryAttention'.

Parameter paths follow child names, e.g. for a decoder layer:
`self_attention/norm/scale`, `self_attention/attention/i_proj/i_proj/qkv_proj/weight`
(RoFormerQKVLinear wrapping FusedGroupedQKVLinear), `self_attention/attention/o_proj/weight`,
`self_attention/attention/scale_query/norm/scale` (QK-norm), `feed_forward/linear1_0/weight`,
`feed_forward/linear1_1/weight`, `feed_forward/linear2/weight`, `feed_forward/norm/scale`.
"""

from axlearn.common.attention.adapter import BottleNeckAdapterTransformerLayer
from axlearn.common.attention.bias_layers import (
    ALiBiAttentionLogitBiasLayer,
    AttentionLogitBiasLayer,
    CausalAttentionLogitBiasLayer,
    ForwardMode,
    FullAttentionLogitBiasLayer,
    alibi_get_slopes,
)
from axlearn.common.attention.multihead import (
    FlashAttention,
    GroupedQueryAttention,
    MultiheadAttention,
)
from axlearn.common.attention.parallel import ParallelTransformerLayer
from axlearn.common.attention.pipelined import (
    SCHEDULES,
    PipelinedTransformerLayer,
    _TransformerPipeline,
    pipelined_stack_config,
    schedule_config,
)
from axlearn.common.attention.q_linear import KVState, QLinear
from axlearn.common.attention.qkv import (
    BaseMultiheadLinear,
    BaseQKVLinear,
    FusedGroupedQKVLinear,
    FusedQKVLinear,
    GroupedQKVLinear,
    MultiheadInputLinear,
    MultiheadOutputLinear,
    QKVLinear,
    RoFormerQKVLinear,
    RoFormerSinusoidalPositionalEmbedding,
    apply_rotary_position_embeddings,
)
from axlearn.common.attention.remat import RematRegexSavePatterns
from axlearn.common.attention.scale import (
    BaseScaleQK,
    PerDimScale,
    ScaleFn,
    ScaleKey,
    ScaleQuery,
    constant_scale_fn,
    pow_scale_fn,
)
from axlearn.common.attention.sharding import (
    set_attention_partition_specs,
    set_double_shard_weights_config,
    set_feed_forward_partition_specs,
)
from axlearn.common.attention.sigmoid import SigmoidAttention
from axlearn.common.attention.skip import update_data_with_skip_connection
from axlearn.common.attention.softmax import softmax_with_biases
from axlearn.common.attention.stack import (
    REMAT_CHOICES,
    BaseStackedTransformerLayer,
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    _save_and_offload_only_these_names_regex,
    _TransformerRepeat,
    build_remat_spec,
    remat_choices_of,
    remat_name_of,
    remat_spec_by_name,
)
from axlearn.common.attention.transformer import (
    BaseTransformerLayer,
    NormPosition,
    TransformerAttentionLayer,
    TransformerFeedForwardLayer,
    TransformerLayer,
    scaled_hidden_dim,
)
from axlearn.common.attention.xl import (
    MultiheadAttentionXL,
    MultiheadRelativePositionLinear,
    SinusoidalPositionalEmbedding,
    rel_pos_to_abs_pos,
    xl_attention_logits,
)
from axlearn.common.attention_bias import (
    NEG_INF,
    CausalAttentionBias,
    apply_attention_logit_biases,
    causal_mask,
    compute_padding_biases,
    make_causal_biases,
    make_segment_mask,
    sliding_window_causal_mask,
)

# AXLearn defines LearnedPositionalEmbedding in `attention`; ours lives in `embedding` (its dumped
# name stays `axlearn.common.embedding.LearnedPositionalEmbedding`) and is importable from here.
from axlearn.common.embedding import LearnedPositionalEmbedding
from axlearn.common.kv_cache.kv_cache import KVCache


def _claim_public_names():
    """Sets `__module__` of names defined in the submodules to this package's name."""
    for value in list(globals().values()):
        module = getattr(value, "__module__", None)
        if isinstance(module, str) and module.startswith(__name__ + "."):
            try:
                value.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_claim_public_names()


def _next_power_of_two(x: float) -> int:
    """The smallest power of two >= x, and at least 2 (e.g. 300 -> 512, 128 -> 128, 0.1 -> 2)."""
    power = 2
    while power < x:
        power *= 2
    return power


__all__ = [
    "CausalAttentionBias",
    "BottleNeckAdapterTransformerLayer",
    "MultiheadAttentionXL",
    "MultiheadRelativePositionLinear",
    "ParallelTransformerLayer",
    "SinusoidalPositionalEmbedding",
    "rel_pos_to_abs_pos",
    "update_data_with_skip_connection",
    "xl_attention_logits",
    "LearnedPositionalEmbedding",
    "ALiBiAttentionLogitBiasLayer",
    "ForwardMode",
    "alibi_get_slopes",
    "_TransformerPipeline",
    "_TransformerRepeat",
    "_save_and_offload_only_these_names_regex",
    "AttentionLogitBiasLayer",
    "BaseMultiheadLinear",
    "BaseQKVLinear",
    "BaseScaleQK",
    "BaseStackedTransformerLayer",
    "BaseTransformerLayer",
    "CausalAttentionLogitBiasLayer",
    "FlashAttention",
    "FullAttentionLogitBiasLayer",
    "FusedGroupedQKVLinear",
    "FusedQKVLinear",
    "GroupedQKVLinear",
    "KVCache",
    "GroupedQueryAttention",
    "KVState",
    "MultiheadAttention",
    "NormPosition",
    "MultiheadInputLinear",
    "MultiheadOutputLinear",
    "NEG_INF",
    "PerDimScale",
    "PipelinedTransformerLayer",
    "QKVLinear",
    "QLinear",
    "REMAT_CHOICES",
    "RematRegexSavePatterns",
    "RepeatedTransformerLayer",
    "RoFormerQKVLinear",
    "RoFormerSinusoidalPositionalEmbedding",
    "ScaleFn",
    "ScaleKey",
    "ScaleQuery",
    "SigmoidAttention",
    "StackedTransformerLayer",
    "TransformerAttentionLayer",
    "TransformerFeedForwardLayer",
    "TransformerLayer",
    "apply_attention_logit_biases",
    "apply_rotary_position_embeddings",
    "build_remat_spec",
    "causal_mask",
    "compute_padding_biases",
    "constant_scale_fn",
    "make_causal_biases",
    "make_segment_mask",
    "pipelined_stack_config",
    "schedule_config",
    "SCHEDULES",
    "pow_scale_fn",
    "remat_choices_of",
    "remat_name_of",
    "remat_spec_by_name",
    "scaled_hidden_dim",
    "set_attention_partition_specs",
    "set_double_shard_weights_config",
    "set_feed_forward_partition_specs",
    "sliding_window_causal_mask",
    "softmax_with_biases",
]
