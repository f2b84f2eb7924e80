"""Conformer layers (Gulati et al., 2020, https://arxiv.org/abs/2005.08100).

A `ConformerLayer` is a macaron pair of half-step feed-forward layers around multi-head
self-attention with XL-style relative positions and a lightweight convolution module:

    x = x + 0.5 * ff_start(x)
    x = self_attention(x)          # pre-norm residual, MultiheadAttentionXL by default
    x = lconv(x)                   # LConvLayer, residual inside
    x = x + 0.5 * ff_end(x)
    y = norm(x) * (segment_ids != 0)

`layer_order` moves the convolution module before the first feed-forward layer
("lconv_before_ff") or before the attention ("lconv_before_mhsa"); the default is
"mhsa_before_lconv". Inputs are [batch, seq_len, input_dim] with `segment_ids`
[batch, seq_len] (int32, 0 marks padding); padded positions of the outputs are zero and never
influence the others.
"""

from collections.abc import Sequence
from typing import Literal, Optional, Union

from jax import numpy as jnp

from axlearn.common.attention import (
    MultiheadAttentionXL,
    TransformerAttentionLayer,
    TransformerFeedForwardLayer,
    scaled_hidden_dim,
    set_attention_partition_specs,
    set_feed_forward_partition_specs,
)
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.convolution import Conv1D
from axlearn.common.layers import (
    BatchNorm,
    Dropout,
    GroupNorm,
    LayerNorm,
    Linear,
    get_activation_fn,
)
from axlearn.common.module import Module
from axlearn.common.repeat import Repeat
from axlearn.common.utils import Tensor

_LAYER_ORDERS = ("lconv_before_ff", "lconv_before_mhsa", "mhsa_before_lconv")


def _check_segment_ids(path: str, segment_ids: Tensor):
    """Refuses segment ids that are not an int32 [batch, seq_len] tensor."""
    if getattr(segment_ids, "dtype", None) != jnp.int32 or segment_ids.ndim != 2:
        raise ValueError(
            f"{path}: segment_ids must be an int32 [batch, seq_len] tensor (0 marks padding), got "
            f"{getattr(segment_ids, 'dtype', type(segment_ids))} of shape "
            f"{getattr(segment_ids, 'shape', None)}; pass e.g. (paddings == 0).astype(jnp.int32)"
        )


def _non_padding(segment_ids: Tensor) -> Tensor:
    """[batch, seq_len] segment ids -> [batch, seq_len, 1] mask of the non-padding positions."""
    return (segment_ids != 0)[..., None]


class LConvLayer(BaseLayer):
    """The Conformer's lightweight convolution module, with a residual connection.

        y = linear1_norm(x)
        y = act0(linear1_0(y)) * act1(linear1_1(y))   # a GLU by default ("linear", sigmoid)
        y = conv_activation(conv_norm(conv(y * mask)))  # depthwise over time
        out = (x + dropout(linear2(y))) * mask

    Padded positions are zeroed before the convolution, and the norm sees the segment ids, so
    padding does not change the other positions.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures LConvLayer."""

        # Input (and output) feature dim.
        input_dim: Required[int] = REQUIRED
        # Feature groups of the convolution; None means input_dim (depthwise).
        num_input_dim_groups: Optional[int] = None
        # The norm before the first projections.
        linear1_norm: LayerNorm.Config = LayerNorm.default_config()
        # The activations of the two first projections, whose outputs are multiplied.
        linear1_activation: tuple[str, str] = ("linear", "nn.sigmoid")
        # The first projections (two copies, linear1_0 and linear1_1), input_dim -> input_dim.
        linear1: Linear.Config = Linear.default_config().set(bias=True)
        # The convolution over time.
        conv: Conv1D.Config = Conv1D.default_config().set(window=32, bias=False, padding="SAME")
        # The norm after the convolution (it receives the segment ids).
        conv_norm: Union[BatchNorm.Config, GroupNorm.Config] = BatchNorm.default_config()
        # The activation after conv_norm (Swish).
        conv_activation: str = "nn.silu"
        # The output projection, input_dim -> input_dim.
        linear2: Linear.Config = Linear.default_config().set(bias=True)
        # Dropout before the residual sum.
        dropout: Dropout.Config = Dropout.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if len(cfg.linear1_activation) != 2:
            raise ValueError(
                f"{self.path()}: linear1_activation={cfg.linear1_activation} must name two "
                "activations, e.g. ('linear', 'nn.sigmoid')"
            )
        dim = cfg.input_dim
        self._add_child("linear1_norm", cfg.linear1_norm.set(input_dim=dim))
        for i in range(2):
            self._add_child(f"linear1_{i}", cfg.linear1.clone(input_dim=dim, output_dim=dim))
        groups = dim if cfg.num_input_dim_groups is None else cfg.num_input_dim_groups
        self._add_child(
            "conv", cfg.conv.set(input_dim=dim, output_dim=dim, num_input_dim_groups=groups)
        )
        self._add_child("conv_norm", cfg.conv_norm.set(input_dim=dim))
        self._add_child("linear2", cfg.linear2.set(input_dim=dim, output_dim=dim))
        self._add_child("dropout", cfg.dropout)

    def forward(self, inputs: Tensor, *, segment_ids: Tensor) -> Tensor:
        """Computes the module's outputs.

        Args:
            inputs: [batch, seq_len, input_dim].
            segment_ids: int32 [batch, seq_len]; 0 marks padding.

        Returns:
            [batch, seq_len, input_dim], zero at padded positions.
        """
        cfg = self.config
        _check_segment_ids(self.path(), segment_ids)
        mask = _non_padding(segment_ids)
        x = self.linear1_norm(inputs)
        gated = None
        for i, activation in enumerate(cfg.linear1_activation):
            x_i = self._remat_name(self.children[f"linear1_{i}"](x), f"linear1_{i}")
            x_i = get_activation_fn(activation)(x_i)
            gated = x_i if gated is None else gated * x_i
        x = self.conv(gated * mask)
        x = self.conv_norm(x, segment_ids=segment_ids)
        x = get_activation_fn(cfg.conv_activation)(x)
        x = self._remat_name(self.linear2(x), "linear2")
        x = self.dropout(x)
        return (x + inputs) * mask


