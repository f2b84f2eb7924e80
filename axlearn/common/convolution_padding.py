"""Padding arithmetic of convolutions and transposed convolutions (`axlearn.common.convolution`).

Conventions:
- `padding` (`ConvPaddingType`) is "SAME", "VALID", "CAUSAL", or explicit (left, right) pairs, one
  per spatial axis. A window of size `w` with dilation `d` spans `(w - 1) * d + 1` positions.
- "SAME": `((span - 1) // 2, span - 1 - (span - 1) // 2)`, independent of the stride.
- "CAUSAL": `(span - stride, stride - 1)`: each output sees no position after its anchor.
- Sequence paddings (1 = padding) or segment ids of a [batch, length] input map to the output
  positions through an *anchor*: the output at step `i` takes the value at position
  `i * stride + anchor` of the padded input. The anchor defaults to the left padding and must lie in
  `[left, span - right)`.
"""

from collections.abc import Sequence
from typing import Optional, Union

from jax import numpy as jnp

from axlearn.common.utils import Tensor

# "SAME", "VALID", "CAUSAL", or explicit (left, right) pairs per spatial axis.
ConvPaddingType = Union[str, Sequence[tuple[int, int]]]

SUPPORTED_CONV_PADDING = ("SAME", "VALID", "CAUSAL")


def _per_axis(value, num_axes: int, default: int = 1) -> tuple[int, ...]:
    if value is None:
        return (default,) * num_axes
    if isinstance(value, int):
        return (value,) * num_axes
    return tuple(default if v is None else v for v in value)


def conv_dilate_window(*, window: Sequence[int], dilation: Optional[Sequence[int]]) -> tuple:
    """Returns the span of each window axis after dilation: `(window - 1) * dilation + 1`.

    Args:
        window: The window size per spatial axis.
        dilation: The dilation per axis (None: 1).

    Returns:
        The dilated window sizes.
    """
    dilation = _per_axis(dilation, len(window))
    return tuple((w - 1) * d + 1 for w, d in zip(window, dilation))


def _check_padding_name(padding: str):
    if padding not in SUPPORTED_CONV_PADDING:
        raise ValueError(
            f"Unsupported convolution padding {padding!r}; use one of {SUPPORTED_CONV_PADDING} "
            "or explicit (left, right) pairs per spatial axis"
        )


