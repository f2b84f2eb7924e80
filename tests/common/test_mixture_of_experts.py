"""Tests of axlearn.common.mixture_of_experts against a dense layer and a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.attention import TransformerFeedForwardLayer
from axlearn.common.layers import RMSNorm
from axlearn.common.mixture_of_experts import (
    AdaptiveLoadBalanceLoss,
    Top2Gating,
    TopKGating,
    TransformerFeedForwardMoE,
    _compute_expert_capacity,
)
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

DIM, HIDDEN = 8, 16


def _moe(num_experts, num_groups, *, top_k=2, capacity_factor=2.0, expert_capacity=None):
    cfg = TransformerFeedForwardMoE.default_config().set(
        name="moe",
        input_dim=DIM,
        hidden_dim=HIDDEN,
        num_experts=num_experts,
        num_groups=num_groups,
        activation=("nn.silu", "linear"),
        norm=RMSNorm.default_config(),
        gating=TopKGating.default_config(),
    )
    cfg.gating.set(
        num_experts_per_token=top_k,
        train_capacity_factor=capacity_factor,
        eval_capacity_factor=capacity_factor,
        expert_capacity=expert_capacity,
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    return layer, params


def _run(layer, params, x):
    @jax.jit
    def run(params, x):
        return functional(
            layer, None, params, dict(inputs=x), is_training=False, drop_output_collections=()
        )

    return run(params, x)


def test_one_expert_capacity_one_equals_dense_ffn():
    """One expert (gate 1), one slot per single-token group: the dense feed-forward."""
    batch, seq = 2, 5
    layer, params = _moe(num_experts=1, num_groups=batch * seq, top_k=1, expert_capacity=1)
    assert (
        _compute_expert_capacity(
            group_size=1, num_experts=1, expert_capacity=1, capacity_factor=2.0
        )
        == 2
    )
    dense_cfg = TransformerFeedForwardLayer.default_config().set(
        name="ff",
        input_dim=DIM,
        hidden_dim=HIDDEN,
        activation=("nn.silu", "linear"),
        norm=RMSNorm.default_config(),
    )
    dense_cfg.linear1.set(bias=False)
    dense_cfg.linear2.set(bias=False)
    dense = dense_cfg.instantiate(parent=None)
    dense_params = dict(
        norm=params["norm"],
        linear1_0=dict(weight=params["wi_0_weight"][0]),
        linear1_1=dict(weight=params["wi_1_weight"][0]),
        linear2=dict(weight=params["wo_weight"][0]),
    )
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, DIM))
    expected, _ = functional(dense, None, dense_params, dict(inputs=x), is_training=False)
    out, _ = _run(layer, params, x)
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


def _reference_moe(params, x_normed, *, num_experts, num_groups, top_k, capacity):
    """NumPy routing with explicit loops (GShard order: all first choices, then second).

    A token's gates are its top-k probabilities divided by their sum; a choice over capacity
    contributes nothing (the other choices keep their gates).
    """
    w = {k: np.asarray(v, np.float64) for k, v in params.items() if k.endswith("weight")}
    tokens = np.asarray(x_normed, np.float64).reshape(num_groups, -1, DIM)
    out = np.zeros_like(tokens)
    for g in range(tokens.shape[0]):
        logits = tokens[g] @ w["gate_weight"]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        order = np.argsort(-probs, axis=-1, kind="stable")
        used = np.zeros(num_experts, int)
        kept = {}  # (token) -> list of (expert, prob).
        for k in range(top_k):
            for s in range(tokens.shape[1]):
                e = order[s, k]
                if used[e] < capacity:
                    kept.setdefault(s, []).append((e, probs[s, e]))
                used[e] += 1
        for s, choices in kept.items():
            total = probs[s, order[s, :top_k]].sum()
            for e, p in choices:
                x = tokens[g, s]
                h0 = x @ w["wi_0_weight"][e]
                h = h0 / (1 + np.exp(-h0)) * (x @ w["wi_1_weight"][e])
                out[g, s] += (p / total) * (h @ w["wo_weight"][e])
    return out


@pytest.mark.parametrize("top_k,capacity_factor", [(2, 1.0), (1, 0.5), (2, 4.0), (3, 2.0)])
def test_top_k_routing_matches_numpy(top_k, capacity_factor):
    num_experts, batch, seq, num_groups = 4, 2, 8, 4
    layer, params = _moe(num_experts, num_groups, top_k=top_k, capacity_factor=capacity_factor)
    # A random router so that choices are distinct and some experts overflow.
    params = dict(params)
    params["gate_weight"] = jax.random.normal(jax.random.PRNGKey(5), (DIM, num_experts)) * 2
    x = jax.random.normal(jax.random.PRNGKey(1), (batch, seq, DIM))
    out, collection = _run(layer, params, x)
    group_size = batch * seq // num_groups
    capacity = max(1, int(group_size * capacity_factor / num_experts))
    norm = RMSNorm.default_config().set(name="n", input_dim=DIM).instantiate(parent=None)
    x_normed, _ = functional(norm, None, params["norm"], dict(x=x), is_training=False)
    expected = _reference_moe(
        params,
        x_normed,
        num_experts=num_experts,
        num_groups=num_groups,
        top_k=top_k,
        capacity=capacity,
    )
    np.testing.assert_allclose(out, np.asarray(x) + expected.reshape(x.shape), atol=1e-5, rtol=1e-5)
    aux = collection.module_outputs["aux_loss"]
    # Default weights: 0.01 x the load-balance loss (+ 0 x the router z-loss).
    assert aux.shape == () and float(aux) > 0
    np.testing.assert_allclose(
        aux, 0.01 * collection.summaries["gating"]["load_balance_loss"], rtol=1e-6
    )


def test_load_balance_and_z_loss():
    """Top2Gating: E * sum_e f_e P_e with f_e over first choices; z-loss by hand."""
    gating = Top2Gating.default_config().set(name="g", num_experts=4).instantiate(parent=None)
    logits = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 10, 4)) * 3
    route = jax.jit(
        lambda logits: functional(gating, None, {}, dict(logits=logits), is_training=True)[0]
    )
    out = route(logits)
    probs = np.asarray(jax.nn.softmax(logits, -1), np.float64)
    first = np.eye(4)[probs.argmax(-1)]
    expected = np.mean(np.sum(first.mean(-2) * probs.mean(-2), -1)) * 4
    np.testing.assert_allclose(out.load_balance_loss, expected, rtol=1e-5)
    lse = np.log(np.exp(np.asarray(logits, np.float64)).sum(-1))
    np.testing.assert_allclose(out.router_z_loss, np.mean(lse**2), rtol=1e-5)
    # Uniform routing (equal first-choice counts and probabilities) gives exactly 1.
    uniform = jnp.tile(jnp.eye(4)[None, None] * 5.0, (1, 1, 2, 1))  # 8 tokens, 2 per expert.
    balanced = route(uniform)
    probs_u = np.asarray(jax.nn.softmax(uniform, -1))
    np.testing.assert_allclose(
        balanced.load_balance_loss, 4 * np.sum(0.25 * probs_u.mean(-2)), rtol=1e-5
    )
    # A token's gates are its top-2 probabilities over their sum: 1 when both are kept, less
    # when a choice is over capacity.
    combine = np.asarray(out.combine_tensor)
    sums = combine.sum((-1, -2))
    assert np.all(sums <= 1 + 1e-5)
    assert (np.abs(sums - 1) < 1e-5).sum() >= sums.size // 2
    assert np.asarray(out.dispatch_tensor).sum(axis=2).max() <= 1


def test_bad_groups_and_parameter_shapes():
    layer, params = _moe(num_experts=3, num_groups=3)
    assert params["wi_0_weight"].shape == (3, DIM, HIDDEN)
    assert params["wo_weight"].shape == (3, HIDDEN, DIM)
    assert params["gate_weight"].shape == (DIM, 3)
    with pytest.raises(ValueError, match="outer_batch \\* num_groups = 1 \\* 3 must divide"):
        _run(layer, params, jnp.zeros((2, 5, DIM)))


def test_moe_aux_loss_enters_the_model_loss():
    """A decoder with MoE feed-forwards: loss = cross-entropy + the layers' aux losses."""
    cfg = transformer_lm_config(
        num_layers=2, model_dim=DIM, num_heads=2, hidden_dim=HIDDEN, vocab_size=32, stack="stack"
    )
    moe = TransformerFeedForwardMoE.default_config().set(
        hidden_dim=HIDDEN,
        num_experts=4,
        num_groups=2,
        activation=("nn.silu", "linear"),
        norm=RMSNorm.default_config(),
    )
    cfg.decoder.transformer.layer.feed_forward = moe
    cfg.set(name="model", aux_loss_regex=".*/feed_forward/aux_loss")
    model = cfg.instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert params["decoder"]["transformer"]["layer0"]["feed_forward"]["wo_weight"].shape == (
        4,
        HIDDEN,
        DIM,
    )
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 2, 32)
    batch = dict(input_ids=ids, target_labels=jnp.roll(ids, -1, axis=1))

    @jax.jit
    def run(params):
        return functional(
            model,
            jax.random.PRNGKey(2),
            params,
            dict(input_batch=batch),
            is_training=True,
            drop_output_collections=(),
        )

    (loss, _), collection = run(params)
    outputs = collection.module_outputs["decoder"]["transformer"]
    aux = sum(float(outputs[f"layer{i}"]["feed_forward"]["aux_loss"]) for i in range(2))
    summaries = collection.summaries
    assert aux > 0
    np.testing.assert_allclose(float(summaries["aux_loss"].mean), aux, rtol=1e-6)
    np.testing.assert_allclose(
        float(loss), float(summaries["cross_entropy_loss"].mean) + aux, rtol=1e-6
    )


