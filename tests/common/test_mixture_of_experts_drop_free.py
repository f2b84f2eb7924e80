"""Tests of the drop-free MoE layers, grouped matmul and dense-to-MoE conversion (NumPy refs)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from axlearn.common.attention import (
    RepeatedTransformerLayer,
    StackedTransformerLayer,
    TransformerLayer,
)
from axlearn.common.layers import RMSNorm, set_bias_recursively
from axlearn.common.megablock.ops import gmm, select_tiling_fn
from axlearn.common.mixture_of_experts import (
    GMMBackend,
    TopKBiasGating,
    TopKDropFreeGating,
    TopKGating,
    TransformerFeedForwardDropFreeMoE,
    TransformerFeedForwardMoE,
    _all_to_all_combine,
    _all_to_all_dispatch,
    _custom_gather,
    convert_dense_to_moe_parameters,
    get_outer_batch_from_mesh,
)
from axlearn.common.module import functional
from axlearn.common.utils import HybridMeshShape

DIM, HIDDEN, EXPERTS = 8, 16, 4


def test_gmm_matches_numpy_per_group_matmul():
    lhs = np.random.RandomState(0).randn(10, 6).astype(np.float32)
    rhs = np.random.RandomState(1).randn(3, 6, 5).astype(np.float32)
    sizes = np.array([4, 0, 5])  # 9 rows used; row 9 is padding.
    expected = np.zeros((10, 5), np.float32)
    start = 0
    for g, n in enumerate(sizes):
        expected[start : start + n] = lhs[start : start + n] @ rhs[g]
        start += n
    tiling = select_tiling_fn(tiling_larger_k=(4, 8, 8), tiling_larger_n=(8, 8, 8))
    for t in [(128, 128, 128), (4, 4, 4), tiling]:
        out = gmm(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes), tiling=t)
        np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
    assert select_tiling_fn(tiling_larger_k=(1, 2, 3), tiling_larger_n=(4, 5, 6))(8, 16, 4) == (
        1,
        2,
        3,
    )
    with pytest.raises(ValueError, match="3 positive ints"):
        gmm(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(sizes), tiling=(0, 1, 1))


def _drop_free(backend=None, **kwargs):
    cfg = TransformerFeedForwardDropFreeMoE.default_config().set(
        name="moe",
        input_dim=DIM,
        hidden_dim=HIDDEN,
        num_experts=EXPERTS,
        num_groups=1,
        activation=("nn.silu", "linear"),
        norm=RMSNorm.default_config(),
        gmm_backend=backend,
        gating=TopKDropFreeGating.default_config().set(num_experts_per_token=2),
        **kwargs,
    )
    layer = cfg.instantiate(parent=None)
    params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    params["gate_weight"] = jax.random.normal(jax.random.PRNGKey(5), (DIM, EXPERTS)) * 2
    return layer, params


def _numpy_drop_free(params, x, top_k=2):
    """Every token reaches its top-k experts; gates = top-k probabilities over their sum."""
    w = {k: np.asarray(v, np.float64) for k, v in params.items() if k.endswith("weight")}
    x = np.asarray(x, np.float64)
    normed = (
        x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 1e-8) * np.asarray(params["norm"]["scale"])
    )
    tokens = normed.reshape(-1, DIM)
    out = np.zeros_like(tokens)
    logits = tokens @ w["gate_weight"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    for t in range(tokens.shape[0]):
        chosen = np.argsort(-probs[t])[:top_k]
        for e in chosen:
            h0 = tokens[t] @ w["wi_0_weight"][e]
            h = h0 / (1 + np.exp(-h0)) * (tokens[t] @ w["wi_1_weight"][e])
            out[t] += probs[t, e] / probs[t, chosen].sum() * (h @ w["wo_weight"][e])
    return x + out.reshape(x.shape)


@pytest.mark.parametrize("backend", [None, GMMBackend.RAGGED_DOT])
def test_drop_free_matches_numpy(backend):
    layer, params = _drop_free(backend, seq_load_balance_loss_weight=0.1)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, DIM))
    out, coll = functional(
        layer, None, params, dict(inputs=x), is_training=True, drop_output_collections=()
    )
    np.testing.assert_allclose(out, _numpy_drop_free(params, x), atol=1e-4, rtol=1e-4)
    gating = coll.summaries["gating"]
    expected_aux = 0.01 * gating["load_balance_loss"] + 0.1 * gating["seq_load_balance_loss"]
    np.testing.assert_allclose(coll.module_outputs["aux_loss"], expected_aux, rtol=1e-6)


def test_drop_free_equals_capacity_moe_without_drops_values_and_grads():
    layer, params = _drop_free()
    ref_cfg = TransformerFeedForwardMoE.default_config().set(
        name="moe",
        input_dim=DIM,
        hidden_dim=HIDDEN,
        num_experts=EXPERTS,
        num_groups=1,
        activation=("nn.silu", "linear"),
        norm=RMSNorm.default_config(),
        gating=TopKGating.default_config().set(
            num_experts_per_token=2, train_capacity_factor=EXPERTS
        ),
    )
    ref = ref_cfg.instantiate(parent=None)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 6, DIM))

    def loss(module, params):
        out, _ = functional(module, None, params, dict(inputs=x), is_training=True)
        return jnp.sum(out**2)

    value, grads = jax.jit(jax.value_and_grad(partial(loss, layer)))(params)
    ref_value, ref_grads = jax.jit(jax.value_and_grad(partial(loss, ref)))(params)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for name in ("gate_weight", "wi_0_weight", "wi_1_weight", "wo_weight"):
        np.testing.assert_allclose(grads[name], ref_grads[name], atol=1e-4, rtol=1e-4)


def test_bias_gating_steers_choices_and_updates_bias_by_sign():
    cfg = TopKBiasGating.default_config().set(
        name="g", num_experts=4, num_experts_per_token=1, bias_update_rate=0.5
    )
    layer = cfg.instantiate(parent=None)
    # Token scores favour expert 0; a bias of +1 on expert 3 flips the choice to 3.
    logits = jnp.log(jnp.array([[[0.4, 0.3, 0.2, 0.1]] * 3]))
    state = dict(gate_bias=jnp.array([0.0, 0.0, 0.0, 1.0]))
    out, coll = functional(layer, None, state, dict(logits=logits), is_training=True)
    np.testing.assert_array_equal(out.gate_assignment[..., 0], [[3, 3, 3]])
    np.testing.assert_allclose(out.expert_weights, 1.0)  # k=1: the gate is normalized.
    # Counts [0, 0, 0, 3], mean 0.75: experts 0-2 get +0.5, expert 3 gets -0.5.
    np.testing.assert_allclose(coll.state_updates["gate_bias"], [0.5, 0.5, 0.5, 0.5])


@pytest.mark.parametrize("repetitions", [1, 3])
def test_custom_gather_gradient_equals_plain_gather(repetitions):
    a = jax.random.normal(jax.random.PRNGKey(0), (7, 2))
    idx = jnp.argsort(jax.random.randint(jax.random.PRNGKey(1), (7 * repetitions,), 0, 99))
    idx = idx // repetitions

    def f(a, custom):
        b = _custom_gather(a, idx, jnp.argsort(idx)) if custom else a[idx]
        return jnp.sum(b * jnp.arange(b.size).reshape(b.shape))

    np.testing.assert_allclose(f(a, True), f(a, False))
    np.testing.assert_allclose(jax.grad(f)(a, True), jax.grad(f)(a, False), rtol=1e-6)


def test_all_to_all_dispatch_and_combine_match_numpy():
    ranks, experts, rows = 4, 8, 6
    rng = np.random.RandomState(0)
    counts = np.stack(
        [np.bincount(rng.randint(0, experts, rows), minlength=experts) for _ in range(ranks)]
    )
    values = np.stack([np.repeat(np.arange(experts), counts[r]) + 100 * r for r in range(ranks)])
    mesh = jax.make_mesh((ranks,), ("expert",), devices=jax.devices()[:ranks])

    @jax.jit
    @partial(
        jax.shard_map,
        mesh=mesh,
        in_specs=(P("expert"), P("expert")),
        out_specs=(P("expert"), P("expert"), P("expert"), P("expert")),
        check_vma=False,
    )
    def run(counts, values):
        local, local_counts, (dropped,), residuals = _all_to_all_dispatch(
            values[0].astype(jnp.float32), counts[0], expert_parallel_capacity=1.0
        )
        back = _all_to_all_combine(local, residuals)
        return local[None], local_counts[None], dropped[None], back[None]

    sharding = jax.sharding.NamedSharding(mesh, P("expert"))
    local, local_counts, dropped, back = run(
        jax.device_put(jnp.asarray(counts), sharding), jax.device_put(jnp.asarray(values), sharding)
    )
    local, local_counts, dropped, back = map(np.asarray, (local, local_counts, dropped, back))
    capacity, per_rank = rows, experts // ranks
    for r in range(ranks):
        mine = range(r * per_rank, (r + 1) * per_rank)
        received = [v for s in range(ranks) for v in values[s] if v % 100 in mine]
        kept = received[:capacity]
        expected = sorted(kept, key=lambda v: v % 100)  # Stable: by expert, then source.
        np.testing.assert_array_equal(local[r][: len(expected)], expected)
        np.testing.assert_array_equal(local[r][len(expected) :], 0)
        np.testing.assert_array_equal(
            local_counts[r], [sum(v % 100 == e for v in kept) for e in mine]
        )
        assert dropped[r] == len(received) - len(kept)
    # Each row comes back to its sender in place, 0 where its receiver dropped it.
    for s in range(ranks):
        for i, v in enumerate(values[s]):
            r = (v % 100) // per_rank
            received = [u for q in range(ranks) for u in values[q] if (u % 100) // per_rank == r]
            position = sum((values[q] % 100 // per_rank == r).sum() for q in range(s)) + sum(
                values[s][:i] % 100 // per_rank == r
            )
            assert back[s][i] == (v if position < capacity else 0), (s, i, received)


def test_dense_to_moe_upcycling_keeps_the_outputs():
    """A repeated dense stack upcycled into (dense, MoE) pairs computes the same function."""
    dense_cfg = RepeatedTransformerLayer.default_config().set(
        name="t", input_dim=DIM, num_layers=4, layer=TransformerLayer.default_config()
    )
    dense_cfg.layer.self_attention.attention.set(num_heads=2)
    dense_cfg.layer.feed_forward.set(hidden_dim=HIDDEN, activation=("nn.silu", "linear"))
    set_bias_recursively(dense_cfg, bias=False)
    dense = dense_cfg.instantiate(parent=None)
    dense_params = dense.initialize_parameters_recursively(jax.random.PRNGKey(0))
    moe_ff = TransformerFeedForwardMoE.default_config().set(
        hidden_dim=HIDDEN, num_experts=3, num_groups=1, activation=("nn.silu", "linear")
    )
    moe_ff.gating.set(train_capacity_factor=100.0, eval_capacity_factor=100.0)
    moe_cfg = RepeatedTransformerLayer.default_config().set(
        name="t",
        input_dim=DIM,
        num_layers=2,
        layer=StackedTransformerLayer.default_config().set(
            num_layers=2,
            layer=[dense_cfg.layer.clone(), dense_cfg.layer.clone(feed_forward=moe_ff)],
        ),
    )
    set_bias_recursively(moe_cfg, bias=False)
    moe = moe_cfg.instantiate(parent=None)
    specs = moe.create_parameter_specs_recursively()
    converted = convert_dense_to_moe_parameters(dense_params, target_parameter_specs=specs)
    ff = converted["repeat"]["layer"]["layer1"]["feed_forward"]
    assert ff["gate_weight"] is specs["repeat"]["layer"]["layer1"]["feed_forward"]["gate_weight"]
    ff["gate_weight"] = jax.random.normal(jax.random.PRNGKey(1), ff["gate_weight"].shape)
    # Layer 3 of the dense stack is repeat 1, sub-layer 1; its linear2 is in every expert.
    dense_ff = dense_params["repeat"]["layer"]["feed_forward"]
    np.testing.assert_array_equal(ff["wo_weight"][1, 2], dense_ff["linear2"]["weight"][3])
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, DIM))
    out_dense, _ = functional(dense, None, dense_params, (x,), is_training=False)
    out_moe, _ = functional(moe, None, converted, (x,), is_training=False)
    np.testing.assert_allclose(out_moe.data, out_dense.data, atol=1e-5, rtol=1e-5)


def test_outer_batch_from_mesh():
    names = ("data", "fsdp", "model")
    assert (
        get_outer_batch_from_mesh(
            mesh_axis_names=names, outer_batch_axis_names=("data",), mesh_shape=None
        )
        is None
    )
    assert (
        get_outer_batch_from_mesh(
            mesh_axis_names=names, outer_batch_axis_names=("data", "fsdp"), mesh_shape=(3, 5, 2)
        )
        == 15
    )
    hybrid = HybridMeshShape(ici_mesh_shape=(1, 4, 2), dcn_mesh_shape=(2, 1, 1))
    assert (
        get_outer_batch_from_mesh(
            mesh_axis_names=names, outer_batch_axis_names=("data", "fsdp"), mesh_shape=hybrid
        )
        == 8
    )
    hybrid = HybridMeshShape(ici_mesh_shape=(1, 4, 2), dcn_mesh_shape=(-1, 1, 1))
    with pytest.raises(NotImplementedError, match="Unable to infer number of granules"):
        get_outer_batch_from_mesh(
            mesh_axis_names=names, outer_batch_axis_names=("data",), mesh_shape=hybrid
        )


def test_drop_free_needs_a_drop_free_router():
    cfg = TransformerFeedForwardDropFreeMoE.default_config().set(
        name="moe", input_dim=DIM, hidden_dim=HIDDEN, num_experts=EXPERTS, num_groups=1
    )
    with pytest.raises(ValueError, match="moe.gating is a Top2Gating: set a TopKDropFreeGating"):
        cfg.instantiate(parent=None)


def test_expert_parallel_equals_drop_free_values_and_grads():
    """4-way expert parallelism (all-to-all in shard_map) = the single-device drop-free layer."""
    from axlearn.common.mixture_of_experts import (  # pylint: disable=import-outside-toplevel
        ApproximateTokenDropFreeMoE,
    )

    kwargs = dict(
        name="moe",
        input_dim=DIM,
        hidden_dim=HIDDEN,
        num_experts=8,
        num_groups=1,
        activation=("nn.silu", "linear"),
        norm=RMSNorm.default_config(),
        gating=TopKDropFreeGating.default_config().set(num_experts_per_token=2),
    )
    ref = TransformerFeedForwardDropFreeMoE.default_config().set(**kwargs).instantiate(parent=None)
    params = ref.initialize_parameters_recursively(jax.random.PRNGKey(0))
    params["gate_weight"] = jax.random.normal(jax.random.PRNGKey(5), (DIM, 8)) * 2
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 6, DIM))

    def loss(module, params):
        out, coll = functional(module, None, params, dict(inputs=x), is_training=True)
        return jnp.sum(out**2), coll

    (value, _), grads = jax.jit(jax.value_and_grad(partial(loss, ref), has_aux=True))(params)
    mesh = jax.sharding.Mesh(
        np.array(jax.devices()[:8]).reshape(1, 1, 4, 2, 1, 1),
        ("pipeline", "data", "expert", "fsdp", "seq", "model"),
    )
    with jax.set_mesh(mesh):
        # Capacity 4 x the own pair count: nothing is dropped on 4 ranks.
        layer = (
            ApproximateTokenDropFreeMoE.default_config()
            .set(expert_parallel_capacity=4.0, **kwargs)
            .instantiate(parent=None)
        )
        (ep_value, coll), ep_grads = jax.jit(
            jax.value_and_grad(partial(loss, layer), has_aux=True)
        )(params)
    assert int(coll.summaries["dropped_tokens"]) == 0
    np.testing.assert_allclose(ep_value, value, rtol=1e-5)
    for name in ("gate_weight", "wi_0_weight", "wi_1_weight", "wo_weight"):
        np.testing.assert_allclose(ep_grads[name], grads[name], atol=1e-4, rtol=1e-4)