class ConformerLayer(BaseLayer):
    """One Conformer block: ff_start, self-attention, lconv, ff_end and a final norm.

    `default_config()` makes both feed-forward layers half-step (residual_weight 0.5) Swish
    layers of hidden dim 4 * input_dim, and the attention `MultiheadAttentionXL` (relative
    positions) with biased input projections.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures ConformerLayer."""

        # Input (and output) feature dim.
        input_dim: Required[int] = REQUIRED
        # The first (macaron) feed-forward layer.
        ff_start: TransformerFeedForwardLayer.Config = TransformerFeedForwardLayer.default_config()
        # The last (macaron) feed-forward layer.
        ff_end: TransformerFeedForwardLayer.Config = TransformerFeedForwardLayer.default_config()
        # The self-attention layer (pre-norm, residual).
        self_attention: TransformerAttentionLayer.Config = (
            TransformerAttentionLayer.default_config()
        )
        # The convolution module.
        lconv: LConvLayer.Config = LConvLayer.default_config()
        # The final norm.
        norm: LayerNorm.Config = LayerNorm.default_config()
        # Where the convolution module runs: "lconv_before_ff", "lconv_before_mhsa" or
        # "mhsa_before_lconv"; None means "mhsa_before_lconv" (the paper's order).
        layer_order: Optional[
            Literal["lconv_before_ff", "lconv_before_mhsa", "mhsa_before_lconv"]
        ] = None

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        for ff_cfg in (cfg.ff_start, cfg.ff_end):
            ff_cfg.hidden_dim = scaled_hidden_dim(scale=4)
            ff_cfg.residual_weight = 0.5
            ff_cfg.activation = "nn.silu"
        cfg.self_attention.attention = MultiheadAttentionXL.default_config()
        cfg.self_attention.attention.input_linear.layer.bias = True
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.layer_order is not None and cfg.layer_order not in _LAYER_ORDERS:
            raise ValueError(
                f"{self.path()}: layer_order={cfg.layer_order!r} must be None or one of "
                f"{_LAYER_ORDERS}"
            )
        dim = cfg.input_dim
        self._add_child("ff_start", cfg.ff_start.set(input_dim=dim))
        self._add_child("ff_end", cfg.ff_end.set(input_dim=dim))
        self._add_child("self_attention", cfg.self_attention.set(target_dim=dim, source_dim=dim))
        self._add_child("lconv", cfg.lconv.set(input_dim=dim))
        self._add_child("norm", cfg.norm.set(input_dim=dim))

    def forward(self, inputs: Tensor, *, segment_ids: Tensor) -> Tensor:
        """Computes the block's outputs.

        Args:
            inputs: [batch, seq_len, input_dim].
            segment_ids: int32 [batch, seq_len]; 0 marks padding, and positions attend only to
                positions of their own segment.

        Returns:
            [batch, seq_len, input_dim], zero at padded positions.
        """
        _check_segment_ids(self.path(), segment_ids)
        order = self.config.layer_order or "mhsa_before_lconv"
        x = inputs
        if order == "lconv_before_ff":
            x = self.lconv(x, segment_ids=segment_ids)
        x = self.ff_start(x)
        if order == "lconv_before_mhsa":
            x = self.lconv(x, segment_ids=segment_ids)
        x = self.self_attention(target=x, segment_ids=segment_ids).data
        if order == "mhsa_before_lconv":
            x = self.lconv(x, segment_ids=segment_ids)
        x = self.ff_end(x)
        return self.norm(x) * _non_padding(segment_ids)


