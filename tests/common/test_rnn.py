"""Tests of axlearn.common.rnn against an LSTM written in NumPy."""

import jax
import numpy as np
import pytest
from jax import numpy as jnp

from axlearn.common.layers import LayerNorm
from axlearn.common.module import functional
from axlearn.common.rnn import IdentityCell, LSTMCell, RepeatedRNNLayer, StackedRNNLayer
from axlearn.common.utils import VDict


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_lstm(params, x, *, hidden_dim, output_dim, max_cell_value=None, norm_eps=None):
    """A NumPy LSTM over time-major x [T, B, D]: gates (i, f, g, o) from [x_t, m]."""
    seq_len, batch = x.shape[:2]
    m = np.zeros((batch, output_dim))
    c = np.zeros((batch, hidden_dim))
    w = np.asarray(params["input_proj"]["weight"], np.float64)
    outs = []
    for t in range(seq_len):
        gates = np.einsum("bd,dnh->bnh", np.concatenate([x[t], m], -1), w)
        if norm_eps is not None:
            mean = gates.mean(-1, keepdims=True)
            var = ((gates - mean) ** 2).mean(-1, keepdims=True)
            gates = (gates - mean) / np.sqrt(var + norm_eps)
            gates = gates * np.asarray(params["norm"]["scale"]) + np.asarray(params["norm"]["bias"])
        i, f, g, o = gates[:, 0], gates[:, 1], gates[:, 2], gates[:, 3]
        c = _sigmoid(f) * c + _sigmoid(g) * np.tanh(i)
        if max_cell_value is not None:
            c = np.clip(c, -max_cell_value, max_cell_value)
        m = _sigmoid(o) * np.tanh(c)
        if "output_proj" in params:
            m = m @ np.asarray(params["output_proj"]["weight"], np.float64)
        outs.append(m)
    return np.stack(outs), dict(m=m, c=c)


