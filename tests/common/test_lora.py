"""Tests of axlearn.common.lora against NumPy low-rank updates and a PyTorch `MergedLinear`."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    FusedQKVLinear,
    MultiheadOutputLinear,
    QKVLinear,
)
from axlearn.common.golden import golden_path, load_golden
from axlearn.common.layers import Linear
from axlearn.common.lora import (
    LoraFusedQKVAdapter,
    LoraFusedQKVLinear,
    LoraLinear,
    LoraLinearAdapter,
    LoraMultiheadOutputLinear,
    LoraUpFusedGroupedLinear,
)
from axlearn.common.module import functional as F

# The golden module name AXLearn's lora_test reads (`load_golden(_MODULE_NAME, ...)`).
GOLDEN_MODULE = "axlearn.common.lora_test"
UPDATE_ENV = "AXLEARN_UPDATE_GOLDENS"
# The q/k/v enable patterns of AXLearn's test_forward_torch.
TORCH_CASES = [
    (True, True, True),
    (False, True, True),
    (True, False, True),
    (True, True, False),
    (True, False, False),
    (False, True, False),
    (False, False, True),
]


def _rand(key: int, shape, scale: float = 1.0) -> np.ndarray:
    return np.random.default_rng(key).standard_normal(shape).astype(np.float32) * scale


def _run(layer, state, *inputs, **kwargs):
    """The layer's forward on `inputs` (positional) or `kwargs`, jitted (one compile)."""
    out, _ = jax.jit(functools.partial(F, layer, is_training=False))(
        state=state, prng_key=jax.random.PRNGKey(0), inputs=inputs if inputs else kwargs
    )
    return out


def _as_np(tree):
    return jax.tree.map(np.asarray, tree)


def test_lora_linear_matches_numpy_and_merged_weight():
    din, dout, rank, alpha = 6, 5, 2, 8.0
    cfg = LoraLinear.default_config().set(name="lora", input_dim=din, output_dim=dout)
    cfg.adapter.set(rank=rank, alpha=alpha)
    layer = cfg.instantiate(parent=None)
    state = _as_np(layer.initialize_parameters_recursively(jax.random.PRNGKey(1)))
    # A fresh adapter's up projection is zero (LoRA's B), so the layer starts as `layer`.
    assert np.all(state["adapter"]["lora_up"]["weight"] == 0)
    assert np.abs(state["adapter"]["lora_down"]["weight"]).sum() > 0
    state["adapter"]["lora_up"]["weight"] = _rand(2, (rank, dout))
    x = _rand(3, (2, 4, din))
    w, b = state["layer"]["weight"], state["layer"]["bias"]
    a, bb = state["adapter"]["lora_down"]["weight"], state["adapter"]["lora_up"]["weight"]
    expected = x @ w + b + (alpha / rank) * (x @ a @ bb)
    out = _run(layer, state, x)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
    # The merged weight W + (alpha / rank) A B in a plain Linear gives the adapted output.
    plain = Linear.default_config().set(name="plain", input_dim=din, output_dim=dout)
    merged = dict(weight=w + (alpha / rank) * a @ bb, bias=b)
    np.testing.assert_allclose(
        _run(plain.instantiate(parent=None), merged, x), out, atol=1e-5, rtol=1e-5
    )
    # alpha = 0 switches the adapter off whatever its weights.
    cfg0 = cfg.clone()
    cfg0.adapter.alpha = 0.0
    np.testing.assert_allclose(
        _run(cfg0.instantiate(parent=None), state, x), x @ w + b, atol=1e-5, rtol=1e-5
    )