def test_num_experts_not_divisible_by_the_expert_axis_is_a_one_line_error():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("expert", "model"))
    with jax.set_mesh(mesh):
        with pytest.raises(ValueError) as e:
            _moe(num_experts=6, num_groups=1)
        message = str(e.value)
        assert "\n" not in message
        assert message.startswith("moe.num_experts=6 is not divisible by the 4-way expert")
        assert "use a multiple of 4 experts" in message
        layer, params = _moe(num_experts=8, num_groups=1)  # 8 experts over 4: fine.
        assert params["wo_weight"].shape == (8, HIDDEN, DIM)
    _moe(num_experts=6, num_groups=1)  # Outside a mesh nothing is sharded: fine.


def test_top_k_load_balance_counts_every_choice():
    """TopKGating: f_e counts all k choices (divided by k); capacity factor None means k."""
    cfg = TopKGating.default_config().set(name="g", num_experts=4, num_experts_per_token=2)
    gating = cfg.instantiate(parent=None)
    logits = jax.random.normal(jax.random.PRNGKey(3), (1, 2, 6, 4))
    out, coll = functional(
        gating, None, {}, dict(logits=logits), is_training=True, drop_output_collections=()
    )
    probs = np.asarray(jax.nn.softmax(logits, -1), np.float64)
    top2 = np.argsort(-probs, -1)[..., :2]
    counts = np.eye(4)[top2].sum(-2)  # [O, G, S, E].
    expected = np.mean(np.sum(counts.mean(-2) / 2 * probs.mean(-2), -1)) * 4
    np.testing.assert_allclose(out.load_balance_loss, expected, rtol=1e-5)
    # Capacity factor k=2: int(6 * 2 / 4) = 3 slots.
    assert out.combine_tensor.shape == (1, 2, 6, 4, 3)
    np.testing.assert_array_equal(coll.module_outputs["gate_assignment"], top2)


