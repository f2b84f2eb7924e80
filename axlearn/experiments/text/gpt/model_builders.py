"""Builders of decoder-only transformer LM configs (Llama-style: RoPE, RMSNorm, SwiGLU, GQA).

`transformer_lm_config(...)` returns a `causal_lm.Model.Config` from a handful of
hyper-parameters; `honeycrisp_model_config()` is the 3B model of the reference trainer dump
(`model.` lines of tests/testdata/trainer/honeycrisp_trainer_config.txt).
"""

from typing import Optional

import jax.numpy as jnp

from axlearn.common import causal_lm
from axlearn.common.attention import (
    FlashAttention,
    FusedGroupedQKVLinear,
    GroupedQKVLinear,
    GroupedQueryAttention,
    RepeatedTransformerLayer,
    RoFormerQKVLinear,
    StackedTransformerLayer,
    TransformerLayer,
    build_remat_spec,
)
from axlearn.common.decoder import Decoder, LmHead
from axlearn.common.layers import RMSNorm
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer

# Sharding used by the reference config: batch over (data, expert, fsdp), weights' model dim
# over (expert, fsdp, seq), tensor parallelism over 'model'.
BATCH_AXES = ("data", "expert", "fsdp")
FSDP_AXES = ("expert", "fsdp", "seq")


def _rms_norm(eps: float) -> RMSNorm.Config:
    return RMSNorm.default_config().set(eps=eps, forward_dtype=None)


