"""Tests of axlearn/vision/resnet.py: parameter counts by hand and a block against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.module import functional as F
from axlearn.common.utils import flatten_items
from axlearn.vision import resnet
from axlearn.vision.image_classification import ImageClassificationModel


def _param_shapes(cfg) -> dict[str, tuple]:
    layer = cfg.set(name="m").instantiate(parent=None)
    specs = layer.create_parameter_specs_recursively()
    return {path: tuple(spec.shape) for path, spec in flatten_items(specs)}


def _trainable(shapes: dict[str, tuple]) -> int:
    # BatchNorm's moving statistics are parameters without gradient: not trainable.
    return sum(
        int(np.prod(s))
        for p, s in shapes.items()
        if not p.endswith(("moving_mean", "moving_variance"))
    )


def _bottleneck_resnet_by_hand(blocks: list[int], num_classes: int) -> int:
    """Trainable parameters of a bottleneck ResNet, from the paper's architecture (Table 1)."""
    total = 7 * 7 * 3 * 64 + 2 * 64  # Stem conv (no bias) + BatchNorm scale/bias.
    in_dim = 64
    for stage, n in enumerate(blocks):
        out_dim = 256 * 2**stage
        hidden = out_dim // 4
        for b in range(n):
            block_in = in_dim if b == 0 else out_dim
            total += block_in * hidden + 9 * hidden * hidden + hidden * out_dim
            total += 2 * (hidden + hidden + out_dim)
            if b == 0:  # Projection shortcut: 1x1 conv + BatchNorm.
                total += block_in * out_dim + 2 * out_dim
        in_dim = out_dim
    return total + in_dim * num_classes + num_classes


def test_resnet50_parameter_count():
    model = ImageClassificationModel.default_config().set(
        backbone=resnet.ResNet.resnet50_config(), num_classes=1000
    )
    shapes = _param_shapes(model)
    expected = _bottleneck_resnet_by_hand([3, 4, 6, 3], 1000)
    # The count torchvision and the paper's implementations report for ResNet-50.
    assert expected == 25_557_032
    assert _trainable(shapes) == expected
    # Moving statistics: one mean and variance per BatchNorm channel (as many as scale+bias).
    moving = sum(int(np.prod(s)) for p, s in shapes.items() if "moving" in p)
    bn = sum(int(np.prod(s)) for p, s in shapes.items() if p.endswith(("norm1/scale", "bias")))
    assert moving == 53_120 and bn > 0
    assert shapes["backbone/stem/conv1/weight"] == (7, 7, 3, 64)
    assert shapes["backbone/stage2/block0/conv2/weight"] == (3, 3, 256, 256)
    assert shapes["classifier/weight"] == (2048, 1000)


def test_resnet101_and_resnet18_counts():
    r101 = _param_shapes(resnet.ResNet.resnet101_config())
    assert _trainable(r101) == _bottleneck_resnet_by_hand([3, 4, 23, 3], 0)  # 42.5M.
    r18 = _param_shapes(resnet.ResNet.resnet18_config())
    # Basic blocks: two 3x3 convs per block; a 1x1 projection where the dim changes.
    by_hand = 7 * 7 * 3 * 64 + 2 * 64
    in_dim = 64
    for stage in range(4):
        out_dim = 64 * 2**stage
        for b in range(2):
            block_in = in_dim if b == 0 else out_dim
            by_hand += 9 * block_in * out_dim + 9 * out_dim * out_dim + 4 * out_dim
            if b == 0 and block_in != out_dim:
                by_hand += block_in * out_dim + 2 * out_dim
        in_dim = out_dim
    assert _trainable(r18) == by_hand == 11_176_512  # torchvision's 11,689,512 less the FC.


def test_endpoints_shapes_and_dims():
    cfg = resnet.ResNet.resnet50_config().set(name="r", hidden_dim=4, num_blocks_per_stage=[1, 1])
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    image = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 32, 3))
    out, _ = F(
        layer, prng_key=jax.random.PRNGKey(2), state=params, inputs=(image,), is_training=False
    )
    # Bottleneck stages: 4x the stem's dim, then doubling.
    assert layer.endpoints_dims == {"2": 16, "3": 32, "embedding": 32}
    assert out["2"].shape == (2, 8, 8, 16)  # Stem: 1/4 resolution.
    assert out["3"].shape == (2, 4, 4, 32)
    np.testing.assert_allclose(out["embedding"], out["3"].mean(axis=(1, 2)), rtol=1e-6)


