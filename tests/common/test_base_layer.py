"""Tests of axlearn.common.base_layer: specs, initialization, sharding, remat, init dumps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from axlearn.common.base_layer import (
    BaseLayer,
    ParameterSpec,
    RematSpec,
    initialize_parameters_on_mesh,
    param_init_debug_string,
)
from axlearn.common.config import REQUIRED, Required, config_class, config_for_function
from axlearn.common.module import functional
from axlearn.common.utils import save_and_offload_only_these_names_regex


class Dense(BaseLayer):
    """x @ weight + bias."""

    @config_class
    class Config(BaseLayer.Config):
        # Input dim.
        input_dim: Required[int] = REQUIRED
        # Output dim.
        output_dim: Required[int] = REQUIRED

    @classmethod
    def default_config(cls):
        cfg = super().default_config()
        cfg.param_partition_spec = (None, None)
        return cfg

    def _create_layer_parameter_specs(self):
        cfg = self.config
        return dict(
            weight=ParameterSpec(
                shape=(cfg.input_dim, cfg.output_dim), mesh_axes=cfg.param_partition_spec
            ),
            bias=ParameterSpec(shape=[cfg.output_dim], mesh_axes=(cfg.param_partition_spec[-1],)),
        )

    def forward(self, x):
        y = x @ self.parameters["weight"] + self.parameters["bias"]
        return self._remat_name(y, "out")


class TwoLayer(BaseLayer):
    @config_class
    class Config(BaseLayer.Config):
        # Model dim.
        dim: int = 8
        # Hidden dim.
        hidden: int = 16
        # Child names in creation order.
        names: tuple = ("layer0", "layer1")
        # Config of each layer.
        layer: Dense.Config = Dense.default_config()

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        dims = [cfg.dim, cfg.hidden, cfg.dim]
        for i, name in enumerate(cfg.names):
            self._add_child(
                name, cfg.layer.clone(input_dim=dims[i % 2], output_dim=dims[i % 2 + 1])
            )

    def forward(self, x):
        for name in self.config.names:
            x = jnp.tanh(self.children[name](x))
        return x


def _model(**kwargs):
    return TwoLayer.default_config().set(name="model", **kwargs).instantiate(parent=None)


def test_specs_and_init_structure():
    model = _model()
    specs = model.create_parameter_specs_recursively()
    assert set(specs) == {"layer0", "layer1"}
    w = specs["layer0"]["weight"]
    assert tuple(w.shape) == (8, 16) and w.dtype == jnp.float32
    assert w.mesh_axes == PartitionSpec(None, None)
    assert w.fans() == dict(fan_in=8, fan_out=16, fan_avg=12)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert jax.tree.map(lambda x: x.shape, params) == {
        "layer0": {"weight": (8, 16), "bias": (16,)},
        "layer1": {"weight": (16, 8), "bias": (8,)},
    }
    np.testing.assert_array_equal(params["layer0"]["bias"], 0.0)
    # eval_shape: no allocation, same structure.
    abstract = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
    assert jax.tree.map(lambda x: x.shape, abstract) == jax.tree.map(lambda x: x.shape, params)


def test_dtype_inherited():
    model = _model(dtype=jnp.bfloat16)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))


def test_adding_sibling_keeps_values():
    key = jax.random.PRNGKey(3)
    p1 = _model(names=("layer0", "layer1")).initialize_parameters_recursively(key)
    p2 = _model(names=("extra", "layer0", "layer1")).initialize_parameters_recursively(key)
    # "extra" takes dims (8, 16), so layer0/layer1 swap dims; compare by path where shapes match.
    p3 = _model(names=("layer0", "layer1", "zzz", "yyy")).initialize_parameters_recursively(key)
    for name in ("layer0", "layer1"):
        for k in ("weight", "bias"):
            np.testing.assert_array_equal(p1[name][k], p3[name][k])
    assert p2["extra"]["weight"].shape == (8, 16)
    assert not np.array_equal(p1["layer0"]["weight"], p3["zzz"]["weight"])


def test_sharded_init_and_forward_match_single_device():
    devices = np.array(jax.devices()[:8]).reshape(2, 4)
    mesh = jax.sharding.Mesh(devices, ("data", "model"))
    cfg = TwoLayer.default_config().set(name="model")
    cfg.layer.param_partition_spec = ("data", "model")
    model = cfg.instantiate(parent=None)
    key = jax.random.PRNGKey(0)
    params = initialize_parameters_on_mesh(model, key, mesh=mesh)
    assert params["layer0"]["weight"].sharding == NamedSharding(
        mesh, PartitionSpec("data", "model")
    )
    assert params["layer1"]["bias"].sharding == NamedSharding(mesh, PartitionSpec("model"))
    shard_shapes = {s.data.shape for s in params["layer0"]["weight"].addressable_shards}
    assert shard_shapes == {(4, 4)}
    ref_params = _model().initialize_parameters_recursively(key)
    jax.tree.map(np.testing.assert_array_equal, params, ref_params)
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))

    def fwd(p, x):
        return functional(model, None, p, dict(x=x), is_training=False)[0]

    with jax.set_mesh(mesh):
        sharded_out = jax.jit(fwd)(params, x)
    ref_out = fwd(ref_params, x)
    np.testing.assert_allclose(sharded_out, ref_out, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("names_which_can_be_saved", [None, ".*out"])
def test_remat_same_values_and_grads(names_which_can_be_saved):
    key = jax.random.PRNGKey(0)
    plain = _model()
    cfg = TwoLayer.default_config().set(name="model")
    cfg.layer.remat_spec = RematSpec(
        prevent_cse=False,
        policy=config_for_function(save_and_offload_only_these_names_regex).set(
            names_which_can_be_saved=names_which_can_be_saved,
            names_which_can_be_offloaded=None,
            offload_src="device",
            offload_dst="pinned_host",
        ),
    )
    remat = cfg.instantiate(parent=None)
    params = plain.initialize_parameters_recursively(key)
    x = jax.random.normal(key, (2, 8))

    def loss(model):
        return lambda p: jnp.sum(functional(model, None, p, dict(x=x), is_training=True)[0] ** 2)

    g1 = jax.grad(loss(plain))(params)
    g2 = jax.grad(loss(remat))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), g1, g2)
    assert remat.layer0._remat_methods == ["forward"]


def test_param_init_debug_string():
    expected = (
        "layer0/weight: uniform(-sqrt(3.0 / fan_avg), sqrt(3.0 / fan_avg)), shape=(8, 16), "
        "axes=FanAxes(in_axis=-2, out_axis=-1, batch_axis=())\n"
        "layer0/bias: constant(0.0)\n"
        "layer1/weight: uniform(-sqrt(3.0 / fan_avg), sqrt(3.0 / fan_avg)), shape=(16, 8), "
        "axes=FanAxes(in_axis=-2, out_axis=-1, batch_axis=())\n"
        "layer1/bias: constant(0.0)\n"
    )
    assert param_init_debug_string(_model()) == expected
