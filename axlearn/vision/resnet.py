"""ResNet backbones (He et al., https://arxiv.org/abs/1512.03385).

`ResNet` maps images [batch, height, width, 3] to a dict of endpoints: the output of each stage
under the keys "2".."5" (the feature map is 1/2**level of the input resolution) and the globally
average-pooled "embedding" [batch, dim]. Bottleneck blocks stride in their 3x3 convolution (the
"v1.5" variant). `ResNet.resnet50_config()` has 23,508,032 trainable parameters (25,557,032
with a 1000-way linear classifier on top), plus the BatchNorm moving statistics.
"""

import math
from collections.abc import Sequence
from typing import Optional

import jax
from jax import numpy as jnp

from axlearn.common import param_init
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.convolution import Conv2D
from axlearn.common.layers import (
    BatchNorm,
    SqueezeExcitation,
    StochasticDepth,
    get_activation_fn,
    get_stochastic_depth_linear_rate,
)
from axlearn.common.module import Module
from axlearn.common.utils import Tensor

# The model axis that convolution output channels are sharded over.
_CONV_PARTITION = (None, None, None, "model")


def batch_norm() -> BatchNorm.Config:
    """The BatchNorm config of ResNet layers (moving-average decay 0.9, eps 1e-5).

    Returns:
        A BatchNorm config without input_dim.
    """
    return BatchNorm.default_config().set(decay=0.9, eps=1e-5)


def _conv(window: int, *, stride: int = 1, padding: Optional[int] = None) -> Conv2D.Config:
    """A bias-free square convolution config with symmetric padding (default window // 2)."""
    pad = window // 2 if padding is None else padding
    return Conv2D.default_config().set(
        window=(window, window),
        strides=(stride, stride),
        padding=((pad, pad), (pad, pad)),
        bias=False,
        param_partition_spec=_CONV_PARTITION,
    )


def _max_pool(x: Tensor, *, window: int, stride: int, padding) -> Tensor:
    """Max pooling over the two spatial axes of [batch, height, width, channels]."""
    return jax.lax.reduce_window(
        x,
        init_value=-jnp.inf,
        computation=jax.lax.max,
        window_dimensions=(1, window, window, 1),
        window_strides=(1, stride, stride, 1),
        padding=padding,
    )


class Downsample(BaseLayer):
    """Projects the shortcut to the block's output shape (identity when shapes already match)."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures Downsample."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Output feature dim.
        output_dim: Required[int] = REQUIRED
        # Spatial stride of the projection.
        stride: int = 1
        # The normalization layer config (input_dim is set by the layer).
        norm: InstantiableConfig = batch_norm()
        # "conv" (a strided 1x1 convolution) or "maxpool" (max pooling, then a 1x1 convolution).
        downsample_op: str = "conv"

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.param_partition_spec = _CONV_PARTITION
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if not self._is_identity():
            if cfg.downsample_op not in ("conv", "maxpool"):
                raise ValueError(
                    f"{self.path()}.downsample_op={cfg.downsample_op!r} must be 'conv' or 'maxpool'"
                )
            conv_stride = cfg.stride if cfg.downsample_op == "conv" else 1
            self._add_child(
                "conv",
                _conv(1, stride=conv_stride, padding=0).set(
                    input_dim=cfg.input_dim,
                    output_dim=cfg.output_dim,
                    param_partition_spec=cfg.param_partition_spec,
                ),
            )
            self._add_child("norm", cfg.norm.clone(input_dim=cfg.output_dim))

    def _is_identity(self) -> bool:
        cfg = self.config
        return cfg.stride == 1 and cfg.input_dim == cfg.output_dim

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns the projected shortcut [batch, height/stride, width/stride, output_dim]."""
        cfg = self.config
        if self._is_identity():
            return inputs
        x = inputs
        if cfg.downsample_op == "maxpool" and cfg.stride > 1:
            x = _max_pool(x, window=cfg.stride, stride=cfg.stride, padding="SAME")
        return self.norm(self.conv(x))