def _np_conv(x, w, stride, pad):
    """Cross-correlation of NHWC x with HWIO w (NumPy loops), symmetric padding."""
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw, _, out = w.shape
    oh = (x.shape[1] - kh) // stride + 1
    ow = (x.shape[2] - kw) // stride + 1
    y = np.zeros((x.shape[0], oh, ow, out))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride : i * stride + kh, j * stride : j * stride + kw, :]
            y[:, i, j, :] = np.einsum("nhwc,hwco->no", patch, w)
    return y


def _np_bn_eval(x, p, eps=1e-5):
    return (x - p["moving_mean"]) / np.sqrt(p["moving_variance"] + eps) * p["scale"] + p["bias"]


def test_bottleneck_matches_numpy_in_eval_mode():
    cfg = resnet.Bottleneck.default_config().set(name="b", input_dim=4, output_dim=8, stride=2)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    # Non-trivial moving statistics and affine parameters.
    params = jax.tree_util.tree_map_with_path(
        lambda path, v: (
            jnp.asarray(rng.uniform(0.5, 1.5, v.shape), v.dtype)
            if "moving_variance" in jax.tree_util.keystr(path)
            or "scale" in jax.tree_util.keystr(path)
            else jnp.asarray(rng.normal(0, 0.3, v.shape), v.dtype)
        ),
        params,
    )
    x = rng.normal(size=(2, 6, 6, 4)).astype(np.float32)
    out, _ = F(layer, prng_key=jax.random.PRNGKey(1), state=params, inputs=(x,), is_training=False)
    p = jax.tree_util.tree_map(np.asarray, params)
    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    h = relu(_np_bn_eval(_np_conv(x, p["conv1"]["weight"], 1, 0), p["norm1"]))
    h = relu(_np_bn_eval(_np_conv(h, p["conv2"]["weight"], 2, 1), p["norm2"]))
    h = _np_bn_eval(_np_conv(h, p["conv3"]["weight"], 1, 0), p["norm3"])
    shortcut = _np_bn_eval(
        _np_conv(x, p["downsample"]["conv"]["weight"], 2, 0), p["downsample"]["norm"]
    )
    np.testing.assert_allclose(np.asarray(out), relu(h + shortcut), rtol=1e-4, atol=1e-4)


def test_training_updates_moving_statistics():
    cfg = resnet.BasicBlock.default_config().set(name="b", input_dim=3, output_dim=3)
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = 5.0 + jax.random.normal(jax.random.PRNGKey(1), (4, 4, 4, 3))
    _, out = F(layer, prng_key=jax.random.PRNGKey(1), state=params, inputs=(x,), is_training=True)
    new_mean = out.state_updates["norm1"]["moving_mean"]
    # decay 0.9: the moving mean moves 10% of the way to the batch mean (from 0).
    assert not np.allclose(new_mean, 0.0)
    assert "downsample" not in out.state_updates or not out.state_updates["downsample"]


def test_bad_config_errors_name_the_field():
    cfg = resnet.Downsample.default_config().set(
        name="d", input_dim=2, output_dim=4, stride=2, downsample_op="avgpool"
    )
    with pytest.raises(ValueError, match=r"d\.downsample_op='avgpool' must be 'conv' or 'maxpool'"):
        cfg.instantiate(parent=None)
    cfg = resnet.ResNet.resnet18_config().set(name="r", num_blocks_per_stage=[2, 0])
    with pytest.raises(ValueError, match=r"r\.num_blocks_per_stage=\[2, 0\] must hold positive"):
        cfg.instantiate(parent=None)


def test_maxpool_downsample_and_resnet_d_stem():
    cfg = resnet.Downsample.default_config().set(
        name="d", input_dim=2, output_dim=3, stride=2, downsample_op="maxpool"
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = np.random.default_rng(0).normal(size=(1, 4, 4, 2)).astype(np.float32)
    out, _ = F(layer, prng_key=jax.random.PRNGKey(1), state=params, inputs=(x,), is_training=False)
    pooled = x.reshape(1, 2, 2, 2, 2, 2).max(axis=(2, 4))  # 2x2 max pool, stride 2.
    p = jax.tree_util.tree_map(np.asarray, params)
    expected = _np_bn_eval(_np_conv(pooled, p["conv"]["weight"], 1, 0), p["norm"])
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)

    stem = resnet.StemV1.default_config().set(name="s", hidden_dim=8).instantiate(parent=None)
    shapes = {
        path: tuple(spec.shape)
        for path, spec in flatten_items(stem.create_parameter_specs_recursively())
    }
    assert shapes["conv1_a/weight"] == (3, 3, 3, 4) and shapes["conv1_d/weight"] == (3, 3, 8, 8)
