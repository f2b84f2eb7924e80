"""Convolution layers: Conv1D/2D/3D, their padded-sequence and transposed variants, StackOverTime.

Inputs are channels-last: [batch, *spatial, input_dim]. Weights are [*window, input_dim //
num_input_dim_groups, output_dim] (a grouped convolution when `num_input_dim_groups > 1`: a
depthwise one when it equals `input_dim`). The padding arithmetic (SAME / VALID / CAUSAL, explicit
pairs, the anchor that maps sequence paddings to outputs) is in `convolution_padding` and
re-exported here.

The "WithPadding" / "With1DPadding" layers take `paddings` ([batch, time], 1 = padding) for the
first spatial (time) axis: padded inputs are zeroed before the convolution, the output paddings
are `compute_conv_paddings` (or `compute_conv_transpose_paddings`) of the input paddings, and
padded outputs are zeroed.
"""

from collections.abc import Sequence
from typing import Optional, Union

from jax import lax
from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer, ParameterSpec
from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.convolution_padding import (  # noqa: F401 (re-exported)
    SUPPORTED_CONV_PADDING,
    ConvPaddingType,
    compute_conv_paddings,
    compute_conv_transpose_paddings,
    conv_dilate_window,
    conv_explicit_padding,
    conv_output_shape,
    conv_transpose_explicit_padding,
    conv_transpose_output_shape,
    paddings_to_time_mask,
)
from axlearn.common.utils import Tensor, maybe_shard

_DIMENSION_NUMBERS = {
    1: ("NWC", "WIO", "NWC"),
    2: ("NHWC", "HWIO", "NHWC"),
    3: ("NDHWC", "DHWIO", "NDHWC"),
}