def test_lora_multihead_output_linear_matches_numpy_and_merged_weight():
    dim, heads, per_head, rank, alpha = 8, 2, 4, 3, 6.0
    cfg = LoraMultiheadOutputLinear.default_config().set(
        name="o", model_dim=dim, num_heads=heads, per_head_dim=per_head
    )
    cfg.adapter.set(rank=rank, alpha=alpha)
    layer = cfg.instantiate(parent=None)
    state = _as_np(layer.initialize_parameters_recursively(jax.random.PRNGKey(1)))
    assert state["adapter"]["lora_down"]["weight"].shape == (rank, heads, per_head)
    assert state["adapter"]["lora_up"]["weight"].shape == (rank, dim)
    state["adapter"]["lora_up"]["weight"] = _rand(2, (rank, dim))
    x = _rand(3, (2, 5, heads, per_head))
    w, b = state["layer"]["weight"], state["layer"]["bias"]  # [dim, heads, per_head], [dim].
    down, up = state["adapter"]["lora_down"]["weight"], state["adapter"]["lora_up"]["weight"]
    xf = x.reshape(2, 5, heads * per_head)
    wf = w.reshape(dim, heads * per_head).T
    downf = down.reshape(rank, heads * per_head).T
    expected = xf @ wf + b + (alpha / rank) * (xf @ downf @ up)
    out = _run(layer, state, x)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
    merged_w = (wf + (alpha / rank) * downf @ up).T.reshape(dim, heads, per_head)
    plain = MultiheadOutputLinear.default_config().set(
        name="plain", model_dim=dim, num_heads=heads, per_head_dim=per_head
    )
    np.testing.assert_allclose(
        _run(plain.instantiate(parent=None), dict(weight=merged_w, bias=b), x),
        out,
        atol=1e-5,
        rtol=1e-5,
    )


def _qkv_numpy(x, proj_weights, down, ups, enable, scaling):
    """q/k/v = x W_p (+ scaling * x A_s B_s for the s-th enabled projection)."""
    outs, s = [], 0
    for p, name in enumerate(("query", "key", "value")):
        y = np.einsum("btd,dnh->btnh", x, proj_weights[p])
        if enable[name]:
            y = y + scaling * np.einsum("btd,dr,rnh->btnh", x, down[:, s], ups[s])
            s += 1
        outs.append(y)
    return outs


@pytest.mark.parametrize("enable", [(True, False, True), (False, True, False)])
def test_lora_fused_qkv_linear_matches_numpy_and_merged_weight(enable):
    dim, heads, per_head, rank, alpha = 6, 2, 3, 2, 4.0
    enable_lora = dict(zip(("query", "key", "value"), enable))
    cfg = LoraFusedQKVLinear.default_config().set(
        name="qkv",
        query_dim=dim,
        key_dim=dim,
        value_dim=dim,
        num_heads=heads,
        per_head_dim=per_head,
    )
    cfg.adapter.set(rank=rank, alpha=alpha, enable_lora=enable_lora)
    layer = cfg.instantiate(parent=None)
    state = _as_np(layer.initialize_parameters_recursively(jax.random.PRNGKey(1)))
    s = sum(enable)
    assert state["adapter"]["lora_down"]["weight"].shape == (dim, s, rank)
    assert state["adapter"]["lora_up"]["weight"].shape == (s, rank, heads, per_head)
    state["adapter"]["lora_up"]["weight"] = _rand(2, (s, rank, heads, per_head))
    state["layer"]["qkv_proj"]["bias"] = np.zeros_like(state["layer"]["qkv_proj"]["bias"])
    x = _rand(3, (2, 4, dim))
    w = state["layer"]["qkv_proj"]["weight"]  # [3, dim, heads, per_head].
    down, up = state["adapter"]["lora_down"]["weight"], state["adapter"]["lora_up"]["weight"]
    expected = _qkv_numpy(x, w, down, up, enable_lora, alpha / rank)
    out = _run(layer, state, x)
    for got, want in zip(out, expected):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # Merged: W_p + scaling * A_s B_s in a plain FusedQKVLinear.
    merged = w.copy()
    for i, p in enumerate(p for p, on in enumerate(enable) if on):
        merged[p] += (alpha / rank) * np.einsum("dr,rnh->dnh", down[:, i], up[i])
    plain = FusedQKVLinear.default_config().set(
        name="plain",
        query_dim=dim,
        key_dim=dim,
        value_dim=dim,
        num_heads=heads,
        per_head_dim=per_head,
    )
    merged_out = _run(
        plain.instantiate(parent=None),
        dict(qkv_proj=dict(weight=merged, bias=state["layer"]["qkv_proj"]["bias"])),
        x,
    )
    for got, want in zip(merged_out, out):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_lora_fused_grouped_qkv_linear_matches_numpy():
    dim, heads, kv_heads, per_head, rank, alpha = 8, 4, 2, 2, 2, 4.0
    enable_lora = dict(query=True, key=True, value=True)
    cfg = LoraFusedQKVLinear.default_config().set(
        name="qkv",
        query_dim=dim,
        key_dim=dim,
        value_dim=dim,
        num_heads=heads,
        per_head_dim=per_head,
        layer=FusedGroupedQKVLinear.default_config().set(num_kv_heads=kv_heads),
    )
    cfg.adapter.set(
        rank=rank,
        alpha=alpha,
        enable_lora=enable_lora,
        lora_up=LoraUpFusedGroupedLinear.default_config(),
    )
    layer = cfg.instantiate(parent=None)
    assert layer.num_kv_heads == kv_heads
    state = _as_np(layer.initialize_parameters_recursively(jax.random.PRNGKey(1)))
    up = state["adapter"]["lora_up"]
    assert up["query_weight"].shape == (rank, heads, per_head)
    assert up["key_weight"].shape == (rank, kv_heads, per_head)
    assert all(np.all(v == 0) for v in up.values())
    ups = [_rand(10 + i, up[f"{n}_weight"].shape) for i, n in enumerate(("query", "key", "value"))]
    for n, u in zip(("query", "key", "value"), ups):
        up[f"{n}_weight"] = u
    x = _rand(3, (2, 4, dim))
    w = state["layer"]["qkv_proj"]["weight"]  # [dim, heads + 2 * kv_heads, per_head].
    b = state["layer"]["qkv_proj"]["bias"]
    split = [w[:, :heads], w[:, heads : heads + kv_heads], w[:, heads + kv_heads :]]
    bias = [b[:heads], b[heads : heads + kv_heads], b[heads + kv_heads :]]
    expected = _qkv_numpy(
        x, split, state["adapter"]["lora_down"]["weight"], ups, enable_lora, alpha / rank
    )
    out = _run(layer, state, x)
    for got, want, bb in zip(out, expected, bias):
        np.testing.assert_allclose(got, want + bb, atol=1e-5, rtol=1e-5)