def test_adaptive_load_balance_loss_by_hand():
    """The scale moves by the rate only while the moving average leaves [min, max]."""
    cfg = AdaptiveLoadBalanceLoss.default_config().set(
        name="a", min_value=0.4, max_value=0.6, adjustment_rate=0.1
    )
    cfg.moving_average.min_weight = 0.5
    layer = cfg.instantiate(parent=None)
    state = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    average, scale = 0.0, 1.0
    for step, value in enumerate([0.1, 0.1, 0.9, 0.9, 0.9, 0.5]):
        out, coll = functional(layer, None, state, dict(value=value), is_training=True)
        weight = max(1 / (step + 1), 0.5)
        average += weight * (value - average)
        if average < 0.4:
            scale *= 0.9
        elif average > 0.6:
            scale *= 1.1
        np.testing.assert_allclose(out, scale, rtol=1e-6)
        np.testing.assert_allclose(coll.summaries["value_average"], average, rtol=1e-6)
        state = coll.state_updates


@pytest.mark.parametrize("structure", ["hybridnorm", "nonorm", "v2"])
def test_structures_compose_norms_around_the_experts(structure):
    from axlearn.common.attention import NormPosition  # pylint: disable=import-outside-toplevel

    norm = RMSNorm.default_config()
    if structure == "v2":
        norm = {NormPosition.IN_NORM: norm, NormPosition.OUT_NORM: RMSNorm.default_config()}
    cfg = TransformerFeedForwardMoE.default_config().set(
        name="moe",
        input_dim=DIM,
        hidden_dim=HIDDEN,
        num_experts=4,
        num_groups=1,
        structure=structure,
        norm=norm,
        residual_weight=0.5,
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, DIM))

    def call(method, **inputs):
        return functional(layer, None, params, inputs, is_training=False, method=method)[0]

    def rms(x):
        return x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-6)

    out = call("forward", inputs=x)
    if structure == "hybridnorm":
        expected = x + 0.5 * rms(call("_dispatch_and_combine", x=rms(x)))
    elif structure == "nonorm":
        expected = 0.5 * call("_dispatch_and_combine", x=x)
    else:
        expected = rms(x + 0.5 * call("_dispatch_and_combine", x=rms(x)))
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
