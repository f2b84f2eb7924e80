"""Tests axlearn/common/factorized_rms.py against optax and a NumPy Adafactor reference."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from axlearn.common import factorized_rms
from axlearn.common.base_layer import FactorizationSpec, ParameterSpec
from axlearn.common.config import config_for_function
from axlearn.common.optimizer_base import OptParam, OptStateSpec
from axlearn.common.schedule import adafactor_decay_rate
from axlearn.common.utils import PartitionSpec


def _param(shape, axes, seed=0):
    spec = None if axes is None else FactorizationSpec(axes=axes)
    value = jax.random.normal(jax.random.PRNGKey(seed), shape)
    return OptParam(value=value, factorization_spec=spec, weight_decay_scale=1.0)


def _grads(params, step):
    return jax.tree.map(
        lambda p: jax.random.normal(jax.random.PRNGKey(1000 + step), p.shape) * 3.0,
        params,
        is_leaf=lambda x: isinstance(x, OptParam),
    )


@pytest.mark.parametrize("factored", [True, False])
def test_matches_optax_when_row_and_col_are_the_two_largest_axes(factored):
    # optax factors over the largest ("row") and second largest ("col") axes of >= 128 long.
    params = dict(
        w=_param((4, 130, 256), (None, "col", "row")),
        m=_param((300, 140), ("row", "col")),
        b=_param((3, 256), (None, None)),
        s=_param((7,), None),
    )
    ref = optax.scale_by_factored_rms(factored=factored)
    exp = factorized_rms.scale_by_factored_rms(factored=factored)
    values = jax.tree.map(lambda p: p.value, params, is_leaf=lambda x: isinstance(x, OptParam))
    ref_state, exp_state = ref.init(values), exp.init(params)
    chex_close = lambda a, b: jax.tree.map(  # noqa: E731
        lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6), a, b
    )
    chex_close(ref_state, exp_state)
    update = jax.jit(lambda g, s: exp.update(g, s, params))  # OptParams are not pytrees.
    for step in range(6):
        grads = _grads(params, step)
        ref_out, ref_state = ref.update(grads, ref_state, values)
        exp_out, exp_state = update(grads, exp_state)
        chex_close(ref_out, exp_out)
        chex_close(ref_state, exp_state)
    assert int(exp_state.count) == 6


def _numpy_adafactor(grads, row, col, decay_fn, epsilon=1e-30):
    """Adafactor (arXiv:1804.04235, alg. 4) with R = row means, C = column means, in NumPy."""
    v_row = v_col = None
    outs = []
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, np.float64)
        sq = g**2 + epsilon
        beta = decay_fn(t)
        r, c = sq.mean(axis=row), sq.mean(axis=col)
        v_row = r * (1 - beta) if v_row is None else beta * v_row + (1 - beta) * r
        v_col = c * (1 - beta) if v_col is None else beta * v_col + (1 - beta) * c
        # V_hat = R C / mean(R): broadcast both back to the full shape.
        r_full = np.expand_dims(v_row, row)
        c_full = np.expand_dims(v_col, col)
        r_mean = np.expand_dims(v_row.mean(axis=col - 1 if col > row else col, keepdims=True), row)
        outs.append(g / np.sqrt(r_full * c_full / r_mean))
    return outs


@pytest.mark.parametrize(
    "shape,axes,row,col",
    [
        ((6, 4, 5), ("row", None, "col"), 0, 2),  # "row" on an axis that is not the largest.
        ((5, 9), ("col", "row"), 1, 0),
        ((3, 8, 2, 4), (None, "col", None, "row"), 3, 1),
    ],
)
def test_factored_axes_follow_the_spec(shape, axes, row, col):
    param = _param(shape, axes)
    decay = lambda t: 1.0 - 0.5 ** (t / 2)  # noqa: E731
    tx = factorized_rms.scale_by_factored_rms(
        decay_rate=lambda step: 1.0 - 0.5 ** (jnp.asarray(step, jnp.float32) / 2)
    )
    state = tx.init(dict(p=param))
    assert state.v_row["p"].shape == tuple(np.delete(shape, row))
    assert state.v_col["p"].shape == tuple(np.delete(shape, col))
    assert state.v["p"].shape == (1,)
    grads = [jax.random.normal(jax.random.PRNGKey(s), shape) for s in range(4)]
    expected = _numpy_adafactor(grads, row, col, decay)
    for g, want in zip(grads, expected):
        out, state = tx.update(dict(p=g), state, dict(p=param))
        np.testing.assert_allclose(out["p"], want, rtol=2e-5)


def test_unfactored_is_rmsprop_without_momentum():
    param = _param((3, 4), ("row", "col"))
    tx = factorized_rms.scale_by_factored_rms(
        factored=False, decay_rate=config_for_function(adafactor_decay_rate).set(c=0.5)
    )
    state = tx.init(dict(p=param))
    v = np.zeros((3, 4))
    for step in range(1, 4):
        g = np.asarray(jax.random.normal(jax.random.PRNGKey(step), (3, 4)), np.float64)
        beta = 1.0 - step**-0.5
        v = beta * v + (1 - beta) * (g**2 + 1e-30)
        out, state = tx.update(dict(p=jnp.asarray(g, jnp.float32)), state, dict(p=param))
        np.testing.assert_allclose(out["p"], g / np.sqrt(v), rtol=2e-5)
    assert state.v_row["p"].shape == (1,)


def test_partition_drops_the_factored_axis_and_its_mesh_axis():
    tx = factorized_rms.scale_by_factored_rms()
    specs = dict(
        w=ParameterSpec(
            shape=[8, 16, 32],
            dtype=jnp.bfloat16,
            mesh_axes=PartitionSpec("expert", "fsdp", "model"),
            factorization=FactorizationSpec(axes=(None, "col", "row")),
        ),
        r=ParameterSpec(  # Replicated (mesh_axes None).
            shape=[4, 6], dtype=jnp.float32, factorization=FactorizationSpec(axes=("row", "col"))
        ),
        b=ParameterSpec(shape=[32], dtype=jnp.float32, mesh_axes=PartitionSpec("model")),
    )
    part = tx.partition(specs)
    dummy = OptStateSpec(dtype=jnp.float32, shape=(1,), mesh_axes=PartitionSpec(None))
    assert part.count == OptStateSpec(dtype=jnp.int32, shape=[], mesh_axes=PartitionSpec())
    assert part.v_row["w"] == OptStateSpec(
        dtype=jnp.bfloat16, shape=[8, 16], mesh_axes=PartitionSpec("expert", "fsdp")
    )
    assert part.v_col["w"] == OptStateSpec(
        dtype=jnp.bfloat16, shape=[8, 32], mesh_axes=PartitionSpec("expert", "model")
    )
    assert part.v["w"] == dummy
    assert part.v_row["r"].shape == [6] and part.v_col["r"].shape == [4]
    assert part.v_row["r"].mesh_axes == PartitionSpec(None)
    assert part.v["b"] == OptStateSpec(
        dtype=jnp.float32, shape=[32], mesh_axes=PartitionSpec("model")
    )
    assert part.v_row["b"] == dummy
    # The specs match init's shapes.
    params = jax.tree.map(
        lambda s: OptParam(jnp.zeros(s.shape), s.factorization, 1.0),
        specs,
        is_leaf=lambda x: isinstance(x, ParameterSpec),
    )
    state = tx.init(params)
    for field in ("v_row", "v_col", "v"):
        for name in specs:
            assert tuple(getattr(state, field)[name].shape) == tuple(
                getattr(part, field)[name].shape
            )


def test_invalid_factorization_names_the_parameter():
    tx = factorized_rms.scale_by_factored_rms()
    with pytest.raises(ValueError, match=r"Parameter \['layer'\]\['w'\]: Invalid factorization"):
        tx.init(dict(layer=dict(w=_param((3, 4), ("row", None)))))
    spec = ParameterSpec(
        shape=[3, 4], dtype=jnp.float32, factorization=FactorizationSpec(axes=("row", "row"))
    )
    with pytest.raises(ValueError, match="Parameter w: Invalid factorization"):
        tx.partition(dict(w=spec))
    with pytest.raises(ValueError, match="needs params"):
        tx.update(dict(w=jnp.zeros(3)), tx.init(dict(w=_param((3,), None))), None)