def _torch_merged_linear(x, down, up, enable, scaling):
    """loralib's MergedLinear LoRA branch, in PyTorch: A as a linear, B as a grouped conv1d.

    Args:
        x: [batch, seq, input_dim].
        down: Our fused down weight [input_dim, s, rank].
        up: Our fused up weight [s, rank, heads, per_head_dim].
        enable: Three bools (q, k, v).
        scaling: alpha / rank.

    Returns:
        [batch, seq, 3 * heads * per_head_dim], zero where a projection has no adapter.
    """
    s, rank, heads, per_head = up.shape
    out_per = heads * per_head
    lora_a = torch.tensor(down.transpose(1, 2, 0).reshape(s * rank, -1))
    lora_b = torch.tensor(up.transpose(0, 2, 3, 1).reshape(s * out_per, rank))
    after_a = torch.nn.functional.linear(torch.tensor(x), lora_a)  # [b, t, s * rank].
    after_b = torch.nn.functional.conv1d(
        after_a.transpose(-2, -1), lora_b.unsqueeze(-1), groups=s
    ).transpose(-2, -1)  # [b, t, s * out_per].
    result = torch.zeros((*x.shape[:-1], 3 * out_per), dtype=after_b.dtype)
    groups = [p for p in range(3) if enable[p]]
    for i, p in enumerate(groups):
        result[..., p * out_per : (p + 1) * out_per] = after_b[..., i * out_per : (i + 1) * out_per]
    return (result * scaling).numpy()


def _torch_case_name(enable) -> str:
    """AXLearn's golden test name of a q/k/v enable pattern."""
    return "test_forward_torch_q{}_k{}_v{}".format(*(int(e) for e in enable))


