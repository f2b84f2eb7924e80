"""Tests of axlearn.common.convolution against NumPy loops and hand-computed values."""

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common import convolution
from axlearn.common.convolution import (
    Conv1D,
    Conv1DTranspose,
    Conv1DWithPadding,
    Conv2D,
    Conv2DTranspose,
    Conv2DWith1DPadding,
    Conv3D,
    StackOverTime,
    compute_conv_paddings,
    compute_conv_transpose_paddings,
    conv_explicit_padding,
    conv_output_shape,
    conv_transpose_explicit_padding,
    conv_transpose_output_shape,
)
from axlearn.common.module import functional

TOL = dict(atol=1e-4, rtol=1e-4)


def _normal(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(layer, params, inputs):
    out, _ = functional(layer, jax.random.PRNGKey(0), params, inputs, is_training=False)
    return out


def _np_conv(x, w, *, stride, pads, dilation=1, groups=1):
    """Direct NumPy N-D convolution (channels last) with explicit padding and groups."""
    n = x.ndim - 2
    x = np.pad(x, [(0, 0), *pads, (0, 0)])
    window = w.shape[:n]
    span = [(k - 1) * dilation + 1 for k in window]
    out_sizes = [(x.shape[1 + i] - span[i]) // stride + 1 for i in range(n)]
    in_g, out_dim = w.shape[-2], w.shape[-1]
    out_g = out_dim // groups
    out = np.zeros((x.shape[0], *out_sizes, out_dim), np.float64)
    for pos in np.ndindex(*out_sizes):
        for offset in np.ndindex(*window):
            idx = tuple(p * stride + o * dilation for p, o in zip(pos, offset))
            patch = x[(slice(None), *idx)]  # [batch, in]
            for g in range(groups):
                out[(slice(None), *pos, slice(g * out_g, (g + 1) * out_g))] += (
                    patch[:, g * in_g : (g + 1) * in_g] @ w[offset][:, g * out_g : (g + 1) * out_g]
                )
    return out


@pytest.mark.parametrize(
    "window,stride,padding,dilation,expected",
    [
        (3, 1, "SAME", 1, (1, 1)),
        (4, 1, "SAME", 1, (1, 2)),
        (3, 2, "SAME", 2, (2, 2)),
        (3, 1, "VALID", 1, (0, 0)),
        (3, 1, "CAUSAL", 1, (2, 0)),
        (4, 2, "CAUSAL", 1, (2, 1)),
        (3, 2, "CAUSAL", 3, (5, 1)),
    ],
)
def test_conv_explicit_padding(window, stride, padding, dilation, expected):
    pads = conv_explicit_padding(
        window=(window,), strides=(stride,), padding=padding, dilation=(dilation,)
    )
    assert pads == (expected,)
    # The output length equals a direct count of window starts over the padded input.
    length = 11
    span = (window - 1) * dilation + 1
    starts = range(0, length + sum(expected) - span + 1, stride)
    assert conv_output_shape(
        in_shape=(length,),
        window=(window,),
        strides=(stride,),
        padding=padding,
        dilation=(dilation,),
    ) == (len(starts),)


def test_bad_padding_name():
    with pytest.raises(ValueError, match="Unsupported convolution padding 'FULL'"):
        conv_explicit_padding(window=(3,), strides=(1,), padding="FULL")


def test_compute_conv_paddings_hand_values():
    # window 4, stride 2, CAUSAL pads (2, 1); outputs anchor at input positions 0, 2, 4, 6.
    paddings = jnp.array([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 1]], jnp.bool_)
    out = compute_conv_paddings(paddings, window=4, stride=2, conv_padding="CAUSAL")
    np.testing.assert_array_equal(out, [[0, 0, 0, 1], [0, 1, 1, 1]])
    assert out.dtype == jnp.bool_
    # Segment ids extend with 0; VALID with anchor 1 reads input positions 1, 3, 5.
    ids = jnp.array([[1, 1, 2, 2, 2, 3, 3]], jnp.int32)
    out = compute_conv_paddings(ids, window=3, stride=2, conv_padding="VALID", anchor=1)
    np.testing.assert_array_equal(out, [[1, 2, 3]])
    with pytest.raises(ValueError, match="anchor=3 must be in"):
        compute_conv_paddings(ids, window=3, stride=2, conv_padding="VALID", anchor=3)


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("padding", ["SAME", "VALID", "CAUSAL"])
def test_transpose_paddings_invert_conv_paddings(stride, padding):
    paddings = jnp.array([[0, 0, 1, 0, 1, 1]], jnp.bool_)
    up = compute_conv_transpose_paddings(paddings, window=3, stride=stride, conv_padding=padding)
    (length,) = conv_transpose_output_shape(
        in_shape=(6,), window=(3,), strides=(stride,), padding=padding
    )
    assert up.shape == (1, length)
    back = compute_conv_paddings(up, window=3, stride=stride, conv_padding=padding)
    np.testing.assert_array_equal(back, paddings)


def test_conv_transpose_explicit_padding_hand_values():
    # SAME: total k + s - 2; VALID: the full transposed convolution; CAUSAL: (k - 1, s - 1).
    assert conv_transpose_explicit_padding(window=(3,), strides=(2,), padding="SAME") == ((2, 1),)
    assert conv_transpose_explicit_padding(window=(3,), strides=(1,), padding="VALID") == ((2, 2),)
    assert conv_transpose_explicit_padding(window=(3,), strides=(3,), padding="CAUSAL") == ((2, 2),)


@pytest.mark.parametrize(
    "padding,dilation,groups", [("SAME", None, 1), ("VALID", 2, 1), ("CAUSAL", None, 2)]
)
def test_conv1d_matches_numpy(padding, dilation, groups):
    cfg = Conv1D.default_config().set(
        name="conv",
        input_dim=4,
        output_dim=6,
        window=3,
        strides=2,
        padding=padding,
        dilation=dilation,
        num_input_dim_groups=groups,
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    assert params["weight"].shape == (3, 4 // groups, 6)
    params["bias"] = jnp.asarray(_normal(2, (6,)))
    x = _normal(3, (2, 9, 4))
    out = _run(layer, params, dict(x=jnp.asarray(x)))
    pads = conv_explicit_padding(window=(3,), strides=(2,), padding=padding, dilation=(dilation,))
    ref = _np_conv(
        x, np.asarray(params["weight"]), stride=2, pads=pads, dilation=dilation or 1, groups=groups
    ) + np.asarray(params["bias"])
    np.testing.assert_allclose(out, ref, **TOL)
    assert list(out.shape) == layer.output_shape(input_shape=[2, 9, 4])


def test_conv2d_and_conv3d_match_numpy():
    layer = (
        Conv2D.default_config()
        .set(
            name="conv",
            input_dim=4,
            output_dim=2,
            window=(2, 3),
            strides=(1, 2),
            padding="SAME",
            num_input_dim_groups=2,
        )
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    x = _normal(4, (1, 5, 6, 4))
    out = _run(layer, params, dict(x=jnp.asarray(x)))
    ref = _np_conv(x, np.asarray(params["weight"]), stride=1, pads=[(0, 1), (1, 1)], groups=2)
    # Stride (1, 2): take every other column of the stride-1 result.
    np.testing.assert_allclose(out, ref[:, :, ::2] + np.asarray(params["bias"]), **TOL)
    layer3 = (
        Conv3D.default_config()
        .set(name="conv3", input_dim=2, output_dim=3, window=(2, 2, 2), padding="VALID")
        .instantiate(parent=None)
    )
    params3 = layer3.initialize_parameters_recursively(jax.random.PRNGKey(2))
    x3 = _normal(5, (1, 3, 3, 3, 2))
    ref3 = _np_conv(x3, np.asarray(params3["weight"]), stride=1, pads=[(0, 0)] * 3)
    np.testing.assert_allclose(_run(layer3, params3, dict(x=jnp.asarray(x3))), ref3, **TOL)


def test_bad_groups_message():
    cfg = Conv1D.default_config().set(
        name="conv", input_dim=4, output_dim=6, window=3, num_input_dim_groups=3
    )
    with pytest.raises(ValueError, match="conv: input_dim=4 and output_dim=6 must be divisible"):
        cfg.instantiate(parent=None)


def test_conv_with_padding_ignores_padded_data():
    layer = (
        Conv2DWith1DPadding.default_config()
        .set(name="conv", input_dim=3, output_dim=2, window=(3, 1), strides=(2, 1), padding="SAME")
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    x = _normal(6, (2, 7, 2, 3))
    paddings = np.zeros((2, 7), bool)
    paddings[1, 4:] = True
    noisy = x.copy()
    noisy[1, 4:] = 1000.0
    (out, out_paddings) = _run(layer, params, dict(x=jnp.asarray(x), paddings=paddings))
    (noisy_out, _) = _run(layer, params, dict(x=jnp.asarray(noisy), paddings=paddings))
    np.testing.assert_allclose(out, noisy_out, **TOL)
    # SAME pads (1, 1): outputs anchor at inputs 0, 2, 4, 6; padded outputs are zero.
    np.testing.assert_array_equal(out_paddings, [[0, 0, 0, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(out[1, 2:], 0)
    # Conv1DWithPadding equals Conv2DWith1DPadding with a width of 1.
    layer1 = (
        Conv1DWithPadding.default_config()
        .set(name="conv1", input_dim=3, output_dim=2, window=3, strides=2, padding="SAME")
        .instantiate(parent=None)
    )
    params1 = dict(weight=params["weight"][:, 0], bias=params["bias"])
    out1, pad1 = _run(layer1, params1, dict(x=jnp.asarray(x[:, :, 0]), paddings=paddings))
    ref, ref_pad = _run(layer, params, dict(x=jnp.asarray(x[:, :, :1]), paddings=paddings))
    np.testing.assert_allclose(out1, ref[:, :, 0], **TOL)
    np.testing.assert_array_equal(pad1, ref_pad)


def test_conv1d_transpose_hand_values():
    # Inputs [0, 0, 1, 1] dilated by 2: [0 _ 0 _ 1 _ 1]; SAME pads (2, 1); a ones window of 3.
    layer = (
        Conv1DTranspose.default_config()
        .set(
            name="convt", input_dim=1, output_dim=1, window=3, strides=2, padding="SAME", bias=False
        )
        .instantiate(parent=None)
    )
    params = dict(weight=jnp.ones((3, 1, 1)))
    x = jnp.array([0.0, 0.0, 1.0, 1.0])[None, :, None]
    out, paddings = _run(layer, params, dict(x=x))
    assert paddings is None
    np.testing.assert_allclose(out[0, :, 0], [0, 0, 0, 0, 1, 1, 2, 1])


def test_conv_transpose_is_conv_gradient():
    """A VALID transposed conv with stride s is the input-gradient of the strided conv."""
    w = _normal(7, (3, 2, 4))  # [window, in, out] of the forward conv.
    x = _normal(8, (1, 9, 2))

    def conv(inputs):
        return jax.lax.conv_general_dilated(
            inputs, jnp.asarray(w), (2,), [(0, 0)], dimension_numbers=("NWC", "WIO", "NWC")
        )

    y, vjp = jax.vjp(conv, jnp.asarray(x))
    upstream = _normal(9, y.shape)
    (grad,) = vjp(jnp.asarray(upstream))
    layer = (
        Conv1DTranspose.default_config()
        .set(
            name="convt",
            input_dim=4,
            output_dim=2,
            window=3,
            strides=2,
            padding="VALID",
            bias=False,
            transpose_kernel=True,
        )
        .instantiate(parent=None)
    )
    out, _ = _run(layer, dict(weight=jnp.asarray(w)), dict(x=jnp.asarray(upstream)))
    # The full transposed conv is one element longer than x here (9 = (4 - 1) * 2 + 3).
    np.testing.assert_allclose(out[:, : x.shape[1]], grad, **TOL)


def test_conv2d_transpose_output_shape():
    layer = (
        Conv2DTranspose.default_config()
        .set(name="convt", input_dim=2, output_dim=3, window=(3, 3), strides=(2, 2), padding="SAME")
        .instantiate(parent=None)
    )
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    out = _run(layer, params, dict(x=jnp.ones((1, 4, 5, 2))))
    assert out.shape == (1, 8, 10, 3) == tuple(layer.output_shape(input_shape=[1, 4, 5, 2]))


def test_stack_over_time():
    layer = (
        StackOverTime.default_config()
        .set(name="stack", stride=2, padding=(1, 0))
        .instantiate(parent=None)
    )
    x = jnp.arange(1.0, 6.0)[None, :, None]  # [1, 5, 1]: 1 2 3 4 5
    paddings = jnp.array([[0, 0, 0, 1, 1]], jnp.bool_)
    out, out_paddings = _run(layer, {}, dict(inputs=x, paddings=paddings))
    # Padded: 0 1 2 3 4 5 -> frames (0, 1) (2, 3) (4, 5); inputs 4, 5 are padding (zeroed);
    # frame paddings read inputs 0, 2, 4 -> 0, 0, 1.
    np.testing.assert_allclose(out[0], [[0, 1], [2, 3], [0, 0]])
    np.testing.assert_array_equal(out_paddings, [[0, 0, 1]])
    assert layer.output_shape(input_shape=[1, 5, 1]) == [1, 3, 2]


def test_module_reexports_padding_helpers():
    assert convolution.compute_conv_paddings is compute_conv_paddings