def transformer_lm_config(
    *,
    num_layers: int,
    model_dim: int,
    num_heads: int,
    hidden_dim: int,
    vocab_size: int,
    num_kv_heads: Optional[int] = None,
    rope_theta: float = 10000.0,
    qk_norm: bool = False,
    norm_eps: float = 1e-5,
    stack: str = "repeat",
    fused_qkv: bool = True,
    tied_embedding: bool = True,
    flash_attention: bool = False,
    remat: bool = False,
    dropout_rate: float = 0.0,
    z_loss_scale: float = 0.0,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
    dtype=jnp.float32,
    cache_dtype=None,
    sharding: bool = False,
) -> causal_lm.Model.Config:
    """Returns a decoder-only LM config: pre-norm RMSNorm, RoPE GQA and a SwiGLU feed-forward.

    Args:
        num_layers: Number of transformer layers.
        model_dim: Model (embedding) dim.
        num_heads: Query heads; head dim is model_dim // num_heads.
        hidden_dim: Feed-forward hidden dim.
        vocab_size: Vocabulary size.
        num_kv_heads: Key/value heads (None: num_heads).
        rope_theta: RoPE base.
        qk_norm: Whether to RMS-normalize queries and keys per head (after RoPE).
        norm_eps: RMSNorm epsilon.
        stack: "repeat" (RepeatedTransformerLayer) or "stack" (StackedTransformerLayer).
        fused_qkv: FusedGroupedQKVLinear (one qkv_proj weight) or GroupedQKVLinear (q/k/v_proj).
        tied_embedding: Whether the LM head reuses the token embedding.
        flash_attention: Whether to use FlashAttention (jax.nn.dot_product_attention).
        remat: Whether layers rematerialize activations, saving attention projections/context.
        dropout_rate: Decoder-wide dropout rate.
        z_loss_scale: Scale of the z-loss.
        pad_token_id: Padding id.
        eos_token_id: End-of-sequence id.
        dtype: Parameter dtype.
        cache_dtype: KV cache dtype for decoding (None: the parameter dtype).
        sharding: Whether to set the reference config's partition specs (needs a mesh with axes
            data, expert, fsdp, seq, model).

    Returns:
        The model config.

    Raises:
        ValueError: For an unknown `stack`.
    """
    num_kv_heads = num_kv_heads or num_heads
    qkv_cls = FusedGroupedQKVLinear if fused_qkv else GroupedQKVLinear
    qkv = qkv_cls.default_config().set(num_kv_heads=num_kv_heads)
    qkv.layer.set(bias=False)
    if cache_dtype is not None:
        qkv.set(cache_dtype=cache_dtype)
    if sharding:
        qkv.layer.set(param_partition_spec=(FSDP_AXES, "model", None))
    rope = RoFormerQKVLinear.default_config().set(input_linear=qkv, rotary_value=False)
    rope.rope_pos_emb_layer.set(theta=rope_theta)
    if cache_dtype is not None:
        rope.set(cache_dtype=cache_dtype)
    attention_cls = FlashAttention if flash_attention else GroupedQueryAttention
    attention = attention_cls.default_config().set(
        num_heads=num_heads, causal=True, input_linear=rope
    )
    attention.output_linear.set(bias=False)
    if sharding:
        attention.output_linear.set(param_partition_spec=(FSDP_AXES, "model", None))
    if qk_norm:
        attention.query_scale.set(norm=_rms_norm(norm_eps))
        attention.key_scale.set(norm=_rms_norm(norm_eps))

    layer = TransformerLayer.default_config()
    layer.self_attention.set(attention=attention, norm=_rms_norm(norm_eps))
    ff = layer.feed_forward.set(
        hidden_dim=hidden_dim, activation=("nn.silu", "linear"), norm=_rms_norm(norm_eps)
    )
    ff.linear1.set(bias=False)
    ff.linear2.set(bias=False)
    if sharding:
        ff.linear1.set(
            param_partition_spec=(FSDP_AXES, "model"),
            output_partition_spec=(BATCH_AXES, "seq", "model"),
        )
        ff.linear2.set(
            param_partition_spec=("model", FSDP_AXES),
            output_partition_spec=(BATCH_AXES, "seq", "model"),
        )

    if stack == "repeat":
        stack_cfg = RepeatedTransformerLayer.default_config()
    elif stack == "stack":
        stack_cfg = StackedTransformerLayer.default_config()
    else:
        raise ValueError(f"stack must be 'repeat' or 'stack', got {stack!r}")
    if remat:
        layer.set(remat_spec=build_remat_spec(stack_cfg))
    stack_cfg.set(num_layers=num_layers, layer=layer)

    decoder = Decoder.default_config().set(
        attention_mask=None,
        dim=model_dim,
        vocab_size=vocab_size,
        dropout_rate=dropout_rate,
        transformer=stack_cfg,
        output_norm=_rms_norm(norm_eps),
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
    )
    if not tied_embedding:
        decoder.set(lm_head=LmHead.default_config())
    if sharding:
        decoder.emb.token_emb.set(param_partition_spec=(FSDP_AXES, "model"))
        decoder.set(logits_partition_spec=(BATCH_AXES, "seq", "model"))
    model = causal_lm.Model.default_config().set(
        decoder=decoder, z_loss_scale=z_loss_scale, dtype=dtype
    )
    return model


def honeycrisp_model_config() -> causal_lm.Model.Config:
    """The 3B model of the reference dump (2,737,739,264 parameters).

    dim 3072, 26 repeated layers, 24 query / 8 KV heads of 128, SwiGLU hidden 8064, vocab 49152,
    QK-norm, RoPE theta 5e5, tied head, z-loss 1e-6, remat saving attention projections/context.

    Returns:
        The model config.
    """
    model = transformer_lm_config(
        num_layers=26,
        model_dim=3072,
        num_heads=24,
        num_kv_heads=8,
        hidden_dim=8064,
        vocab_size=49152,
        rope_theta=500000.0,
        qk_norm=True,
        norm_eps=1e-5,
        stack="repeat",
        z_loss_scale=1e-6,
        cache_dtype=jnp.bfloat16,
        sharding=True,
    )
    decoder = model.decoder
    layer = decoder.transformer.layer
    layer.feed_forward.set(
        add_dead_neuron_summary=True, add_value_rms_norm_summary=["linear2_outputs"]
    )
    layer.set(remat_spec=build_remat_spec(decoder.transformer))
    model.set(
        batch_axis_names=BATCH_AXES,
        seq_axis_names=("seq",),
        param_init=DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan="fan_in", distribution="normal"
                )
            }
        ),
    )
    return model