def _as_tuple(value, num_axes: int, field: str, path: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * num_axes
    value = tuple(value)
    if len(value) != num_axes:
        raise ValueError(f"{path}: {field}={value} must have {num_axes} entries (one per axis)")
    return value


class BaseConv(BaseLayer):
    """Shared config and parameters of the convolution layers."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseConv."""

        # Input feature dim.
        input_dim: Required[int] = REQUIRED
        # Output feature dim.
        output_dim: Required[int] = REQUIRED
        # Whether to add a bias.
        bias: bool = True
        # Number of input feature groups (input_dim for a depthwise convolution).
        num_input_dim_groups: Optional[int] = 1

    # Number of spatial axes (1, 2 or 3); set by subclasses.
    _num_spatial_axes: int = 0

    def __init__(self, cfg: Config, *, parent):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        groups = cfg.num_input_dim_groups or 1
        if cfg.input_dim % groups or cfg.output_dim % groups:
            raise ValueError(
                f"{self.path()}: input_dim={cfg.input_dim} and output_dim={cfg.output_dim} must "
                f"be divisible by num_input_dim_groups={groups}"
            )
        n = self._num_spatial_axes
        self._window = _as_tuple(cfg.window, n, "window", self.path())
        self._strides = _as_tuple(cfg.strides, n, "strides", self.path())
        self._dilation = (
            None if cfg.dilation is None else _as_tuple(cfg.dilation, n, "dilation", self.path())
        )
        self._padding = self._canonical_padding(cfg.padding)

    def _canonical_padding(self, padding) -> ConvPaddingType:
        if isinstance(padding, str):
            if padding not in SUPPORTED_CONV_PADDING:
                raise ValueError(
                    f"{self.path()}: padding={padding!r} must be one of {SUPPORTED_CONV_PADDING} "
                    "or explicit (left, right) pairs per spatial axis"
                )
            return padding
        n = self._num_spatial_axes
        padding = tuple(padding)
        if n == 1 and len(padding) == 2 and all(isinstance(p, int) for p in padding):
            padding = (padding,)
        pairs = tuple(tuple(p) for p in padding)
        if len(pairs) != n or any(len(p) != 2 for p in pairs):
            raise ValueError(
                f"{self.path()}: padding={padding} must hold {n} (left, right) pairs, one per "
                "spatial axis"
            )
        return pairs

    def _weight_shape(self) -> tuple[int, ...]:
        cfg = self.config
        groups = cfg.num_input_dim_groups or 1
        return (*self._window, cfg.input_dim // groups, cfg.output_dim)

    def _create_layer_parameter_specs(self) -> dict[str, ParameterSpec]:
        cfg = self.config
        spec = cfg.param_partition_spec
        params = dict(weight=ParameterSpec(shape=self._weight_shape(), mesh_axes=spec))
        if cfg.bias:
            params["bias"] = ParameterSpec(
                shape=[cfg.output_dim], mesh_axes=(spec[-1],) if spec is not None else None
            )
        return params

    def _check_input(self, x: Tensor):
        n = self._num_spatial_axes
        if x.ndim != n + 2 or x.shape[-1] != self.config.input_dim:
            raise ValueError(
                f"{self.path()}: expected inputs of shape [batch, {n} spatial axes, "
                f"{self.config.input_dim}], got {x.shape}"
            )

    def _add_bias(self, output: Tensor) -> Tensor:
        if self.config.bias:
            output = output + self.parameters["bias"]
        return output


class _ConvMixin:
    """Forward and output_shape of (non-transposed) convolutions."""

    def _conv(self, x: Tensor) -> Tensor:
        self._check_input(x)
        cfg = self.config
        pads = conv_explicit_padding(
            window=self._window,
            strides=self._strides,
            padding=self._padding,
            dilation=self._dilation,
        )
        output = lax.conv_general_dilated(
            lhs=x,
            rhs=self.parameters["weight"],
            window_strides=self._strides,
            padding=pads,
            rhs_dilation=self._dilation,
            dimension_numbers=_DIMENSION_NUMBERS[self._num_spatial_axes],
            feature_group_count=cfg.num_input_dim_groups or 1,
        )
        return self._add_bias(output)

    def output_shape(self, *, input_shape: Sequence[Optional[int]]) -> list:
        """Returns the output shape [batch, *spatial, output_dim] for `input_shape`.

        Args:
            input_shape: [batch, *spatial, input_dim] (entries other than input_dim may be None).

        Returns:
            The output shape.
        """
        n = self._num_spatial_axes
        if len(input_shape) != n + 2:
            raise ValueError(f"{self.path()}: input_shape {input_shape} must have rank {n + 2}")
        spatial = conv_output_shape(
            in_shape=input_shape[1:-1],
            window=self._window,
            strides=self._strides,
            padding=self._padding,
            dilation=self._dilation,
        )
        return [input_shape[0], *spatial, self.config.output_dim]


class Conv1D(_ConvMixin, BaseConv):
    """1D convolution over [batch, time, input_dim]."""

    _num_spatial_axes = 1

    @config_class
    class Config(BaseConv.Config):
        """Configures Conv1D."""

        # The window size.
        window: Required[int] = REQUIRED
        # The stride.
        strides: int = 1
        # "SAME", "VALID", "CAUSAL" or ((left, right),).
        padding: ConvPaddingType = ((0, 0),)
        # The window dilation (None: 1).
        dilation: Optional[int] = None
        # Optional sharding constraint of the inputs [batch, time, input_dim].
        input_partition_spec: Optional[Sequence] = None
        # Optional sharding constraint of the outputs [batch, time, output_dim].
        output_partition_spec: Optional[Sequence] = None

    def forward(self, x: Tensor) -> Tensor:
        """Returns the convolution of `x` ([batch, time, input_dim])."""
        cfg = self.config
        x = maybe_shard(x, cfg.input_partition_spec)
        return maybe_shard(self._conv(x), cfg.output_partition_spec)


class Conv1DWithPadding(Conv1D):
    """Conv1D over a padded sequence: returns (outputs, output paddings)."""

    @config_class
    class Config(Conv1D.Config):
        """Configures Conv1DWithPadding."""

        # Position in the padded window whose padding the output takes (None: left padding).
        anchor: Optional[int] = None

    # pylint: disable-next=arguments-differ
    def forward(self, x: Tensor, *, paddings: Tensor) -> tuple[Tensor, Tensor]:
        """Convolves `x` ([batch, time, input_dim]) with `paddings` [batch, time] (1 = pad).

        Returns:
            (outputs [batch, out_time, output_dim], output paddings [batch, out_time]).
        """
        return _conv_with_1d_padding(self, x, paddings, transpose=False)


def _conv_with_1d_padding(layer, x: Tensor, paddings: Tensor, *, transpose: bool):
    """Shared forward of the layers taking [batch, time] paddings."""
    cfg = layer.config
    if paddings.shape != x.shape[:2]:
        raise ValueError(
            f"{layer.path()}: paddings shape {paddings.shape} must be [batch, time] = {x.shape[:2]}"
        )
    mask = paddings_to_time_mask(paddings, x.dtype)
    x = x * mask.reshape(mask.shape + (1,) * (x.ndim - 2))
    if transpose:
        output = layer._conv_transpose(x)  # pylint: disable=protected-access
        compute = compute_conv_transpose_paddings
    else:
        output = layer._conv(x)  # pylint: disable=protected-access
        compute = compute_conv_paddings
    padding = layer._padding  # pylint: disable=protected-access
    time_padding = padding if isinstance(padding, str) else (padding[0],)
    out_paddings = compute(
        paddings.astype(jnp.bool_),
        window=layer._window[0],  # pylint: disable=protected-access
        stride=layer._strides[0],  # pylint: disable=protected-access
        conv_padding=time_padding,
        dilation=None if layer._dilation is None else layer._dilation[0],  # pylint: disable=protected-access
        anchor=cfg.anchor,
    )
    out_mask = paddings_to_time_mask(out_paddings, output.dtype)
    output = output * out_mask.reshape(out_mask.shape + (1,) * (output.ndim - 2))
    return output, out_paddings


class Conv2D(_ConvMixin, BaseConv):
    """2D convolution over [batch, height, width, input_dim]."""

    _num_spatial_axes = 2

    @config_class
    class Config(BaseConv.Config):
        """Configures Conv2D."""

        # The window size per spatial axis.
        window: tuple[int, int] = (1, 1)
        # The stride per spatial axis.
        strides: tuple[int, int] = (1, 1)
        # "SAME", "VALID", "CAUSAL" (on both axes) or ((left, right), (left, right)).
        padding: ConvPaddingType = ((0, 0), (0, 0))
        # The window dilation per axis (None: 1).
        dilation: Optional[tuple[int, int]] = None

    def forward(self, x: Tensor) -> Tensor:
        """Returns the convolution of `x` ([batch, height, width, input_dim])."""
        return self._conv(x)


class Conv2DWith1DPadding(Conv2D):
    """Conv2D whose first spatial axis is time with [batch, time] paddings."""

    @config_class
    class Config(Conv2D.Config):
        """Configures Conv2DWith1DPadding."""

        # Position in the padded time window whose padding the output takes (None: left pad).
        anchor: Optional[int] = None

    # pylint: disable-next=arguments-differ
    def forward(self, x: Tensor, *, paddings: Tensor) -> tuple[Tensor, Tensor]:
        """Convolves `x` ([batch, time, width, input_dim]) with `paddings` [batch, time].

        Returns:
            (outputs, output paddings [batch, out_time]).
        """
        return _conv_with_1d_padding(self, x, paddings, transpose=False)


class Conv3D(_ConvMixin, BaseConv):
    """3D convolution over [batch, depth, height, width, input_dim]."""

    _num_spatial_axes = 3

    @config_class
    class Config(BaseConv.Config):
        """Configures Conv3D."""

        # The window size per spatial axis.
        window: tuple[int, int, int] = (1, 1, 1)
        # The stride per spatial axis.
        strides: tuple[int, int, int] = (1, 1, 1)
        # "SAME", "VALID", "CAUSAL" or three (left, right) pairs.
        padding: ConvPaddingType = ((0, 0), (0, 0), (0, 0))
        # The window dilation per axis (None: 1).
        dilation: Optional[tuple[int, int, int]] = None

    def forward(self, x: Tensor) -> Tensor:
        """Returns the convolution of `x` ([batch, depth, height, width, input_dim])."""
        return self._conv(x)


# --------------------------------------------------------------------------------------------
# Transposed convolutions.
# --------------------------------------------------------------------------------------------


class _ConvTransposeMixin:
    """Forward and output_shape of transposed convolutions.

    A transposed convolution with stride `s` convolves (stride 1) the input dilated by `s`, with
    the padding of `conv_transpose_explicit_padding`. With `transpose_kernel`, the weight is
    [*window, output_dim, input_dim] and is flipped spatially with its feature axes swapped (the
    gradient of a convolution with that weight).
    """

    def _weight_shape(self) -> tuple[int, ...]:
        cfg = self.config
        groups = cfg.num_input_dim_groups or 1
        if cfg.transpose_kernel:
            return (*self._window, cfg.output_dim // groups, cfg.input_dim)
        return (*self._window, cfg.input_dim // groups, cfg.output_dim)

    def _conv_transpose(self, x: Tensor) -> Tensor:
        self._check_input(x)
        cfg = self.config
        pads = conv_transpose_explicit_padding(
            window=self._window,
            strides=self._strides,
            padding=self._padding,
            dilation=self._dilation,
        )
        weight = self.parameters["weight"]
        if cfg.transpose_kernel:
            n = self._num_spatial_axes
            weight = jnp.flip(weight, axis=tuple(range(n)))
            groups = cfg.num_input_dim_groups or 1
            # [*window, out/g, in] -> [*window, in/g, out], per group.
            weight = weight.reshape(*self._window, cfg.output_dim // groups, groups, -1)
            weight = jnp.moveaxis(weight, n, n + 2).reshape(
                *self._window, cfg.input_dim // groups, cfg.output_dim
            )
        output = lax.conv_general_dilated(
            lhs=x,
            rhs=weight,
            window_strides=(1,) * self._num_spatial_axes,
            padding=pads,
            lhs_dilation=self._strides,
            rhs_dilation=self._dilation,
            dimension_numbers=_DIMENSION_NUMBERS[self._num_spatial_axes],
            feature_group_count=cfg.num_input_dim_groups or 1,
        )
        return self._add_bias(output)

    def output_shape(self, *, input_shape: Sequence[Optional[int]]) -> list:
        """Returns the output shape [batch, *spatial, output_dim] for `input_shape`.

        Args:
            input_shape: [batch, *spatial, input_dim].

        Returns:
            The output shape.
        """
        n = self._num_spatial_axes
        if len(input_shape) != n + 2:
            raise ValueError(f"{self.path()}: input_shape {input_shape} must have rank {n + 2}")
        spatial = conv_transpose_output_shape(
            in_shape=input_shape[1:-1],
            window=self._window,
            strides=self._strides,
            padding=self._padding,
            dilation=self._dilation,
        )
        return [input_shape[0], *spatial, self.config.output_dim]


class Conv1DTranspose(_ConvTransposeMixin, BaseConv):
    """1D transposed convolution; returns (outputs, output paddings or None)."""

    _num_spatial_axes = 1

    @config_class
    class Config(BaseConv.Config):
        """Configures Conv1DTranspose."""

        # The window size.
        window: Required[int] = REQUIRED
        # The stride (the input dilation).
        strides: int = 1
        # "SAME", "VALID", "CAUSAL" or ((left, right),) of the dilated input.
        padding: ConvPaddingType = "SAME"
        # The window dilation (None: 1).
        dilation: Optional[int] = None
        # Whether the weight is [window, output_dim, input_dim], flipped and swapped.
        transpose_kernel: bool = False
        # Position in the padded window whose padding the output takes (None: left padding).
        anchor: Optional[int] = None

    def forward(
        self, x: Tensor, *, paddings: Optional[Tensor] = None
    ) -> tuple[Tensor, Optional[Tensor]]:
        """Transposed convolution of `x` ([batch, time, input_dim]).

        Args:
            x: The inputs.
            paddings: Optional [batch, time] paddings (1 = padding).

        Returns:
            (outputs [batch, out_time, output_dim], output paddings or None without paddings).
        """
        if paddings is None:
            return self._conv_transpose(x), None
        return _conv_with_1d_padding(self, x, paddings, transpose=True)


class Conv2DTranspose(_ConvTransposeMixin, BaseConv):
    """2D transposed convolution over [batch, height, width, input_dim]."""

    _num_spatial_axes = 2

    @config_class
    class Config(BaseConv.Config):
        """Configures Conv2DTranspose."""

        # The window size per spatial axis.
        window: tuple[int, int] = (1, 1)
        # The stride (input dilation) per spatial axis.
        strides: tuple[int, int] = (1, 1)
        # "SAME", "VALID", "CAUSAL" or two (left, right) pairs of the dilated input.
        padding: ConvPaddingType = "SAME"
        # The window dilation per axis (None: 1).
        dilation: Optional[tuple[int, int]] = None
        # Whether the weight is [*window, output_dim, input_dim], flipped and swapped.
        transpose_kernel: bool = False

    def forward(self, x: Tensor) -> Tensor:
        """Returns the transposed convolution of `x` ([batch, height, width, input_dim])."""
        return self._conv_transpose(x)


class Conv2DTransposeWith1DPadding(Conv2DTranspose):
    """Conv2DTranspose whose first spatial axis is time with [batch, time] paddings."""

    @config_class
    class Config(Conv2DTranspose.Config):
        """Configures Conv2DTransposeWith1DPadding."""

        # Position in the padded time window whose padding the output takes (None: left pad).
        anchor: Optional[int] = None

    # pylint: disable-next=arguments-differ
    def forward(self, x: Tensor, *, paddings: Tensor) -> tuple[Tensor, Tensor]:
        """Transposed convolution of `x` ([batch, time, width, input_dim]) with paddings.

        Returns:
            (outputs, output paddings [batch, out_time]).
        """
        return _conv_with_1d_padding(self, x, paddings, transpose=True)


class Conv3DTranspose(_ConvTransposeMixin, BaseConv):
    """3D transposed convolution over [batch, depth, height, width, input_dim]."""

    _num_spatial_axes = 3

    @config_class
    class Config(BaseConv.Config):
        """Configures Conv3DTranspose."""

        # The window size per spatial axis.
        window: tuple[int, int, int] = (1, 1, 1)
        # The stride (input dilation) per spatial axis.
        strides: tuple[int, int, int] = (1, 1, 1)
        # "SAME", "VALID", "CAUSAL" or three (left, right) pairs of the dilated input.
        padding: ConvPaddingType = "SAME"
        # The window dilation per axis (None: 1).
        dilation: Optional[tuple[int, int, int]] = None
        # Whether the weight is [*window, output_dim, input_dim], flipped and swapped.
        transpose_kernel: bool = False

    def forward(self, x: Tensor) -> Tensor:
        """Returns the transposed convolution of `x` ([batch, depth, height, width, in])."""
        return self._conv_transpose(x)


# --------------------------------------------------------------------------------------------
# StackOverTime.
# --------------------------------------------------------------------------------------------


class StackOverTime(BaseLayer):
    """Stacks `stride` consecutive frames: [batch, time, dim] -> [batch, time', dim * stride].

    The time axis is first padded by `padding` (zeros), then cut into non-overlapping groups of
    `stride` frames. A stacked frame's padding is `compute_conv_paddings` with window = stride =
    `stride` (the padding at its first input frame after the left padding); padded inputs and
    padded outputs are zeroed.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures StackOverTime."""

        # The number of frames stacked into one.
        stride: Required[int] = REQUIRED
        # "SAME", "VALID", "CAUSAL" or (left, right) frames of zero padding.
        padding: Union[str, tuple[int, int]] = (0, 0)

    def _explicit_padding(self) -> tuple[int, int]:
        cfg = self.config
        padding = cfg.padding
        if isinstance(padding, str):
            ((left, right),) = conv_explicit_padding(
                window=(cfg.stride,), strides=(cfg.stride,), padding=padding
            )
            return left, right
        padding = tuple(padding)
        if len(padding) != 2:
            raise ValueError(f"{self.path()}: padding={padding} must be (left, right)")
        return padding

    def forward(self, *, inputs: Tensor, paddings: Tensor) -> tuple[Tensor, Tensor]:
        """Stacks `inputs` ([batch, time, dim]) with `paddings` ([batch, time], 1 = padding).

        Returns:
            (outputs [batch, time', dim * stride], output paddings [batch, time']).
        """
        cfg = self.config
        inputs = jnp.asarray(inputs)
        paddings = jnp.asarray(paddings)
        left, right = self._explicit_padding()
        mask = paddings_to_time_mask(paddings, inputs.dtype)
        x = inputs * mask[:, :, None]
        x = jnp.pad(x, ((0, 0), (left, right), (0, 0)))
        batch, length, dim = x.shape
        out_len = length // cfg.stride
        x = x[:, : out_len * cfg.stride].reshape(batch, out_len, cfg.stride * dim)
        out_paddings = compute_conv_paddings(
            paddings, window=cfg.stride, stride=cfg.stride, conv_padding=((left, right),)
        )
        x = x * paddings_to_time_mask(out_paddings, x.dtype)[:, :, None]
        return x, out_paddings

    def output_shape(self, *, input_shape: Sequence[Optional[int]]) -> list:
        """Returns [batch, time', dim * stride] for `input_shape` [batch, time, dim]."""
        cfg = self.config
        if len(input_shape) != 3:
            raise ValueError(f"{self.path()}: input_shape {input_shape} must be [b, t, d]")
        batch, length, dim = input_shape
        left, right = self._explicit_padding()
        out_len = None if length is None else (length + left + right) // cfg.stride
        return [batch, out_len, None if dim is None else dim * cfg.stride]