class StemV0(BaseLayer):
    """The original stem: 7x7 stride-2 convolution, norm, activation, 3x3 stride-2 max pool."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures StemV0."""

        # Output feature dim of the convolution.
        hidden_dim: Required[int] = REQUIRED
        # Image channels.
        input_dim: int = 3
        # The convolution config (input_dim/output_dim are set by the layer).
        conv: InstantiableConfig = _conv(7, stride=2)
        # The normalization layer config.
        norm: InstantiableConfig = batch_norm()
        # The activation (see layers.get_activation_fn).
        activation: str = "nn.relu"

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("conv1", cfg.conv.clone(input_dim=cfg.input_dim, output_dim=cfg.hidden_dim))
        self._add_child("norm1", cfg.norm.clone(input_dim=cfg.hidden_dim))

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns features at 1/4 of the input resolution."""
        x = get_activation_fn(self.config.activation)(self.norm1(self.conv1(inputs)))
        return _max_pool(x, window=3, stride=2, padding=((0, 0), (1, 1), (1, 1), (0, 0)))


class StemV1(BaseLayer):
    """The ResNet-D stem (https://arxiv.org/abs/1812.01187): four 3x3 convolutions, 2 strided."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures StemV1."""

        # Output feature dim (the first two convolutions use half of it).
        hidden_dim: Required[int] = REQUIRED
        # Image channels.
        input_dim: int = 3
        # The 3x3 convolution config (dims and strides are set by the layer).
        conv: InstantiableConfig = _conv(3)
        # The normalization layer config.
        norm: InstantiableConfig = batch_norm()
        # The activation (see layers.get_activation_fn).
        activation: str = "nn.swish"

    # (child suffix, stride, takes half the hidden dim as output).
    _LAYERS = (("a", 2, True), ("b", 1, True), ("c", 1, False), ("d", 2, False))

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        in_dim = cfg.input_dim
        for suffix, stride, half in self._LAYERS:
            out_dim = cfg.hidden_dim // 2 if half else cfg.hidden_dim
            self._add_child(
                f"conv1_{suffix}",
                cfg.conv.clone(strides=(stride, stride), input_dim=in_dim, output_dim=out_dim),
            )
            self._add_child(f"norm1_{suffix}", cfg.norm.clone(input_dim=out_dim))
            in_dim = out_dim

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns features at 1/4 of the input resolution."""
        act = get_activation_fn(self.config.activation)
        x = inputs
        for suffix, _, _ in self._LAYERS:
            x = act(getattr(self, f"norm1_{suffix}")(getattr(self, f"conv1_{suffix}")(x)))
        return x


class _ResidualBlock(BaseLayer):
    """Shared config and residual tail of BasicBlock and Bottleneck."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures a residual block."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Output feature dim.
        output_dim: Required[int] = REQUIRED
        # Spatial stride of the block.
        stride: int = 1
        # The 3x3 convolution config (dims and strides are set by the block).
        conv: InstantiableConfig = _conv(3)
        # The normalization layer config.
        norm: InstantiableConfig = batch_norm()
        # The activation (see layers.get_activation_fn).
        activation: str = "nn.relu"
        # Projects the shortcut when the stride or dims change.
        downsample: Downsample.Config = Downsample.default_config()
        # The squeeze-and-excitation config (se_ratio 0, the default, disables it).
        squeeze_excitation: InstantiableConfig = SqueezeExcitation.default_config()
        # The stochastic depth config (rate None, the default, disables it).
        stochastic_depth: InstantiableConfig = StochasticDepth.default_config()

    def _add_tail_children(self):
        cfg = self.config
        self._add_child(
            "squeeze_excitation", cfg.squeeze_excitation.clone(input_dim=cfg.output_dim)
        )
        self._add_child("stochastic_depth", cfg.stochastic_depth)
        self._add_child(
            "downsample",
            cfg.downsample.clone(
                stride=cfg.stride, input_dim=cfg.input_dim, output_dim=cfg.output_dim
            ),
        )

    def _residual(self, branch: Tensor, inputs: Tensor) -> Tensor:
        branch = self.stochastic_depth(self.squeeze_excitation(branch))
        return get_activation_fn(self.config.activation)(branch + self.downsample(inputs))


class BasicBlock(_ResidualBlock):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    def __init__(self, cfg: _ResidualBlock.Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        dims = ((cfg.input_dim, cfg.output_dim, cfg.stride), (cfg.output_dim, cfg.output_dim, 1))
        for i, (in_dim, out_dim, stride) in enumerate(dims, start=1):
            self._add_child(
                f"conv{i}",
                cfg.conv.clone(strides=(stride, stride), input_dim=in_dim, output_dim=out_dim),
            )
            self._add_child(f"norm{i}", cfg.norm.clone(input_dim=out_dim))
        self._add_tail_children()

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns [batch, height/stride, width/stride, output_dim]."""
        act = get_activation_fn(self.config.activation)
        x = act(self.norm1(self.conv1(inputs)))
        x = self.norm2(self.conv2(x))
        return self._residual(x, inputs)


class Bottleneck(_ResidualBlock):
    """1x1 reduce (to output_dim / 4), 3x3 (strided), 1x1 expand, with a residual connection."""

    def __init__(self, cfg: _ResidualBlock.Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        hidden = cfg.output_dim // 4
        self._add_child(
            "conv1", _conv(1, padding=0).set(input_dim=cfg.input_dim, output_dim=hidden)
        )
        self._add_child("norm1", cfg.norm.clone(input_dim=hidden))
        self._add_child(
            "conv2",
            cfg.conv.clone(strides=(cfg.stride, cfg.stride), input_dim=hidden, output_dim=hidden),
        )
        self._add_child("norm2", cfg.norm.clone(input_dim=hidden))
        self._add_child(
            "conv3", _conv(1, padding=0).set(input_dim=hidden, output_dim=cfg.output_dim)
        )
        self._add_child("norm3", cfg.norm.clone(input_dim=cfg.output_dim))
        self._add_tail_children()

    def forward(self, inputs: Tensor) -> Tensor:
        """Returns [batch, height/stride, width/stride, output_dim]."""
        act = get_activation_fn(self.config.activation)
        x = act(self.norm1(self.conv1(inputs)))
        x = act(self.norm2(self.conv2(x)))
        x = self.norm3(self.conv3(x))
        return self._residual(x, inputs)


class ResNetStage(BaseLayer):
    """`num_blocks` blocks; the first one strides and changes dims."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures ResNetStage."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Output feature dim.
        output_dim: Required[int] = REQUIRED
        # Stride of the first block.
        stride: int = 1
        # The block config (BasicBlock or Bottleneck).
        block: InstantiableConfig = BasicBlock.default_config()
        # Number of blocks.
        num_blocks: Required[int] = REQUIRED

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        for i in range(cfg.num_blocks):
            self._add_child(
                f"block{i}",
                cfg.block.clone(
                    input_dim=cfg.input_dim if i == 0 else cfg.output_dim,
                    output_dim=cfg.output_dim,
                    stride=cfg.stride if i == 0 else 1,
                ),
            )

    def forward(self, inputs: Tensor) -> Tensor:
        """Runs the blocks in order (and records the output as module output "forward")."""
        x = inputs
        for i in range(self.config.num_blocks):
            x = getattr(self, f"block{i}")(x)
        self.add_module_output("forward", x)
        return x


class ResNet(BaseLayer):
    """A ResNet backbone: stem, then stages "stage0".."stageN-1", then global average pooling."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures ResNet."""

        # Feature dim after the stem (the first stage's input).
        hidden_dim: int = 64
        # The stem config: StemV0 (original) or StemV1 (ResNet-D).
        stem: InstantiableConfig = StemV0.default_config()
        # The stage config (dims, stride and num_blocks are set per stage).
        stage: InstantiableConfig = ResNetStage.default_config()
        # Blocks per stage, e.g. [3, 4, 6, 3] for ResNet-50.
        num_blocks_per_stage: Required[Sequence[int]] = REQUIRED
        # If set, stochastic depth rises linearly over the stages to this rate at the last one.
        peak_stochastic_depth_rate: Optional[float] = None

    @classmethod
    def default_config(cls) -> Config:
        """He (fan_out, normal, scale sqrt(2)) initialized weights, float32 parameters."""
        cfg = super().default_config()
        cfg.param_init = param_init.DefaultInitializer.default_config().set(
            init_by_param_name={
                param_init.PARAM_REGEXP_WEIGHT: param_init.WeightInitializer.default_config().set(
                    fan="fan_out", distribution="normal", scale=math.sqrt(2)
                )
            }
        )
        cfg.dtype = jnp.float32
        return cfg

    @classmethod
    def _config_with(cls, num_blocks_per_stage: list[int], *, bottleneck: bool) -> Config:
        cfg = cls.default_config()
        if bottleneck:
            cfg.stage.block = Bottleneck.default_config()
        cfg.num_blocks_per_stage = num_blocks_per_stage
        return cfg

    @classmethod
    def resnet18_config(cls) -> Config:
        """ResNet-18: basic blocks [2, 2, 2, 2]."""
        return cls._config_with([2, 2, 2, 2], bottleneck=False)

    @classmethod
    def resnet34_config(cls) -> Config:
        """ResNet-34: basic blocks [3, 4, 6, 3]."""
        return cls._config_with([3, 4, 6, 3], bottleneck=False)

    @classmethod
    def resnet50_config(cls) -> Config:
        """ResNet-50: bottleneck blocks [3, 4, 6, 3]."""
        return cls._config_with([3, 4, 6, 3], bottleneck=True)

    @classmethod
    def resnet101_config(cls) -> Config:
        """ResNet-101: bottleneck blocks [3, 4, 23, 3]."""
        return cls._config_with([3, 4, 23, 3], bottleneck=True)

    @classmethod
    def resnet152_config(cls) -> Config:
        """ResNet-152: bottleneck blocks [3, 8, 36, 3]."""
        return cls._config_with([3, 8, 36, 3], bottleneck=True)

    @classmethod
    def resnet200_config(cls) -> Config:
        """ResNet-200: bottleneck blocks [3, 24, 36, 3]."""
        return cls._config_with([3, 24, 36, 3], bottleneck=True)

    @classmethod
    def resnet270_config(cls) -> Config:
        """ResNet-270 (ResNet-RS depth): bottleneck blocks [4, 29, 53, 4]."""
        return cls._config_with([4, 29, 53, 4], bottleneck=True)

    @classmethod
    def resnet350_config(cls) -> Config:
        """ResNet-350 (ResNet-RS depth): bottleneck blocks [4, 36, 72, 4]."""
        return cls._config_with([4, 36, 72, 4], bottleneck=True)

    @classmethod
    def resnet420_config(cls) -> Config:
        """ResNet-420 (ResNet-RS depth): bottleneck blocks [4, 44, 87, 4]."""
        return cls._config_with([4, 44, 87, 4], bottleneck=True)

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        if any(not isinstance(n, int) or n < 1 for n in cfg.num_blocks_per_stage):
            raise ValueError(
                f"{self.path()}.num_blocks_per_stage={list(cfg.num_blocks_per_stage)} must hold "
                "positive ints, e.g. [3, 4, 6, 3]"
            )
        self._add_child("stem", cfg.stem.clone(hidden_dim=cfg.hidden_dim))
        bottleneck = issubclass(cfg.stage.block.klass, Bottleneck)
        num_stages = len(cfg.num_blocks_per_stage)
        dim = cfg.hidden_dim
        self._endpoints_dims: dict[str, int] = {}
        for i, num_blocks in enumerate(cfg.num_blocks_per_stage):
            # Bottleneck stages expand 4x in the first stage; every later stage doubles.
            out_dim = dim * (4 if bottleneck else 1) if i == 0 else dim * 2
            stage_cfg = cfg.stage.clone(
                input_dim=dim, output_dim=out_dim, stride=1 if i == 0 else 2, num_blocks=num_blocks
            )
            if cfg.peak_stochastic_depth_rate:
                # The stem counts as the first of num_stages + 1 levels.
                stage_cfg.block.stochastic_depth.rate = get_stochastic_depth_linear_rate(
                    cfg.peak_stochastic_depth_rate,
                    stage_order=i + 2,
                    num_stages=num_stages + 1,
                )
            self._add_child(f"stage{i}", stage_cfg)
            dim = out_dim
            self._endpoints_dims[str(i + 2)] = dim
        self._endpoints_dims["embedding"] = dim

    @property
    def endpoints_dims(self) -> dict[str, int]:
        """Feature dim of each endpoint: "2".."5" (stage outputs) and "embedding"."""
        return dict(self._endpoints_dims)

    def forward(self, image: Tensor) -> dict[str, Tensor]:
        """Computes the endpoints of a batch of images.

        Args:
            image: Float images [batch, height, width, input channels].

        Returns:
            {"2": ..., "5": stage outputs [batch, h, w, dim], "embedding": [batch, dim]}.
        """
        x = self.stem(image)
        endpoints = {}
        for i in range(len(self.config.num_blocks_per_stage)):
            x = getattr(self, f"stage{i}")(x)
            endpoints[str(i + 2)] = x
        endpoints["embedding"] = jnp.mean(x, axis=(1, 2))
        return endpoints
