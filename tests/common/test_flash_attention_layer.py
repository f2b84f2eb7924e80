"""Tests of axlearn.common.flash_attention.layer: equal to the plain attention path (fp32)."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from axlearn.common.attention import GroupedQKVLinear, GroupedQueryAttention
from axlearn.common.flash_attention.layer import (
    KNOWN_BACKEND_OVERRIDES,
    FlashAttention,
    default_mha_dim_to_partition_spec,
    default_output_dim_to_partition_spec,
)
from axlearn.common.module import functional

DIM, HEADS, KV_HEADS, BATCH, LEN = 32, 4, 2, 4, 12


def _layer(cls, causal, **kwargs):
    cfg = cls.default_config().set(
        name="attn",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        num_heads=HEADS,
        causal=causal,
        input_linear=GroupedQKVLinear.default_config().set(num_kv_heads=KV_HEADS),
        **kwargs,
    )
    return cfg.instantiate(parent=None)


def _run(layer, params, inputs):
    out, _ = functional(layer, None, params, inputs, is_training=False)
    return out.data


@pytest.mark.parametrize("causal", [True, False])
def test_flash_layer_equals_plain_path(causal):
    plain = _layer(GroupedQueryAttention, causal)
    params = plain.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    inputs = dict(query=x)
    if not causal:
        inputs["attention_logit_biases"] = jax.random.normal(
            jax.random.PRNGKey(2), (BATCH, 1, LEN, LEN)
        )
    expected = _run(plain, params, inputs)

    flash = _layer(FlashAttention, causal)
    np.testing.assert_allclose(_run(flash, params, inputs), expected, atol=1e-5, rtol=1e-5)

    # With AXLearn's default shardings on a (data=2, model=2) mesh of CPU devices.
    axes = ("data", "model")
    sharded = _layer(
        FlashAttention,
        causal,
        mha_dim_to_partition_spec=default_mha_dim_to_partition_spec(axes),
        output_dim_to_partition_spec=default_output_dim_to_partition_spec(axes),
    )
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), axes)
    with jax.set_mesh(mesh):
        fn = jax.jit(lambda p, i: _run(sharded, p, i))
        out = fn(params, inputs)
        # The constraints are in the program (inputs and parameters carry no shardings).
        text = fn.lower(params, inputs).as_text()
        assert "sharding_constraint" in text or "Sharding" in text
    np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


def test_default_partition_specs():
    specs = default_mha_dim_to_partition_spec(("data", "fsdp", "model"))
    assert specs["btnh"] == PartitionSpec(("data", "fsdp"), None, "model", None)
    assert specs["bnts"] == PartitionSpec(("data", "fsdp"), "model", None, None)
    no_tp = default_output_dim_to_partition_spec(("data",))
    assert no_tp["btnh"] == PartitionSpec(("data",), None, None, None)


def test_backend_overrides_are_checked_and_keep_values():
    plain = _layer(FlashAttention, True)
    params = plain.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, LEN, DIM))
    expected = _run(plain, params, dict(query=x))
    # Every known key is accepted; none changes the values of our (XLA) core.
    overrides = {key: 256 for key in KNOWN_BACKEND_OVERRIDES}
    overrides["splash_use_fused_bwd_kernel"] = False
    # AXLearn's all-gather switch: no effect on one device (outside a mesh).
    overrides["all_gather_attention"] = True
    tuned = _layer(FlashAttention, True, backend_overrides=overrides)
    np.testing.assert_array_equal(_run(tuned, params, dict(query=x)), expected)
    assert len(KNOWN_BACKEND_OVERRIDES) == 10

    with pytest.raises(
        ValueError,
        match=r"^attn\.backend_overrides: unknown key 'splash_block_size'; known keys: "
        r"splash_use_fused_bwd_kernel, splash_block_q, .*splash_block_kv_dq, all_gather_attention$",
    ):
        _layer(FlashAttention, True, backend_overrides={"splash_block_size": 512})
    with pytest.raises(ValueError, match=r"\['splash_use_fused_bwd_kernel'\]=1 must be True"):
        _layer(FlashAttention, True, backend_overrides={"splash_use_fused_bwd_kernel": 1})
    with pytest.raises(ValueError, match=r"\['splash_block_q'\]=100 must be a positive multiple"):
        _layer(FlashAttention, True, backend_overrides={"splash_block_q": 100})
