"""Qwen3-style mixture-of-experts GPT configs (AXLearn's `axlearn.experiments.text.gpt.qwen`).

Qwen3-30B-A3B (https://arxiv.org/abs/2505.09388): 48 layers of dim 2048, 32 query heads of dim
128 (attention dim 4096) over 4 KV heads with QK RMSNorm (eps 1e-6, float32) and RoPE theta 1e6,
every feed-forward a drop-free MoE of 128 SwiGLU experts of hidden dim 768 with 8 experts per
token (`TransformerFeedForwardDropFreeMoE` with `TopKDropFreeGating`, load balance weight 1e-3,
grouped-matmul tiling (128, 512, 512)), Qwen3's 151,936-token vocabulary and an untied LM head.
Flash attention everywhere; AdamW with mup-simple scaling.

`trainer_configs(train_input_source, eval_input_sources)` returns
`qwen3-30B-A3B-bs16m-seq32k` and `qwen3-30B-A3B-bs8m-seq8k` (tokens per batch, sequence length);
`axlearn.experiments.text.gpt.c4_trainer` registers them with C4 inputs.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import jax.numpy as jnp

from axlearn.common import causal_lm
from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    RoFormerQKVLinear,
    ScaleKey,
    ScaleQuery,
    TransformerLayer,
)
from axlearn.common.base_layer import RematSpec
from axlearn.common.config import FunctionConfigBase, TrainerConfigFn, config_for_function
from axlearn.common.decoder import LmHead
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.flash_attention.layer import FlashAttention
from axlearn.common.flash_attention.remat import save_or_offload_flash_attention_policy
from axlearn.common.layers import RMSNorm
from axlearn.common.mixture_of_experts import (
    GMMBackend,
    TopKDropFreeGating,
    TransformerFeedForwardDropFreeMoE,
)
from axlearn.common.trainer_config_modifier import (
    ChainConfigModifier,
    MeshShapeModifier,
    RematSpecModifier,
    ReplaceLayerConfigModifier,
)
from axlearn.common.utils import (
    HybridMeshShape,
    PartitionSpec,
    save_and_offload_only_these_names_regex,
)
from axlearn.experiments.text.gpt.common import (
    SourceBuilder,
    adamw_decoupled_learner_config,
    evaler_config_dict,
    get_trainer_config_fn,
    make_config_name,
    mesh_shape_from_axes,
    mup_simple_adam_update_transformation,
    scaled_hidden_dim,
)
from axlearn.experiments.text.gpt.common import model_config as common_model_config

# Per size: (tokens per batch, sequence length) of each registered config.
CONFIGS = {"30B-A3B": [(16 * 1024 * 1024, 32 * 1024), (8 * 1024 * 1024, 8 * 1024)]}

_BASE_MODEL_HIDDEN_DIM = 768  # Hidden dim of the mup-simple base model.

QWEN3_VOCAB_SIZE = 151936
QWEN3_BOS_TOKEN_ID = 151643
QWEN3_EOS_TOKEN_ID = 151645
QWEN3_PAD_TOKEN_ID = 151645
QWEN3_RMS_NORM_EPS = 1e-6
QWEN3_ROPE_THETA = 1_000_000.0
QWEN3_HEAD_DIM = 128

_BATCH = ("data", "expert", "fsdp")

# Remat name patterns (AXLearn's RematRegexSavePatterns values).
_FLASH_CONTEXT = ".*flash_residuals"
_QKV_PROJ = ".*[kqv]_proj"
_O_PROJ = ".*o_proj"
_LINEAR1_X = ".*linear1_[01]"
_LINEAR2_X = ".*linear2(_[01])?"
_MOE_GATING = ".*gate_weights|.*gate_assignment"


def _remat(*, saved: list[str], offloaded: list[str]) -> RematSpecModifier.Config:
    policy = config_for_function(save_and_offload_only_these_names_regex).set(
        names_which_can_be_saved="|".join(saved),
        names_which_can_be_offloaded="|".join(offloaded),
        offload_src="device",
        offload_dst="pinned_host",
    )
    return RematSpecModifier.default_config().set(
        remat_policies={
            "model.decoder.transformer.layer": RematSpec(prevent_cse=False, policy=policy)
        }
    )


def _mesh_rules() -> tuple:
    return (
        (
            "tpu-v5p-(1024|2048)",
            ChainConfigModifier.default_config().set(
                config_modifiers=[
                    MeshShapeModifier.default_config().set(
                        mesh_shape=mesh_shape_from_axes(fsdp=8, data=-1)
                    ),
                    _remat(saved=[_FLASH_CONTEXT], offloaded=[_QKV_PROJ, _LINEAR1_X, _MOE_GATING]),
                ]
            ),
        ),
        (
            # B200/H100/A100 80G: also the TOKAMAX grouped matmul in every MoE layer.
            "gpu-(p6-b200.48xlarge|p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-512",
            ChainConfigModifier.default_config().set(
                config_modifiers=[
                    MeshShapeModifier.default_config().set(
                        mesh_shape=HybridMeshShape(
                            ici_mesh_shape=mesh_shape_from_axes(fsdp=8),
                            dcn_mesh_shape=mesh_shape_from_axes(data=-1),
                        )
                    ),
                    _remat(
                        saved=[
                            _FLASH_CONTEXT,
                            _QKV_PROJ,
                            _O_PROJ,
                            _LINEAR1_X,
                            _LINEAR2_X,
                            _MOE_GATING,
                        ],
                        offloaded=[],
                    ),
                    ReplaceLayerConfigModifier.default_config().set(
                        target_cls=TransformerFeedForwardDropFreeMoE,
                        source_config=TransformerFeedForwardDropFreeMoE.default_config().set(
                            gmm_backend=GMMBackend.TOKAMAX,
                            tokamax_implementation=["triton", "xla"],
                        ),
                        exclude_keys=["gmm_backend", "tokamax_implementation"],
                    ),
                ]
            ),
        ),
    )


def get_trainer_kwargs(
    model_size: str, *, vocab_size: int, batch_size: int, max_sequence_length: int
) -> dict[str, Any]:
    """The trainer kwargs of a Qwen3 size.

    Args:
        model_size: "30B-A3B".
        vocab_size: Vocabulary size.
        batch_size: Tokens per batch.
        max_sequence_length: Tokens per sequence.

    Returns:
        Keyword arguments of `get_trainer_config_fn` (plus "max_sequence_length").

    Raises:
        NotImplementedError: For an unknown size.
    """
    if model_size not in CONFIGS:
        raise NotImplementedError(f"Unknown qwen3 model size {model_size}; one of {list(CONFIGS)}")
    model_kwargs = dict(
        # https://huggingface.co/Qwen/Qwen3-30B-A3B-Instruct-2507/blob/main/config.json
        num_layers=48,
        hidden_dim=16 * 128,
        ffn_dim=scaled_hidden_dim(scale=3, round_up_to_multiples_of=128),
        moe_ffn_dim=768,
        num_heads=32,
        atten_hidden_dim=32 * QWEN3_HEAD_DIM,
        num_kv_heads=4,
        num_experts=128,
        train_capacity_factor=0,
        num_groups=1,
        num_experts_per_token=8,
        tie_word_embeddings=False,
        z_loss_scale=1e-6,
        vocab_size=vocab_size,
    )
    max_step = 250_000
    return dict(
        save_every_n_steps=5000,
        keep_every_n_steps=5000,
        eval_every_n_steps=25_000,
        max_sequence_length=max_sequence_length,
        train_batch_size=batch_size // max_sequence_length,
        max_step=max_step,
        mesh_shape=mesh_shape_from_axes(fsdp=8, data=-1),
        mesh_rules=_mesh_rules(),
        model_cfg=model_config(**model_kwargs),
        learner_cfg=adamw_decoupled_learner_config(
            max_step=max_step,
            peak_lr=0.01,
            alpha=1 / 200.0,
            weight_decay=1e-4,
            lr_warmup_steps=5_000,
            adam_update_transformation=mup_simple_adam_update_transformation(
                min(_BASE_MODEL_HIDDEN_DIM / model_kwargs["hidden_dim"], 1.0)
            ),
        ),
    )


def model_config(
    *,
    num_layers: int,
    hidden_dim: int,
    num_heads: int,
    num_kv_heads: int,
    num_experts: int,
    vocab_size: int,
    train_capacity_factor: float,
    num_groups: int,
    ffn_dim: Union[int, FunctionConfigBase],
    moe_ffn_dim: Optional[Union[int, FunctionConfigBase]] = None,
    atten_hidden_dim: Optional[int] = None,
    num_experts_per_token: int = 2,
    dropout_rate: float = 0.0,
    tie_word_embeddings: bool = False,
    z_loss_scale: float = 0.0,
    tiling: tuple[int, int, int] = (128, 512, 512),
) -> causal_lm.Model.Config:
    """A Qwen3-style causal LM config (every feed-forward a drop-free MoE).

    Args:
        num_layers: Transformer layers.
        hidden_dim: Model dim.
        num_heads: Query heads.
        num_kv_heads: Key/value heads.
        num_experts: Experts per MoE layer.
        vocab_size: Vocabulary size.
        train_capacity_factor: The router's capacity factor (0: unused, drop-free).
        num_groups: Token groups per MoE layer.
        ffn_dim: Dense feed-forward hidden dim (unused when every layer is MoE).
        moe_ffn_dim: Expert hidden dim (None: ffn_dim).
        atten_hidden_dim: Attention projection dim (None: hidden_dim).
        num_experts_per_token: Experts per token.
        dropout_rate: Decoder dropout.
        tie_word_embeddings: Tie the LM head to the token embedding.
        z_loss_scale: Scale of the z-loss (on the "lm" loss metric).
        tiling: Grouped-matmul tiling of the experts.

    Returns:
        The model config.
    """
    qkv_linear = RoFormerQKVLinear.default_config().set(
        input_linear=FusedGroupedQKVLinear.default_config().set(num_kv_heads=num_kv_heads),
        rotary_value=False,
    )
    qkv_linear.rope_pos_emb_layer.theta = QWEN3_ROPE_THETA
    norm_cfg = RMSNorm.default_config().set(eps=QWEN3_RMS_NORM_EPS, forward_dtype=jnp.float32)
    layer_cfg = TransformerLayer.default_config()
    layer_cfg.self_attention.attention = FlashAttention.default_config().set(
        causal=True,
        mha_dim_to_partition_spec={
            "btnh": PartitionSpec(_BATCH, None, ("seq", "model"), None),
            "bsnh": PartitionSpec(_BATCH, None, ("seq", "model"), None),
            "bnts": PartitionSpec(_BATCH, None, None, None),
        },
        output_dim_to_partition_spec={
            "btnh": PartitionSpec(_BATCH, "seq", "model", None),
            "bnts": PartitionSpec(_BATCH, "model", "seq", None),
        },
        # QK norm (https://arxiv.org/abs/2309.14322).
        query_scale=ScaleQuery.default_config().set(norm=norm_cfg.clone()),
        key_scale=ScaleKey.default_config().set(norm=norm_cfg.clone()),
        hidden_dim=atten_hidden_dim,
        o_partition_spec=(_BATCH, "seq", "model"),
        tpu_block_size=2048,
        backend_overrides=dict(splash_use_fused_bwd_kernel=True),
    )
    emb_cfg = TransformerTextEmbeddings.default_config().set(pos_emb=None)
    emb_cfg.token_emb.param_partition_spec = ("model", ("expert", "fsdp", "seq"))
    emb_cfg.token_emb.output_partition_spec = (_BATCH, "seq", None)
    lm_head = None
    if not tie_word_embeddings:
        lm_head = LmHead.default_config().set(
            param_partition_spec=("model", ("expert", "fsdp", "seq"))
        )
    cfg = common_model_config(
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        vocab_size=vocab_size,
        activation_fn=("nn.silu", "linear"),  # SwiGLU.
        ffn_dim=ffn_dim,
        normalization=norm_cfg,
        dropout_rate=dropout_rate,
        emb_cfg=emb_cfg,
        attention_qkv_linear=qkv_linear,
        layer_cfg=layer_cfg,
        lm_head_cfg=lm_head,
    )
    layer = cfg.decoder.transformer.layer
    layer.feed_forward = TransformerFeedForwardDropFreeMoE.default_config().set(
        input_dim=hidden_dim,
        hidden_dim=moe_ffn_dim if moe_ffn_dim is not None else ffn_dim,
        activation=layer.feed_forward.activation,
        structure=layer.feed_forward.structure,
        norm=layer.feed_forward.norm.clone(),
        num_experts=num_experts,
        num_groups=num_groups,
        dim_to_mesh_axis_map={
            "me": PartitionSpec(None, None),
            "emh": PartitionSpec("expert", ("fsdp", "seq"), "model"),
            "ehm": PartitionSpec("expert", "model", ("fsdp", "seq")),
        },
        input_dim_to_partition_spec={"bsm": PartitionSpec(_BATCH, "seq", None)},
        output_dim_to_partition_spec={
            "bsm": PartitionSpec(_BATCH, "seq", "model"),
            "emh": PartitionSpec("expert", None, "model"),
            "ehm": PartitionSpec("expert", "model", None),
        },
        gating=TopKDropFreeGating.default_config().set(
            num_experts_per_token=num_experts_per_token,
            train_capacity_factor=train_capacity_factor,
        ),
        load_balance_loss_weight=1e-3,
        tiling=tiling,
    )
    if z_loss_scale:
        cfg.metrics.metrics["lm"].z_loss_scale = z_loss_scale
    cfg.decoder.eos_token_id = QWEN3_EOS_TOKEN_ID
    cfg.decoder.pad_token_id = QWEN3_PAD_TOKEN_ID
    cfg.batch_axis_names = _BATCH
    layer.remat_spec = RematSpec(prevent_cse=False, policy=save_or_offload_flash_attention_policy())
    return cfg


def trainer_configs(
    train_input_source: SourceBuilder, eval_input_sources: SourceBuilder
) -> dict[str, TrainerConfigFn]:
    """{config name: TrainerConfigFn}: qwen3-<size>-bs<M tokens>m-seq<K tokens>k.

    Args:
        train_input_source: fn(vocab_size=, max_sequence_length=) -> training input config.
        eval_input_sources: fn(vocab_size=, max_sequence_length=) -> {name: eval input config}.

    Returns:
        The config functions by name.
    """
    configs: dict[str, TrainerConfigFn] = {}
    for model_size, shapes in CONFIGS.items():
        base = make_config_name(arch="qwen3", model_size=model_size)
        for batch_size, seq_len in shapes:
            kwargs = get_trainer_kwargs(
                model_size,
                vocab_size=QWEN3_VOCAB_SIZE,
                batch_size=batch_size,
                max_sequence_length=seq_len,
            )
            seq_len = kwargs.pop("max_sequence_length")
            name = f"{base}-bs{batch_size // 1024 // 1024}m-seq{seq_len // 1024}k"
            configs[name] = get_trainer_config_fn(
                train_input_source=train_input_source(
                    vocab_size=QWEN3_VOCAB_SIZE, max_sequence_length=seq_len
                ),
                evalers=evaler_config_dict(
                    eval_input_sources(vocab_size=QWEN3_VOCAB_SIZE, max_sequence_length=seq_len)
                ),
                **kwargs,
            )
    return configs