def conv_explicit_padding(
    *,
    window: Sequence[int],
    strides: Sequence[int],
    padding: ConvPaddingType,
    dilation: Optional[Sequence[int]] = None,
) -> tuple[tuple[int, int], ...]:
    """Returns the explicit (left, right) padding of a convolution, per spatial axis.

    For window 5: "SAME" pads (2, 2) (dilation 2: (4, 4)), "VALID" (0, 0), and "CAUSAL" with
    stride 1, 2, 3 pads (4, 0), (3, 1), (2, 2).

    Args:
        window: The window size per spatial axis.
        strides: The stride per spatial axis.
        padding: A padding name or explicit pairs (returned as they are).
        dilation: The dilation per axis (None: 1).

    Returns:
        One (left, right) pair per spatial axis.

    Raises:
        ValueError: If `padding` is an unknown name or has the wrong number of pairs.
    """
    if not isinstance(padding, str):
        pairs = tuple(tuple(int(p) for p in pair) for pair in padding)
        if len(pairs) != len(window) or any(len(p) != 2 for p in pairs):
            raise ValueError(
                f"Explicit convolution padding {padding} must hold one (left, right) pair per "
                f"window axis ({len(window)})"
            )
        return pairs
    _check_padding_name(padding)
    spans = conv_dilate_window(window=window, dilation=dilation)
    strides = _per_axis(strides, len(window))
    if padding == "VALID":
        return tuple((0, 0) for _ in spans)
    if padding == "SAME":
        return tuple(((s - 1) // 2, s - 1 - (s - 1) // 2) for s in spans)
    return tuple((span - stride, stride - 1) for span, stride in zip(spans, strides))


def conv_output_shape(
    *,
    in_shape: Sequence[Optional[int]],
    window: Sequence[int],
    strides: Sequence[int],
    padding: ConvPaddingType,
    dilation: Optional[Sequence[int]] = None,
) -> tuple[Optional[int], ...]:
    """Returns the spatial output shape of a convolution.

    Args:
        in_shape: The spatial input shape (entries may be None: unknown).
        window: The window size per spatial axis.
        strides: The stride per spatial axis.
        padding: A padding name or explicit pairs.
        dilation: The dilation per axis (None: 1).

    Returns:
        The spatial output shape (None where the input size is None).
    """
    pads = conv_explicit_padding(window=window, strides=strides, padding=padding, dilation=dilation)
    spans = conv_dilate_window(window=window, dilation=dilation)
    out = []
    for size, span, stride, (left, right) in zip(in_shape, spans, strides, pads):
        if size is None:
            out.append(None)
        else:
            out.append(max((size + left + right - span) // stride + 1, 0))
    return tuple(out)


def _pad_value(x: Tensor):
    """Paddings (bool or float) extend with 1 (padded); segment ids (integers) with 0."""
    if x.dtype == jnp.bool_:
        return True
    if jnp.issubdtype(x.dtype, jnp.floating):
        return 1
    return 0


def _check_anchor(anchor: int, *, left: int, right: int, span: int):
    if not left <= anchor < span - right:
        raise ValueError(
            f"anchor={anchor} must be in [{left}, {span - right}) (left padding {left}, right "
            f"padding {right}, dilated window {span}); use None for the left padding"
        )


def compute_conv_paddings(
    in_paddings: Tensor,
    *,
    window: int,
    stride: int,
    conv_padding: ConvPaddingType,
    dilation: Optional[int] = None,
    anchor: Optional[int] = None,
) -> Tensor:
    """Maps the paddings (or segment ids) of a sequence to the outputs of a 1D convolution.

    The output at step `i` takes the input value at position `i * stride + anchor` of the padded
    input, where out-of-range positions count as padding (1) for paddings and as segment 0 for
    integer segment ids.

    Args:
        in_paddings: [batch, length] paddings (bool/float, 1 = padding) or int segment ids.
        window: The window size.
        stride: The stride.
        conv_padding: A padding name, or explicit pairs whose first pair is the time axis.
        dilation: The dilation (None: 1).
        anchor: The position within the padded window whose value the output takes (None: the
            left padding). Must be in [left, dilated window - right).

    Returns:
        [batch, output_length] paddings (or segment ids), of `in_paddings`' dtype.

    Raises:
        ValueError: If the anchor is out of range.
    """
    if not isinstance(conv_padding, str):
        conv_padding = (tuple(conv_padding[0]),)
    dilation = dilation or 1
    ((left, right),) = conv_explicit_padding(
        window=(window,), strides=(stride,), padding=conv_padding, dilation=(dilation,)
    )
    (span,) = conv_dilate_window(window=(window,), dilation=(dilation,))
    if anchor is None:
        anchor = left
    _check_anchor(anchor, left=left, right=right, span=span)
    length = in_paddings.shape[1]
    (out_len,) = conv_output_shape(
        in_shape=(length,),
        window=(window,),
        strides=(stride,),
        padding=((left, right),),
        dilation=(dilation,),
    )
    index = jnp.arange(out_len) * stride + anchor - left
    valid = (index >= 0) & (index < length)
    values = jnp.take(in_paddings, jnp.clip(index, 0, max(length - 1, 0)), axis=1)
    fill = jnp.asarray(_pad_value(in_paddings), in_paddings.dtype)
    return jnp.where(valid[None, :], values, fill)


def conv_transpose_explicit_padding(
    *,
    window: Sequence[int],
    strides: Sequence[int],
    padding: ConvPaddingType,
    dilation: Optional[Sequence[int]] = None,
) -> tuple[tuple[int, int], ...]:
    """Returns the explicit padding of the dilated input of a transposed convolution.

    A transposed convolution with stride `s` is a convolution with stride 1 of the input dilated
    by `s` (holes between elements). With span `k` (the dilated window): "SAME" pads
    `k + s - 2` in total, `k - 1` on the left if `s > k - 1` else `ceil((k + s - 2) / 2)`, so the
    output length is `input * s`; "VALID" pads `k + s - 2 + max(k - s, 0)` with `k - 1` on the
    left (the full transposed convolution); "CAUSAL" pads `(k - 1, s - 1)` (length `input * s`).

    Args:
        window: The window size per spatial axis.
        strides: The stride per spatial axis.
        padding: A padding name or explicit pairs (returned as they are).
        dilation: The dilation per axis (None: 1).

    Returns:
        One (left, right) pair per spatial axis.

    Raises:
        ValueError: If `padding` is an unknown name.
    """
    if not isinstance(padding, str):
        return conv_explicit_padding(
            window=window, strides=strides, padding=padding, dilation=dilation
        )
    _check_padding_name(padding)
    spans = conv_dilate_window(window=window, dilation=dilation)
    strides = _per_axis(strides, len(window))
    pads = []
    for k, s in zip(spans, strides):
        if padding == "SAME":
            total = k + s - 2
            left = k - 1 if s > k - 1 else -(-total // 2)
        elif padding == "VALID":
            total = k + s - 2 + max(k - s, 0)
            left = k - 1
        else:
            total = k + s - 2
            left = k - 1
        pads.append((left, total - left))
    return tuple(pads)


def conv_transpose_output_shape(
    *,
    in_shape: Sequence[Optional[int]],
    window: Sequence[int],
    strides: Sequence[int],
    padding: ConvPaddingType,
    dilation: Optional[Sequence[int]] = None,
) -> tuple[Optional[int], ...]:
    """Returns the spatial output shape of a transposed convolution.

    Args:
        in_shape: The spatial input shape (entries may be None).
        window: The window size per spatial axis.
        strides: The stride per spatial axis.
        padding: A padding name or explicit pairs.
        dilation: The dilation per axis (None: 1).

    Returns:
        The spatial output shape: `(in - 1) * stride + 1 + left + right - span + 1` per axis.
    """
    pads = conv_transpose_explicit_padding(
        window=window, strides=strides, padding=padding, dilation=dilation
    )
    spans = conv_dilate_window(window=window, dilation=dilation)
    strides = _per_axis(strides, len(window))
    out = []
    for size, span, stride, (left, right) in zip(in_shape, spans, strides, pads):
        if size is None:
            out.append(None)
        else:
            dilated = (size - 1) * stride + 1 if size > 0 else 0
            out.append(max(dilated + left + right - span + 1, 0))
    return tuple(out)


def compute_conv_transpose_paddings(
    in_paddings: Tensor,
    *,
    window: int,
    stride: int,
    conv_padding: ConvPaddingType,
    dilation: Optional[int] = None,
    anchor: Optional[int] = None,
) -> Tensor:
    """Maps the paddings (or segment ids) of a sequence to the outputs of a transposed conv.

    The output at step `j` takes the value at position `j + anchor` of the padded, dilated input
    (anchor default: its left padding). A hole of the dilation, or the right padding, takes the
    value of the input element before it; the left padding counts as padding (segment 0). So
    compute_conv_paddings() with the same window, stride and padding maps the result back to
    `in_paddings`.

    Args:
        in_paddings: [batch, length] paddings (bool/float, 1 = padding) or int segment ids.
        window: The window size.
        stride: The stride (input dilation).
        conv_padding: A padding name, or explicit pairs whose first pair is the time axis.
        dilation: The window dilation (None: 1).
        anchor: The position within the padded window whose value the output takes.

    Returns:
        [batch, output_length], of `in_paddings`' dtype.
    """
    if not isinstance(conv_padding, str):
        conv_padding = (tuple(conv_padding[0]),)
    dilation = dilation or 1
    ((left, right),) = conv_transpose_explicit_padding(
        window=(window,), strides=(stride,), padding=conv_padding, dilation=(dilation,)
    )
    if anchor is None:
        anchor = left
    length = in_paddings.shape[1]
    (out_len,) = conv_transpose_output_shape(
        in_shape=(length,),
        window=(window,),
        strides=(stride,),
        padding=((left, right),),
        dilation=(dilation,),
    )
    position = jnp.arange(out_len) + anchor - left
    index = jnp.clip(position // stride, 0, max(length - 1, 0))
    values = jnp.take(in_paddings, index, axis=1)
    fill = jnp.asarray(_pad_value(in_paddings), in_paddings.dtype)
    return jnp.where((position >= 0)[None, :], values, fill)


def paddings_to_time_mask(paddings: Tensor, dtype) -> Tensor:
    """1 - paddings as `dtype` ([batch, length])."""
    return jnp.logical_not(paddings.astype(jnp.bool_)).astype(dtype)


__all__ = [
    "ConvPaddingType",
    "SUPPORTED_CONV_PADDING",
    "compute_conv_paddings",
    "compute_conv_transpose_paddings",
    "conv_dilate_window",
    "conv_explicit_padding",
    "conv_output_shape",
    "conv_transpose_explicit_padding",
    "conv_transpose_output_shape",
]