def _randomize(params, seed):
    """Replaces each parameter by N(0, 0.5) values (norm scales near 1), so gates saturate less."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda p: (
            jnp.asarray(rng.normal(0.0, 0.5, p.shape), p.dtype) + (1.0 if p.ndim == 1 else 0.0)
        ),
        params,
    )


@pytest.mark.parametrize(
    "hidden_dim,norm,max_cell_value",
    [(None, False, None), (6, True, None), (6, False, 0.3)],
)
def test_lstm_cell_matches_numpy_and_streams(hidden_dim, norm, max_cell_value):
    seq_len, batch, input_dim, output_dim = 7, 3, 4, 5
    cfg = LSTMCell.default_config().set(
        name="lstm",
        input_dim=input_dim,
        output_dim=output_dim,
        hidden_dim=hidden_dim,
        max_cell_value=max_cell_value,
        norm=LayerNorm.default_config() if norm else None,
    )
    layer = cfg.instantiate(parent=None)
    params = _randomize(layer.initialize_parameters_recursively(jax.random.PRNGKey(0)), 1)
    assert ("output_proj" in params) == (hidden_dim is not None)
    assert params["input_proj"]["weight"].shape == (input_dim + output_dim, 4, layer.hidden_dim)
    x = np.random.default_rng(2).standard_normal((seq_len, batch, input_dim)).astype(np.float32)
    out, col = functional(
        layer, jax.random.PRNGKey(1), params, [x], is_training=False, drop_output_collections=()
    )
    ref, ref_states = _np_lstm(
        params,
        x.astype(np.float64),
        hidden_dim=layer.hidden_dim,
        output_dim=output_dim,
        max_cell_value=max_cell_value,
        norm_eps=layer.norm.config.eps if norm else None,
    )
    assert out.shape == (seq_len, batch, output_dim)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    for k in ("m", "c"):
        np.testing.assert_allclose(col.module_outputs["final_states"][k], ref_states[k], atol=2e-5)
    if max_cell_value is not None:
        assert np.abs(np.asarray(col.module_outputs["final_states"]["c"])).max() <= max_cell_value

    # Streaming: one extend_step at a time gives the full-sequence outputs.
    states, _ = functional(
        layer, None, params, dict(batch_size=batch), is_training=False, method="init_states"
    )
    steps = []
    for t in range(seq_len):
        (states, y), _ = functional(
            layer,
            None,
            params,
            dict(cached_states=states, data=x[t]),
            is_training=False,
            method="extend_step",
        )
        steps.append(y)
    np.testing.assert_allclose(np.stack(steps), out, atol=1e-6)


@pytest.mark.slow
def test_stacked_and_repeated_match_numpy():
    seq_len, batch, dim = 6, 2, 4
    cells = [LSTMCell.default_config().set(hidden_dim=3) for _ in range(3)]
    stack = (
        StackedRNNLayer.default_config()
        .set(name="stack", input_dim=dim, layers=cells)
        .instantiate(parent=None)
    )
    repeat = (
        RepeatedRNNLayer.default_config()
        .set(
            name="rep",
            input_dim=dim,
            num_layers=3,
            layer=LSTMCell.default_config().set(hidden_dim=3),
        )
        .instantiate(parent=None)
    )
    key = jax.random.PRNGKey(3)
    stack_params = stack.initialize_parameters_recursively(key)
    repeat_params = repeat.initialize_parameters_recursively(key)
    # From one key, the repeated layer's parameters are the stacked layer's, stacked.
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *stack_params.values())
    jax.tree.map(np.testing.assert_array_equal, dict(repeat_params["repeat"]["layer"]), stacked)

    stack_params = _randomize(stack_params, 4)
    repeat_params = dict(
        repeat=VDict(layer=jax.tree.map(lambda *xs: jnp.stack(xs), *stack_params.values()))
    )
    x = np.random.default_rng(5).standard_normal((seq_len, batch, dim)).astype(np.float32)
    ref = x.astype(np.float64)
    for i in range(3):
        ref, _ = _np_lstm(stack_params[f"layer{i}"], ref, hidden_dim=3, output_dim=dim)
    out_stack, _ = functional(stack, None, stack_params, [x], is_training=False)
    out_repeat, col = functional(
        repeat, None, repeat_params, [x], is_training=False, drop_output_collections=()
    )
    np.testing.assert_allclose(out_stack, ref, atol=2e-5)
    np.testing.assert_allclose(out_repeat, ref, atol=2e-5)
    assert col.module_outputs["final_states"]["c"].shape == (3, batch, 3)

    # Streaming the repeated layer gives its full-sequence outputs.
    states, _ = functional(
        repeat, None, repeat_params, dict(batch_size=batch), is_training=False, method="init_states"
    )
    for t in range(seq_len):
        (states, y), _ = functional(
            repeat,
            None,
            repeat_params,
            dict(cached_states=states, data=x[t]),
            is_training=False,
            method="extend_step",
        )
        np.testing.assert_allclose(y, out_repeat[t], atol=1e-6)


def test_identity_cell_and_errors():
    cell = IdentityCell.default_config().set(name="id", input_dim=3).instantiate(parent=None)
    x = np.ones((2, 4, 3), np.float32)
    out, _ = functional(cell, None, {}, [x], is_training=False)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ValueError, match="time_major_inputs must be"):
        functional(cell, None, {}, [x[0]], is_training=False)
    with pytest.raises(ValueError, match="output_dim=3 differs"):
        StackedRNNLayer.default_config().set(
            name="s",
            input_dim=2,
            output_dim=3,
            layers=[LSTMCell.default_config().set(output_dim=2)],
        ).instantiate(parent=None)
    with pytest.raises(ValueError, match="layers must hold"):
        StackedRNNLayer.default_config().set(name="s", input_dim=2, layers=[]).instantiate(
            parent=None
        )
    with pytest.raises(ValueError, match="num_layers=0 must be > 0"):
        RepeatedRNNLayer.default_config().set(name="r", input_dim=2, num_layers=0).instantiate(
            parent=None
        )
    with pytest.raises(ValueError, match="IdentityCell needs"):
        IdentityCell.default_config().set(name="i", input_dim=2, output_dim=3).instantiate(
            parent=None
        )
