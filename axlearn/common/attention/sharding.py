"""Partition-spec helpers for transformer layer configs (AXLearn's `set_*` helpers).

Public names are re-exported by `axlearn.common.attention`. Each helper edits configs in place:

- `set_attention_partition_specs`: the QKV projection weight [model_dim, heads, head_dim] and
  the output projection weight are sharded (fsdp axes, tensor-parallel axes, None).
- `set_feed_forward_partition_specs`: linear1 weights (fsdp, tp), linear2 weights (tp, fsdp),
  and both outputs (batch, seq, tp).
- `set_double_shard_weights_config`: both, for every attention and feed-forward of (a sequence
  of) transformer layer configs ("double sharding": weights over fsdp and tp axes).
"""

from collections.abc import Sequence
from typing import Union

from axlearn.common.config import ConfigBase

AxisNames = Union[str, Sequence[str]]


def _qkv_linear(input_linear: ConfigBase) -> ConfigBase:
    """The innermost projection config of a (possibly RoPE-wrapped) QKV linear config."""
    while hasattr(input_linear, "input_linear"):
        input_linear = input_linear.input_linear
    return input_linear


def set_attention_partition_specs(
    cfg: ConfigBase,
    *,
    fsdp_axis_names: AxisNames = "fsdp",
    tp_axis_names: AxisNames = "model",
) -> None:
    """Shards the projection weights of an attention config over fsdp and tp axes.

    Args:
        cfg: A MultiheadAttention (or subclass) config.
        fsdp_axis_names: Axis name(s) sharding the model-dim side of the weights.
        tp_axis_names: Axis name(s) sharding the heads.

    Raises:
        ValueError: If the QKV config has no projection layer config.
    """
    qkv = _qkv_linear(cfg.input_linear)
    layers = [getattr(qkv, name) for name in ("layer",) if hasattr(qkv, name)]
    if not layers:
        raise ValueError(f"QKV linear config {type(qkv).__name__} has no `layer` to shard")
    for layer in layers:
        layer.param_partition_spec = (fsdp_axis_names, tp_axis_names, None)
    cfg.output_linear.param_partition_spec = (fsdp_axis_names, tp_axis_names, None)


def set_feed_forward_partition_specs(
    cfg: ConfigBase,
    *,
    batch_axis_names: AxisNames = ("data", "fsdp"),
    fsdp_axis_names: AxisNames = "fsdp",
    tp_axis_names: AxisNames = "model",
    seq_axis_names: AxisNames = "seq",
) -> None:
    """Shards the weights and outputs of a TransformerFeedForwardLayer config.

    Args:
        cfg: A TransformerFeedForwardLayer config.
        batch_axis_names: Axis name(s) sharding the batch axis of the outputs.
        fsdp_axis_names: Axis name(s) sharding the model-dim side of the weights.
        tp_axis_names: Axis name(s) sharding the hidden dim.
        seq_axis_names: Axis name(s) sharding the sequence axis of the outputs.
    """
    cfg.linear1.param_partition_spec = (fsdp_axis_names, tp_axis_names)
    cfg.linear2.param_partition_spec = (tp_axis_names, fsdp_axis_names)
    cfg.linear1.output_partition_spec = (batch_axis_names, seq_axis_names, tp_axis_names)
    cfg.linear2.output_partition_spec = (batch_axis_names, seq_axis_names, tp_axis_names)


def set_double_shard_weights_config(
    cfg: Union[ConfigBase, Sequence[ConfigBase]],
    *,
    batch_axis_names: AxisNames = ("data", "fsdp"),
    fsdp_axis_names: AxisNames = "fsdp",
    tp_axis_names: AxisNames = "model",
    seq_axis_names: AxisNames = "seq",
) -> None:
    """Shards the attention and feed-forward weights of transformer layer config(s).

    Feed-forward configs that are not TransformerFeedForwardLayer-like (no linear1/linear2,
    e.g. a mixture of experts) are left alone.

    Args:
        cfg: A TransformerLayer config or a sequence of them.
        batch_axis_names: Axis name(s) sharding the batch axis of outputs.
        fsdp_axis_names: Axis name(s) for fully-sharded data parallelism.
        tp_axis_names: Axis name(s) for tensor parallelism.
        seq_axis_names: Axis name(s) for sequence parallelism.
    """
    layers = list(cfg) if isinstance(cfg, (list, tuple)) else [cfg]
    for layer in layers:
        set_attention_partition_specs(
            layer.self_attention.attention,
            fsdp_axis_names=fsdp_axis_names,
            tp_axis_names=tp_axis_names,
        )
        if getattr(layer, "cross_attention", None) is not None:
            set_attention_partition_specs(
                layer.cross_attention.attention,
                fsdp_axis_names=fsdp_axis_names,
                tp_axis_names=tp_axis_names,
            )
        ff = layer.feed_forward
        if hasattr(ff, "linear1") and hasattr(ff, "linear2"):
            set_feed_forward_partition_specs(
                ff,
                batch_axis_names=batch_axis_names,
                fsdp_axis_names=fsdp_axis_names,
                tp_axis_names=tp_axis_names,
                seq_axis_names=seq_axis_names,
            )