def set_lconv_partition_specs(
    cfg: LConvLayer.Config,
    *,
    batch_axis_names: Union[str, Sequence[str]] = ("data", "fsdp"),
    fsdp_axis_names: Union[str, Sequence[str]] = "fsdp",
    tp_axis_names: Union[str, Sequence[str], None] = "model",
    seq_axis_names: Union[str, Sequence[str]] = "seq",
) -> LConvLayer.Config:
    """Shards an LConvLayer's projections over fsdp and tp, its depthwise conv over tp.

    Args:
        cfg: The LConvLayer config, changed in place.
        batch_axis_names: Mesh axes of the activations' batch dim.
        fsdp_axis_names: Mesh axes of fully sharded weights.
        tp_axis_names: Mesh axes of tensor-parallel weights and feature dims.
        seq_axis_names: Mesh axes of the activations' sequence dim.

    Returns:
        `cfg`.
    """
    activations = (batch_axis_names, seq_axis_names, tp_axis_names)
    cfg.linear1.param_partition_spec = (fsdp_axis_names, tp_axis_names)
    cfg.linear2.param_partition_spec = (tp_axis_names, fsdp_axis_names)
    cfg.linear1.output_partition_spec = activations
    cfg.linear2.output_partition_spec = activations
    cfg.conv.input_partition_spec = activations
    cfg.conv.output_partition_spec = activations
    # The depthwise weight is [window, 1, input_dim]: only its channels are sharded.
    cfg.conv.param_partition_spec = (None, None, tp_axis_names)
    return cfg


def set_double_shard_weights_config(
    cfg: ConformerLayer.Config,
    *,
    batch_axis_names: Union[str, Sequence[str]] = ("data", "fsdp"),
    fsdp_axis_names: Union[str, Sequence[str]] = "fsdp",
    tp_axis_names: Union[str, Sequence[str]] = "model",
    seq_axis_names: Union[str, Sequence[str]] = "seq",
) -> ConformerLayer.Config:
    """Shards a ConformerLayer's attention, feed-forward and lconv weights over fsdp and tp.

    Args:
        cfg: The ConformerLayer config, changed in place.
        batch_axis_names: Mesh axes of the activations' batch dim.
        fsdp_axis_names: Mesh axes of fully sharded weights.
        tp_axis_names: Mesh axes of tensor-parallel weights.
        seq_axis_names: Mesh axes of the activations' sequence dim.

    Returns:
        `cfg`.
    """
    set_attention_partition_specs(
        cfg.self_attention.attention, fsdp_axis_names=fsdp_axis_names, tp_axis_names=tp_axis_names
    )
    for ff_cfg in (cfg.ff_start, cfg.ff_end):
        set_feed_forward_partition_specs(
            ff_cfg,
            batch_axis_names=batch_axis_names,
            fsdp_axis_names=fsdp_axis_names,
            tp_axis_names=tp_axis_names,
            seq_axis_names=seq_axis_names,
        )
    set_lconv_partition_specs(
        cfg.lconv,
        batch_axis_names=batch_axis_names,
        fsdp_axis_names=fsdp_axis_names,
        tp_axis_names=tp_axis_names,
        seq_axis_names=seq_axis_names,
    )
    return cfg


class ConformerRepeat(Repeat):
    """A `Repeat` of a ConformerLayer (the segment ids are the same for every layer)."""

    def forward(self, inputs: Tensor, *, segment_ids: Tensor) -> Tensor:
        """Runs the repeated layers in turn.

        Args:
            inputs: [batch, seq_len, input_dim].
            segment_ids: int32 [batch, seq_len].

        Returns:
            The last layer's outputs.
        """

        def layer_fn(carry, _):
            return self.layer(inputs=carry, segment_ids=segment_ids), {}

        return self._run(layer_fn, carry=inputs).carry


class RepeatedConformerLayer(BaseLayer):
    """`num_layers` ConformerLayers with stacked parameters (`repeat/layer/...`), scanned."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures RepeatedConformerLayer."""

        # Input (and output) feature dim.
        input_dim: Required[int] = REQUIRED
        # Number of layers.
        num_layers: Required[int] = REQUIRED
        # The repeated layer.
        layer: ConformerLayer.Config = ConformerLayer.default_config()
        # The repeat implementation.
        repeat: ConformerRepeat.Config = ConformerRepeat.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if cfg.num_layers <= 0:
            raise ValueError(f"{self.path()}: num_layers={cfg.num_layers} must be > 0")
        self._add_child(
            "repeat",
            cfg.repeat.set(layer=cfg.layer.set(input_dim=cfg.input_dim), num_layers=cfg.num_layers),
        )

    def forward(self, inputs: Tensor, *, segment_ids: Tensor) -> Tensor:
        """Runs the stack.

        Args:
            inputs: [batch, seq_len, input_dim].
            segment_ids: int32 [batch, seq_len]; 0 marks padding.

        Returns:
            [batch, seq_len, input_dim].
        """
        return self.repeat(inputs=inputs, segment_ids=segment_ids)
