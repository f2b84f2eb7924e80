"""Tests of axlearn.common.layers against hand-written NumPy references (forward and gradient)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.base_layer import BaseLayer
from axlearn.common.layers import (
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    RedirectToSharedModule,
    RMSNorm,
    StochasticDepth,
    get_activation_fn,
    get_stochastic_depth_linear_rate,
    set_dropout_rate_recursively,
)
from axlearn.common.module import functional

TOL = dict(atol=1e-5, rtol=1e-5)


def _normal(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _build(cfg):
    return cfg.set(name="layer").instantiate(parent=None)


def _run(layer, params, inputs, *, method="forward", is_training=False, prng_key=None):
    out, _ = functional(layer, prng_key, params, inputs, method=method, is_training=is_training)
    return out


def _grads(layer, params, inputs, upstream, *, method="forward", **kwargs):
    """Gradients of sum(layer(inputs) * upstream) w.r.t. (params, float inputs)."""

    def loss(params, inputs):
        out = _run(layer, params, inputs, method=method, **kwargs)
        return jnp.sum(out * upstream)

    return jax.jit(jax.grad(loss, argnums=(0, 1), allow_int=True))(params, inputs)


# --------------------------------------------------------------------------------------------
# Linear.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    layer = _build(Linear.default_config().set(input_dim=5, output_dim=7, bias=bias))
    params = jax.jit(layer.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    assert set(params) == ({"weight", "bias"} if bias else {"weight"})
    w = _normal(1, (5, 7))
    b = _normal(2, (7,))
    params = {"weight": jnp.asarray(w)}
    if bias:
        params["bias"] = jnp.asarray(b)
    x = _normal(3, (2, 3, 5))
    g = _normal(4, (2, 3, 7))
    ref = x.astype(np.float64) @ w + (b if bias else 0)
    np.testing.assert_allclose(_run(layer, params, dict(x=x)), ref, **TOL)
    dparams, dx = _grads(layer, params, dict(x=jnp.asarray(x)), g)
    x2, g2 = x.reshape(-1, 5).astype(np.float64), g.reshape(-1, 7)
    np.testing.assert_allclose(dparams["weight"], x2.T @ g2, **TOL)
    if bias:
        np.testing.assert_allclose(dparams["bias"], g2.sum(0), **TOL)
    np.testing.assert_allclose(dx["x"], g.astype(np.float64) @ w.T, **TOL)


def test_linear_output_partition_spec():
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    mesh = jax.sharding.Mesh(devices, ("data", "model"))
    cfg = Linear.default_config().set(
        input_dim=4, output_dim=6, output_partition_spec=("data", "model")
    )
    layer = _build(cfg)
    params = jax.jit(layer.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    x = _normal(0, (8, 4))
    fn = jax.jit(lambda p, x: _run(layer, p, dict(x=x)))
    with jax.set_mesh(mesh):
        out = fn(params, x)
    assert out.sharding == NamedSharding(mesh, PartitionSpec("data", "model"))
    # Outside a mesh the constraint is a no-op.
    np.testing.assert_allclose(fn(params, x), out, **TOL)
    bad = _build(cfg.clone(output_partition_spec=("data",)))
    with pytest.raises(ValueError, match="output_partition_spec"):
        _run(bad, params, dict(x=x))


# --------------------------------------------------------------------------------------------
# Embedding.
# --------------------------------------------------------------------------------------------


def test_embedding_lookup_and_attend():
    layer = _build(Embedding.default_config().set(num_embeddings=11, dim=6))
    params = jax.jit(layer.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    assert params["weight"].shape == (11, 6)
    table = _normal(1, (11, 6))
    params = {"weight": jnp.asarray(table)}
    ids = np.random.default_rng(2).integers(0, 11, size=(3, 5))
    np.testing.assert_allclose(_run(layer, params, dict(x=ids)), table[ids], **TOL)
    # Gradient of the lookup: upstream gradients scatter-added into the looked-up rows.
    g = _normal(3, (3, 5, 6))
    dparams, _ = _grads(layer, params, dict(x=ids), g)
    ref = np.zeros((11, 6))
    np.add.at(ref, ids.reshape(-1), g.reshape(-1, 6))
    np.testing.assert_allclose(dparams["weight"], ref, **TOL)
    # attend: x @ table.T.
    x = _normal(4, (3, 5, 6))
    ga = _normal(5, (3, 5, 11))
    np.testing.assert_allclose(
        _run(layer, params, dict(x=x), method="attend"), x.astype(np.float64) @ table.T, **TOL
    )
    dparams, dx = _grads(layer, params, dict(x=jnp.asarray(x)), ga, method="attend")
    np.testing.assert_allclose(
        dparams["weight"], ga.reshape(-1, 11).T.astype(np.float64) @ x.reshape(-1, 6), **TOL
    )
    np.testing.assert_allclose(dx["x"], ga.astype(np.float64) @ table, **TOL)


def test_embedding_scale():
    cfg = Embedding.default_config().set(num_embeddings=4, dim=9, scale=Embedding.Scale.UNIT)
    layer = _build(cfg)
    table = _normal(0, (4, 9))
    out = _run(layer, {"weight": jnp.asarray(table)}, dict(x=np.array([1, 3])))
    np.testing.assert_allclose(out, table[[1, 3]] * 3.0, **TOL)
    with pytest.raises(ValueError, match="scale_constant"):
        _build(cfg.clone(scale=Embedding.Scale.CONSTANT))


# --------------------------------------------------------------------------------------------
# Normalization.
# --------------------------------------------------------------------------------------------


def _rms_norm_ref(x, s, eps):
    x = x.astype(np.float64)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * s, r


def test_rms_norm():
    eps = 1e-5
    layer = _build(RMSNorm.default_config().set(input_dim=8, eps=eps))
    params = jax.jit(layer.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(params["scale"], np.ones(8))
    s = 1.0 + 0.1 * _normal(1, (8,))
    params = {"scale": jnp.asarray(s)}
    x = _normal(2, (3, 4, 8))
    g = _normal(3, (3, 4, 8))
    ref, r = _rms_norm_ref(x, s, eps)
    np.testing.assert_allclose(_run(layer, params, dict(x=x)), ref, **TOL)
    dparams, dx = _grads(layer, params, dict(x=jnp.asarray(x)), g)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(dparams["scale"], (g * x64 * r).sum(axis=(0, 1)), **TOL)
    # d/dx_j = r g_j s_j - r^3 x_j / D * sum_i g_i s_i x_i.
    ref_dx = r * g * s - r**3 * x64 / 8 * np.sum(g * s * x64, axis=-1, keepdims=True)
    np.testing.assert_allclose(dx["x"], ref_dx, **TOL)


def test_rms_norm_forward_dtype():
    x = _normal(0, (2, 8)).astype(jnp.bfloat16)
    params = {"scale": jnp.ones(8, jnp.float32)}
    for forward_dtype in (jnp.float32, None):
        cfg = RMSNorm.default_config().set(input_dim=8, eps=1e-5, forward_dtype=forward_dtype)
        out = _run(_build(cfg), params, dict(x=x))
        ref, _ = _rms_norm_ref(np.asarray(x, np.float32), 1.0, 1e-5)
        np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=3e-2, rtol=3e-2)


def test_layer_norm():
    eps = 1e-6
    layer = _build(LayerNorm.default_config().set(input_dim=8, eps=eps))
    params = jax.jit(layer.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(params["scale"], np.ones(8))
    np.testing.assert_array_equal(params["bias"], np.zeros(8))
    s = 1.0 + 0.1 * _normal(1, (8,))
    b = _normal(2, (8,))
    params = {"scale": jnp.asarray(s), "bias": jnp.asarray(b)}
    x = _normal(3, (5, 8))
    g = _normal(4, (5, 8))
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    r = 1.0 / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x64 - mu) * r
    np.testing.assert_allclose(_run(layer, params, dict(x=x)), xhat * s + b, **TOL)
    dparams, dx = _grads(layer, params, dict(x=jnp.asarray(x)), g)
    np.testing.assert_allclose(dparams["scale"], (g * xhat).sum(0), **TOL)
    np.testing.assert_allclose(dparams["bias"], g.sum(0), **TOL)
    dxhat = g * s
    ref_dx = r * (
        dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True)
    )
    np.testing.assert_allclose(dx["x"], ref_dx, **TOL)


# --------------------------------------------------------------------------------------------
# Dropout and stochastic depth.
# --------------------------------------------------------------------------------------------


def test_dropout():
    rate = 0.3
    layer = _build(Dropout.default_config().set(rate=rate))
    key = jax.random.PRNGKey(5)
    x = _normal(0, (64, 128))
    g = _normal(1, (64, 128))
    # Eval: identity.
    np.testing.assert_array_equal(_run(layer, {}, dict(x=x)), x)
    # The root layer's key is the functional() key: the mask is bernoulli(key, rate).
    mask = np.asarray(jax.random.bernoulli(key, rate, x.shape))
    ref = np.where(mask, 0.0, x.astype(np.float64)) / (1 - rate)
    out = _run(layer, {}, dict(x=x), is_training=True, prng_key=key)
    np.testing.assert_allclose(out, ref, **TOL)
    _, dx = _grads(layer, {}, dict(x=jnp.asarray(x)), g, is_training=True, prng_key=key)
    np.testing.assert_allclose(dx["x"], np.where(mask, 0.0, g) / (1 - rate), **TOL)
    assert abs(mask.mean() - rate) < 0.01
    # rate None / 0: identity even in training.
    for r in (None, 0.0):
        layer = _build(Dropout.default_config().set(rate=r))
        np.testing.assert_array_equal(_run(layer, {}, dict(x=x), is_training=True, prng_key=key), x)


def test_set_dropout_rate_recursively():
    from axlearn.common.config import config_class
    from axlearn.common.module import Module

    class Holder(Module):
        @config_class
        class Config(Module.Config):
            # Two dropouts.
            a: Dropout.Config = Dropout.default_config()
            b: Dropout.Config = Dropout.default_config().set(rate=0.5)

    cfg = Holder.default_config()
    set_dropout_rate_recursively(cfg, 0.1, set_only_if_none=True)
    assert (cfg.a.rate, cfg.b.rate) == (0.1, 0.5)
    set_dropout_rate_recursively(cfg, 0.2)
    assert (cfg.a.rate, cfg.b.rate) == (0.2, 0.2)


@pytest.mark.parametrize("mode", ["row", "batch"])
def test_stochastic_depth(mode):
    rate = 0.4
    layer = _build(StochasticDepth.default_config().set(rate=rate, mode=mode))
    key = jax.random.PRNGKey(11)
    x = _normal(0, (16, 3, 4))
    g = _normal(1, (16, 3, 4))
    np.testing.assert_array_equal(_run(layer, {}, dict(x=x)), x)
    shape = (16, 1, 1) if mode == "row" else (1, 1, 1)
    u = np.asarray(jax.random.uniform(key, shape, dtype=jnp.float32))
    keep = np.floor((1 - rate) + u)
    ref = x.astype(np.float64) * keep / (1 - rate)
    out = _run(layer, {}, dict(x=x), is_training=True, prng_key=key)
    np.testing.assert_allclose(out, ref, **TOL)
    _, dx = _grads(layer, {}, dict(x=jnp.asarray(x)), g, is_training=True, prng_key=key)
    np.testing.assert_allclose(dx["x"], g * keep / (1 - rate), **TOL)
    bad = _build(StochasticDepth.default_config().set(rate=0.1, mode="col"))
    with pytest.raises(ValueError, match="mode"):
        _run(bad, {}, dict(x=x), is_training=True, prng_key=key)


def test_stochastic_depth_linear_rate():
    assert get_stochastic_depth_linear_rate(0.5, 2, 4) == 0.25
    with pytest.raises(ValueError):
        get_stochastic_depth_linear_rate(1.5, 1, 4)


# --------------------------------------------------------------------------------------------
# Activations.
# --------------------------------------------------------------------------------------------


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf)


def _gelu_tanh(x):
    t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3))
    dt = (1 - t**2) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x**2)
    return 0.5 * x * (1 + t), 0.5 * (1 + t) + 0.5 * x * dt


def _gelu_exact(x):
    cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
    pdf = np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
    return x * cdf, cdf + x * pdf


def _silu(x):
    s = _sigmoid(x)
    return x * s, s + x * s * (1 - s)


def _quick_gelu(x):
    s = _sigmoid(1.702 * x)
    return x * s, s + 1.702 * x * s * (1 - s)


# name -> x -> (f(x), f'(x)).
_ACTIVATION_REFS = {
    "linear": lambda x: (x, np.ones_like(x)),
    "nn.relu": lambda x: (np.maximum(x, 0), (x > 0).astype(np.float64)),
    "squared_relu": lambda x: (np.maximum(x, 0) ** 2, 2 * np.maximum(x, 0)),
    "nn.silu": _silu,
    "nn.gelu": _gelu_tanh,
    "exact_gelu": _gelu_exact,
    "quick_gelu": _quick_gelu,
    "nn.tanh": lambda x: (np.tanh(x), 1 - np.tanh(x) ** 2),
    "nn.sigmoid": lambda x: (_sigmoid(x), _sigmoid(x) * (1 - _sigmoid(x))),
}


@pytest.mark.parametrize("name", sorted(_ACTIVATION_REFS))
def test_activation(name):
    fn = get_activation_fn(name)
    x = _normal(0, (1000,))
    ref_y, ref_dy = _ACTIVATION_REFS[name](x.astype(np.float64))
    np.testing.assert_allclose(jax.jit(fn)(jnp.asarray(x)), ref_y, **TOL)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(fn)))(jnp.asarray(x)), ref_dy, **TOL)


def test_activation_unknown():
    with pytest.raises(NotImplementedError, match="nn.swishh"):
        get_activation_fn("nn.swishh")


def test_config_dump_lines_match_reference():
    """Default fields print as in the reference trainer dump (None defaults are omitted)."""
    norm = RMSNorm.default_config().set(eps=1e-5, forward_dtype=None)
    assert norm.debug_string().split("\n") == [
        "eps: 1e-05",
        "forward_dtype: None",
        "klass: 'axlearn.common.layers.RMSNorm'",
    ]
    assert Dropout.default_config().debug_string() == "klass: 'axlearn.common.layers.Dropout'"
    assert StochasticDepth.default_config().debug_string().split("\n") == [
        "klass: 'axlearn.common.layers.StochasticDepth'",
        "mode: 'row'",
    ]
    batch = ("data", "expert", "fsdp")
    linear = Linear.default_config().set(
        bias=False,
        param_partition_spec=(("expert", "fsdp", "seq"), "model"),
        output_partition_spec=(batch, "seq", "model"),
    )
    assert linear.debug_string().split("\n") == [
        "bias: False",
        "klass: 'axlearn.common.layers.Linear'",
        "output_partition_spec[0][0]: 'data'",
        "output_partition_spec[0][1]: 'expert'",
        "output_partition_spec[0][2]: 'fsdp'",
        "output_partition_spec[1]: 'seq'",
        "output_partition_spec[2]: 'model'",
        "param_partition_spec[0][0]: 'expert'",
        "param_partition_spec[0][1]: 'fsdp'",
        "param_partition_spec[0][2]: 'seq'",
        "param_partition_spec[1]: 'model'",
    ]
    emb = Embedding.default_config().set(param_partition_spec=(("expert", "fsdp", "seq"), "model"))
    assert emb.debug_string().split("\n") == [
        "klass: 'axlearn.common.layers.Embedding'",
        "param_init.init_by_param_name['.*weight$'].distribution: 'normal'",
        "param_init.init_by_param_name['.*weight$'].fan: 'fan_out'",
        "param_init.init_by_param_name['.*weight$'].klass: "
        "'axlearn.common.param_init.WeightInitializer'",
        "param_init.init_by_param_name['.*weight$'].scale: 1.0",
        "param_init.klass: 'axlearn.common.param_init.DefaultInitializer'",
        "param_partition_spec[0][0]: 'expert'",
        "param_partition_spec[0][1]: 'fsdp'",
        "param_partition_spec[0][2]: 'seq'",
        "param_partition_spec[1]: 'model'",
    ]


def test_set_bias_and_norm_recursively():
    from axlearn.common.layers import RMSNorm, set_bias_recursively, set_norm_recursively
    from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

    cfg = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=2, hidden_dim=32, vocab_size=50
    )
    layer = cfg.decoder.transformer.layer
    layer.feed_forward.linear1.bias = True
    set_bias_recursively(cfg, False)
    assert layer.feed_forward.linear1.bias is False
    set_bias_recursively(cfg, True)
    assert layer.feed_forward.linear2.bias is True
    assert layer.self_attention.attention.output_linear.bias is True
    norm = RMSNorm.default_config().set(eps=1e-3)
    set_norm_recursively(cfg, norm)
    for found in (cfg.decoder.output_norm, layer.feed_forward.norm, layer.self_attention.norm):
        assert found.klass is RMSNorm and found.eps == 1e-3 and found is not norm
    # Norms with an input_dim keep it (here: the per-head QK-norm is unset, so still None).
    assert layer.self_attention.attention.query_scale.norm is None


def test_redirect_to_shared_module():
    """Two redirects call one shared Linear (parameters once, at the sharing parent)."""

    class _Twice(Linear):
        def forward_twice(self, x):
            return self.forward(self.forward(x))

    class _Parent(BaseLayer):
        def __init__(self, cfg, *, parent):
            super().__init__(cfg, parent=parent)
            shared = self._add_child(
                "shared", _Twice.default_config().set(input_dim=2, output_dim=2)
            )
            self._share_with_descendants(shared, shared_module_name="shared")
            redirect = RedirectToSharedModule.default_config().set(shared_module="shared")
            self._add_child("once", redirect)
            self._add_child("twice", redirect.clone(method_map=dict(forward="forward_twice")))

        def forward(self, x):
            return self.once(x), self.twice(x)

    layer = _Parent.default_config().set(name="parent").instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert sorted(params) == ["once", "shared", "twice"] and params["once"] == {}
    x = jnp.array([[1.0, -2.0]])
    (once, twice), _ = functional(layer, None, params, [x], is_training=False)
    w, b = np.asarray(params["shared"]["weight"]), np.asarray(params["shared"]["bias"])
    np.testing.assert_allclose(once, np.asarray(x) @ w + b, rtol=1e-6)
    np.testing.assert_allclose(twice, (np.asarray(x) @ w + b) @ w + b, rtol=1e-6)