def _torch_case(enable):
    """Inputs, params and PyTorch outputs of one test_forward_torch case."""
    dim, heads, rank, alpha = 10, 2, 2, 12
    seed = int("".join(str(int(e)) for e in enable), 2)
    s = sum(enable)
    x = _rand(100 + seed, (2, 3, dim)).astype(np.float32)
    down = _rand(200 + seed, (dim, s, rank), 0.3).astype(np.float32)
    up = _rand(300 + seed, (s, rank, heads, dim // heads), 0.3).astype(np.float32)
    out = _torch_merged_linear(x, down, up, enable, alpha / rank)
    return dict(x=x, lora_down_weight=down, lora_up_weight=up, torch_out=out)


def test_fused_qkv_adapter_matches_torch_golden():
    """The shipped golden (AXLearn's lora_test reads it) holds PyTorch's outputs; ours match."""
    path = golden_path(GOLDEN_MODULE)
    cases = {e: _torch_case(e) for e in TORCH_CASES}
    if os.environ.get(UPDATE_ENV):
        arrays = {}
        for e, c in cases.items():
            name = _torch_case_name(e)
            arrays[f"{name}/inputs/x"] = c["x"]
            arrays[f"{name}/params/lora_down_weight"] = c["lora_down_weight"]
            arrays[f"{name}/params/lora_up_weight"] = c["lora_up_weight"]
            arrays[f"{name}/outputs/torch_out"] = c["torch_out"]
        np.savez(path, **arrays)
    for e, c in cases.items():
        golden = load_golden(GOLDEN_MODULE, _torch_case_name(e))
        np.testing.assert_allclose(golden["outputs"]["torch_out"], c["torch_out"], atol=1e-6)
        enable_lora = dict(zip(("query", "key", "value"), e))
        layer = (
            LoraFusedQKVAdapter.default_config()
            .set(
                name="a",
                input_dim=10,
                output_dim=10,
                rank=2,
                alpha=12,
                num_heads=2,
                enable_lora=enable_lora,
            )
            .instantiate(parent=None)
        )
        state = dict(
            lora_down=dict(weight=golden["params"]["lora_down_weight"]),
            lora_up=dict(weight=golden["params"]["lora_up_weight"]),
            lora_dropout={},
        )
        proj = np.asarray(_run(layer, state, golden["inputs"]["x"]))  # [s, b, t, n, h].
        full = np.zeros((3, *proj.shape[1:]), proj.dtype)
        full[np.array(e)] = proj
        ours = full.transpose(1, 2, 0, 3, 4).reshape(2, 3, -1)
        np.testing.assert_allclose(ours, golden["outputs"]["torch_out"], atol=1e-5)


def test_lora_adapter_partition_specs_and_dropout():
    cfg = LoraLinearAdapter.default_config().set(
        name="a", rank=2, alpha=1.0, input_dim=2, output_dim=4
    )
    cfg.lora_down.param_partition_spec = ["data", None]
    cfg.lora_up.param_partition_spec = [None, "data"]
    specs = cfg.instantiate(parent=None).create_parameter_specs_recursively()
    assert tuple(specs["lora_down"]["weight"].mesh_axes) == ("data", None)
    assert tuple(specs["lora_up"]["weight"].mesh_axes) == (None, "data")
    assert cfg.dropout.rate == 0.0


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(rank=0), "rank must be > 0"),
        (dict(rank=7), "greater than input_dim"),
        (dict(enable_lora=dict(query=True, key=True)), "exactly the keys"),
        (dict(enable_lora=dict(query=1, key=True, value=True)), "expects dict"),
        (dict(enable_lora=dict(query=False, key=False, value=False)), "enables no projection"),
        (dict(num_kv_heads=1), "LoraUpFusedGroupedLinear"),
    ],
)
def test_bad_adapter_configs_name_the_field(change, message):
    cfg = LoraFusedQKVAdapter.default_config().set(
        name="adapter",
        input_dim=6,
        output_dim=6,
        rank=2,
        alpha=1.0,
        num_heads=2,
        enable_lora=dict(query=True, key=True, value=True),
    )
    with pytest.raises((ValueError, TypeError), match=message):
        cfg.set(**change).instantiate(parent=None)


def test_lora_fused_qkv_linear_refuses_cross_attention():
    cfg = LoraFusedQKVLinear.default_config().set(
        name="qkv",
        query_dim=4,
        key_dim=4,
        value_dim=4,
        num_heads=2,
        per_head_dim=2,
        layer=QKVLinear.default_config(),
    )
    cfg.adapter.set(rank=1, alpha=1.0, enable_lora=dict(query=True, key=False, value=False))
    layer = cfg.instantiate(parent=None)
    state = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jnp.ones((1, 2, 4))
    with pytest.raises(ValueError, match="self-attention only"):
        _run(layer, state, query=x, key=x, value=x)
