"""Tests axlearn/common/flops.py against hand computations."""

import jax
import numpy as np
import pytest

from axlearn.common import flops


def _p1_params(*, repeat: bool, tied: bool = True) -> dict:
    """P1's parameter shapes (docs/performance.md): 2 layers, d=256, 4x64 heads, V=32768."""
    d, h, dh, f, v, layers = 256, 4, 64, 1024, 32768, 2

    def layer(prefix=()):
        s = lambda *shape: jax.ShapeDtypeStruct(prefix + shape, np.float32)
        return dict(
            self_attention=dict(
                norm=dict(scale=s(d)),
                attention=dict(
                    i_proj=dict(i_proj=dict(qkv_proj=dict(weight=s(d, 3 * h, dh)))),
                    o_proj=dict(weight=s(d, h, dh)),
                    scale_query=dict(norm=dict(scale=s(dh))),
                    scale_key=dict(norm=dict(scale=s(dh))),
                ),
            ),
            feed_forward=dict(
                norm=dict(scale=s(d)),
                linear1_0=dict(weight=s(d, f)),
                linear1_1=dict(weight=s(d, f)),
                linear2=dict(weight=s(f, d), bias=s(d)),
            ),
        )

    if repeat:  # Stacked: every leaf gets a leading [layers] dim, norm scales become 2-D.
        transformer = dict(repeat=dict(layer=layer((layers,))))
    else:
        transformer = {f"layer{i}": layer() for i in range(layers)}
    decoder = dict(
        emb=dict(token_emb=dict(weight=jax.ShapeDtypeStruct((v, d), np.float32))),
        transformer=transformer,
        output_norm=dict(scale=jax.ShapeDtypeStruct((d,), np.float32)),
    )
    if not tied:
        decoder["lm_head"] = dict(weight=jax.ShapeDtypeStruct((v, d), np.float32))
    return dict(decoder=decoder)


# By hand: per layer qkv 256*768 + o 256*256 + ffn 3*256*1024 = 1,048,576; x2 layers; + 32768*256.
P1_MATMUL_PARAMS = 2 * (256 * 768 + 256 * 256 + 3 * 256 * 1024) + 32768 * 256


@pytest.mark.parametrize("repeat", [True, False])
def test_matmul_param_count_p1(repeat):
    params = _p1_params(repeat=repeat)
    assert P1_MATMUL_PARAMS == 10_485_760
    assert flops.matmul_param_count(params) == P1_MATMUL_PARAMS
    # Norm scales (incl. the stacked [2, 256] ones) and biases are not matmul parameters.
    total = flops.total_param_count(params)
    assert total == P1_MATMUL_PARAMS + 2 * (256 + 64 + 64 + 256 + 256) + 256


def test_matmul_param_count_untied_counts_head_not_lookup():
    untied = _p1_params(repeat=True, tied=False)
    # The token table is only looked up; the separate head is the logits matmul.
    assert flops.matmul_param_count(untied) == P1_MATMUL_PARAMS
    # Forcing "tied" counts both tables.
    assert flops.matmul_param_count(untied, tied_embedding=True) == P1_MATMUL_PARAMS + 32768 * 256
    # Learned positional tables are lookups.
    params = _p1_params(repeat=True)
    params["decoder"]["emb"]["pos_emb"] = dict(weight=np.zeros((128, 256), np.float32))
    assert flops.matmul_param_count(params) == P1_MATMUL_PARAMS


def test_lm_training_flops_p1_by_hand():
    f = flops.lm_training_flops(
        matmul_params=P1_MATMUL_PARAMS,
        num_layers=2,
        num_heads=4,
        per_head_dim=64,
        seq_len=128,
        global_batch_size=4,
    )
    assert f.tokens_per_step == 512
    assert f.weight_flops == 6 * 10_485_760 * 512 == 32_212_254_720
    # 12 * L * H * Dh * B * T(T+1)/2 = 12 * 2 * 4 * 64 * 4 * 8256.
    assert f.attention_flops == 202_899_456
    assert f.total_flops == 32_212_254_720 + 202_899_456
    text = f.describe()
    assert "99.37% weight FLOPs" in text and "0.63% attention FLOPs" in text
    assert f.to_dict()["total_flops"] == f.total_flops


def test_causal_attention_counts_lower_triangle():
    # T=3: pairs (0,0),(1,0),(1,1),(2,0),(2,1),(2,2) = 6; per pair 12 * Dh per head and layer.
    got = flops.causal_attention_flops(
        num_layers=1, num_heads=1, per_head_dim=2, seq_len=3, batch_size=1
    )
    assert got == 6 * 12 * 2
    # Direct count: forward QK^T and PV only over unmasked pairs, 2 FLOPs per multiply-add.
    t, dh = 5, 8
    mask = np.tril(np.ones((t, t)))
    forward = 2 * (2 * dh * mask.sum())
    assert (
        flops.causal_attention_flops(
            num_layers=1, num_heads=1, per_head_dim=dh, seq_len=t, batch_size=1
        )
        == 3 * forward
    )


def test_weight_flops_matches_matmul_count():
    # A [T, D] x [D, F] matmul forward is 2*T*D*F FLOPs; backward 2x that.
    t, d, f = 7, 3, 5
    assert flops.weight_flops(matmul_params=d * f, tokens=t) == 3 * 2 * t * d * f


def test_invalid_inputs():
    with pytest.raises(ValueError, match="seq_len"):
        flops.lm_training_flops(
            matmul_params=1,
            num_layers=1,
            num_heads=1,
            per_head_dim=1,
            seq_len=-1,
            global_batch_size=1,
        )
    with pytest.raises(ValueError, match="matmul_params"):
        flops.lm_training_flops(
            matmul_params=-1,
            num_layers=1,
            num_heads=1,
            per_head_dim=1,
            seq_len=1,
            global_batch_size=1,
        )


def test_lm_flops_from_model_config_p1():
    # pylint: disable-next=import-outside-toplevel
    from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

    cfg = transformer_lm_config(
        num_layers=2,
        model_dim=256,
        num_heads=4,
        num_kv_heads=4,
        hidden_dim=1024,
        vocab_size=32768,
        rope_theta=5e5,
        qk_norm=True,
        sharding=False,
    )
    specs = cfg.clone(name="model").instantiate(parent=None).create_parameter_specs_recursively()
    got = flops.lm_flops_from_model_config(cfg, specs, global_batch_size=4, seq_len=128)
    assert (got.matmul_params, got.num_layers, got.num_heads, got.per_head_dim) == (
        P1_MATMUL_PARAMS,
        2,
        4,
        64,
    )
    assert got.total_flops == 32_212_254_720 + 202_899_456
    # docs/performance.md: "about 32 GFLOP per step".
    assert got.total_flops == pytest.approx(32e9, rel=0.02)
    cfg.decoder.transformer.layer.self_attention.attention.num_heads = 3
    with pytest.raises(ValueError, match="not divisible"):
        flops.lm_flops_from_model_config(cfg, specs, global_batch_size=4, seq_len=128)
