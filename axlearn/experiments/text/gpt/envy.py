"""Envy: Switch-Transformer-style mixture-of-experts GPT configs (AXLearn's
`axlearn.experiments.text.gpt.envy`).

Decoder-only models with Switch-Transformer sizes (https://arxiv.org/abs/2101.03961) and the
Fuji recipe around them: RoPE (theta 5e5) grouped-query attention with QK RMSNorm, SwiGLU
feed-forwards, RMSNorm (eps 1e-5), a 32K vocabulary, 8K-token sequences and 8M-token batches,
AdamW with mup-simple scaling of the linear layers' updates. Every other layer's feed-forward is
a `TransformerFeedForwardMoE` (top-2 gating, train capacity factor 2, 2 groups): the stack is a
`RepeatedTransformerLayer` of `StackedTransformerLayer`s of ("dense", "sparse") layers. Expert
weights shard over the "expert" mesh axis; dispatched activations over ("data", "fsdp") x
"expert" (`MOE_DIM_TO_MESH_AXIS_MAP`), with the MoE outer batch the ("data", "fsdp") size of the
mesh.

`trainer_configs(train_input_source, eval_input_sources)` returns `envy-test`,
`envy-Switch-Base`, `envy-Switch-Base-single-host`, `envy-Switch-Large` and `envy-Switch-XXL`;
`axlearn.experiments.text.gpt.c4_trainer` registers them with C4 inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

from jax.ad_checkpoint import checkpoint_policies as jax_remat_policies

from axlearn.common import causal_lm
from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    GroupedQueryAttention,
    RoFormerQKVLinear,
    ScaleKey,
    ScaleQuery,
    StackedTransformerLayer,
    TransformerLayer,
)
from axlearn.common.base_layer import RematSpec
from axlearn.common.config import (
    FunctionConfigBase,
    InstantiableConfig,
    TrainerConfigFn,
    config_for_function,
)
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.layers import RMSNorm
from axlearn.common.mixture_of_experts import TransformerFeedForwardMoE, get_outer_batch_from_mesh
from axlearn.common.trainer_config_modifier import (
    ChainConfigModifier,
    GradientAccumulationModifier,
    MeshShapeModifier,
    RematSpecModifier,
)
from axlearn.common.utils import PartitionSpec, save_and_offload_only_these_names_regex
from axlearn.experiments.text.gpt.common import (
    MESH_AXIS_NAMES,
    SourceBuilder,
    adamw_decoupled_learner_config,
    evaler_config_dict,
    flash_attention_config,
    get_trainer_config_fn,
    make_config_name,
    mesh_shape_from_axes,
    mup_simple_adam_update_transformation,
    scaled_hidden_dim,
)
from axlearn.experiments.text.gpt.common import model_config as common_model_config
from axlearn.experiments.text.gpt.fuji import offload_attention_proj_policy
from axlearn.experiments.trainer_config_utils import V7xFlashConfigModifier

MODEL_SIZES = ("test", "Switch-Base", "Switch-Large", "Switch-XXL")

NUM_EXPERTS = {"test": 8, "Switch-Base": 128, "Switch-Large": 128, "Switch-XXL": 64}

VOCAB_SIZE = 32 * 1024  # T5's 32128, rounded to 32K.

MAX_SEQUENCE_LENGTH = {size: 8192 for size in MODEL_SIZES}

# Hidden dim of the mup-simple base model (smaller models do not scale their linear updates).
_BASE_MODEL_HIDDEN_DIM = 768

# Mesh axes of the MoE outer batch.
MOE_OUTER_BATCH_AXIS_NAMES = ("data", "fsdp")

# Partition specs of the MoE layers' weights and activations (see TransformerFeedForwardMoE).
MOE_DIM_TO_MESH_AXIS_MAP = {
    "me": PartitionSpec(None, None),
    "emh": PartitionSpec("expert", "fsdp", "model"),
    "ehm": PartitionSpec("expert", "model", "fsdp"),
    "ogsm": PartitionSpec(MOE_OUTER_BATCH_AXIS_NAMES, "expert", None, "model"),
    "ogsec": PartitionSpec(MOE_OUTER_BATCH_AXIS_NAMES, None, None, "expert", None),
    "oegcm": PartitionSpec(MOE_OUTER_BATCH_AXIS_NAMES, "expert", None, None, "model"),
    "ogecm": PartitionSpec(MOE_OUTER_BATCH_AXIS_NAMES, None, "expert", None, "model"),
    "oegch": PartitionSpec(MOE_OUTER_BATCH_AXIS_NAMES, "expert", None, None, "model"),
}

_TOKENS_PER_BATCH = 8 * 1024**2


def _chain(*modifiers: InstantiableConfig) -> ChainConfigModifier.Config:
    return ChainConfigModifier.default_config().set(config_modifiers=list(modifiers))


def _mesh(**axes: int) -> MeshShapeModifier.Config:
    return MeshShapeModifier.default_config().set(mesh_shape=mesh_shape_from_axes(**axes))


def _remat(policy: Any, *, prevent_cse: bool) -> RematSpecModifier.Config:
    return RematSpecModifier.default_config().set(
        remat_policies={
            "model.decoder.transformer.layer": RematSpec(prevent_cse=prevent_cse, policy=policy)
        }
    )


def _offload_inputs() -> FunctionConfigBase:
    return config_for_function(save_and_offload_only_these_names_regex).set(
        names_which_can_be_saved=None,
        names_which_can_be_offloaded=".*input",
        offload_src="device",
        offload_dst="pinned_host",
    )


def _v5p_v6e_rules(*, v5p_policy: Any, v6e_names: Sequence[str]) -> list:
    rules = [
        (
            "tpu-v5p-(1024|2048)",
            _chain(_mesh(data=-1, expert=16, fsdp=16), _remat(v5p_policy, prevent_cse=True)),
        )
    ]
    for name in v6e_names:
        modifiers = [
            _mesh(data=-1, expert=16, fsdp=16),
            _remat(offload_attention_proj_policy, prevent_cse=True),
        ]
        if name == "tpu-v6e-256" and "tpu-v6e-256-4" in v6e_names:
            modifiers.append(GradientAccumulationModifier.default_config().set(grad_acc_steps=4))
        rules.append((name, _chain(*modifiers)))
    return rules


def _mesh_rules(model_size: str) -> Optional[tuple]:
    if model_size == "Switch-Base":
        rules = _v5p_v6e_rules(
            v5p_policy=jax_remat_policies.dots_saveable, v6e_names=("tpu-v6e-256",)
        )
        rules.append(
            (
                "tpu-7x-256",
                _chain(
                    _mesh(data=-1, expert=16, fsdp=16),
                    V7xFlashConfigModifier.default_config().set(tpu_block_size=2048),
                    _remat(_offload_inputs(), prevent_cse=False),
                ),
            )
        )
        return tuple(rules)
    if model_size == "Switch-Large":
        return tuple(
            _v5p_v6e_rules(
                v5p_policy=offload_attention_proj_policy,
                v6e_names=("tpu-v6e-256-4", "tpu-v6e-256"),
            )
        )
    return None


def _model_kwargs(model_size: str) -> dict[str, Any]:
    common = dict(num_groups=2, train_capacity_factor=2.0, ffn_layer_types=("dense", "sparse"))
    if model_size == "test":
        return dict(
            common,
            num_layers=4,
            hidden_dim=8,
            ffn_dim=scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=16),
            num_heads=4,
            num_kv_heads=2,
            vocab_size=32,
            num_experts=NUM_EXPERTS[model_size],
        )
    shapes = {
        # (num_layers, heads, kv heads, ffn scale): 30B, 104B and 520B parameters.
        "Switch-Base": (12, 12, 12, 4),
        "Switch-Large": (24, 16, 16, 4),
        "Switch-XXL": (24, 64, 8, 2.5),
    }
    num_layers, num_heads, num_kv_heads, scale = shapes[model_size]
    return dict(
        common,
        num_layers=num_layers,
        hidden_dim=num_heads * 128,
        ffn_dim=scaled_hidden_dim(scale=scale, round_up_to_multiples_of=128),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        num_experts=NUM_EXPERTS[model_size],
        ffn_structure="hybridnorm",
    )


def get_trainer_kwargs(
    model_size: str, *, vocab_size: int, max_sequence_length: int, flash_attention: bool
) -> dict[str, Any]:
    """The trainer kwargs (model, learner, batch, steps, mesh) of an Envy size.

    Args:
        model_size: One of MODEL_SIZES.
        vocab_size: Vocabulary size.
        max_sequence_length: Tokens per sequence.
        flash_attention: Whether attention uses the flash layer.

    Returns:
        Keyword arguments of `get_trainer_config_fn` (plus "max_sequence_length").

    Raises:
        NotImplementedError: For an unknown size.
    """
    if model_size not in MODEL_SIZES:
        raise NotImplementedError(f"Unknown envy model size {model_size}; one of {MODEL_SIZES}")
    model_kwargs = dict(z_loss_scale=1e-6, vocab_size=vocab_size)
    model_kwargs.update(_model_kwargs(model_size))
    learner_kwargs = dict(peak_lr=1e-2, alpha=1 / 200.0, weight_decay=3.16e-4)
    kwargs: dict[str, Any] = dict(
        save_every_n_steps=5000, keep_every_n_steps=5000, eval_every_n_steps=25_000
    )
    if model_size == "test":
        kwargs.update(
            max_sequence_length=64,
            train_batch_size=16,
            max_step=3000,
            mesh_shape=mesh_shape_from_axes(data=-1),
        )
    else:
        learner_kwargs.update(peak_lr=0.01, weight_decay=1e-4, lr_warmup_steps=5_000)
        mesh = dict(fsdp=-1, expert=16, model=8 if model_size == "Switch-XXL" else 1)
        kwargs.update(
            max_sequence_length=max_sequence_length,
            train_batch_size=_TOKENS_PER_BATCH // max_sequence_length,
            max_step=250_000,
            mesh_shape=mesh_shape_from_axes(**mesh),
        )
        if _mesh_rules(model_size) is not None:
            kwargs["mesh_rules"] = _mesh_rules(model_size)
    # The test size keeps an outer batch of 1 (its data=-1 mesh is resolved at run time).
    outer_mesh = None if model_size == "test" else kwargs["mesh_shape"]
    kwargs["model_cfg"] = model_config(
        flash_attention=flash_attention, mesh_shape=outer_mesh, **model_kwargs
    )
    kwargs["learner_cfg"] = adamw_decoupled_learner_config(
        max_step=kwargs["max_step"],
        adam_update_transformation=mup_simple_adam_update_transformation(
            min(_BASE_MODEL_HIDDEN_DIM / model_kwargs["hidden_dim"], 1.0)
        ),
        **learner_kwargs,
    )
    return kwargs


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
    ffn_layer_types: Sequence[str],
    ffn_dim: Union[int, FunctionConfigBase],
    dropout_rate: float = 0.0,
    flash_attention: bool = False,
    mesh_shape: Optional[Any] = None,
    ffn_structure: str = "prenorm",
    z_loss_scale: float = 0.0,
    **kwargs,
) -> causal_lm.Model.Config:
    """An Envy causal LM config.

    Args:
        num_layers: Transformer layers (a multiple of len(ffn_layer_types)).
        hidden_dim: Model dim.
        num_heads: Query heads.
        num_kv_heads: Key/value heads.
        num_experts: Experts per MoE layer.
        vocab_size: Vocabulary size.
        train_capacity_factor: The router's training capacity factor.
        num_groups: Token groups per MoE layer.
        ffn_layer_types: The repeated pattern of feed-forward kinds, "dense" or "sparse".
        ffn_dim: Feed-forward hidden dim (or a function config of the model dim).
        dropout_rate: Decoder dropout.
        flash_attention: Use the flash attention layer (and save dots in the remat policy).
        mesh_shape: The mesh shape the MoE outer batch is computed from (None: 1).
        ffn_structure: Feed-forward structure ("prenorm", "hybridnorm", ...).
        z_loss_scale: Scale of the z-loss (set on the "lm" loss metric, as AXLearn's dumps show).
        **kwargs: More `common.model_config` arguments (e.g. z_loss_scale).

    Returns:
        The model config.

    Raises:
        ValueError: If num_layers is not a multiple of len(ffn_layer_types) or a type is unknown.
    """
    if num_layers % len(ffn_layer_types) or set(ffn_layer_types) - {"dense", "sparse"}:
        raise ValueError(
            f"envy model_config: num_layers={num_layers} must be a multiple of "
            f"len(ffn_layer_types)={len(ffn_layer_types)} and types in (dense, sparse), got "
            f"{list(ffn_layer_types)}"
        )
    qkv_linear = RoFormerQKVLinear.default_config().set(
        input_linear=FusedGroupedQKVLinear.default_config().set(num_kv_heads=num_kv_heads),
        rotary_value=False,
    )
    qkv_linear.rope_pos_emb_layer.theta = 5e5
    norm_cfg = RMSNorm.default_config().set(eps=1e-5, forward_dtype=None)
    layer_cfg = TransformerLayer.default_config()
    attention = (
        flash_attention_config() if flash_attention else GroupedQueryAttention.default_config()
    )
    attention.set(
        # QK norm (https://arxiv.org/abs/2309.14322).
        query_scale=ScaleQuery.default_config().set(norm=norm_cfg.clone()),
        key_scale=ScaleKey.default_config().set(norm=norm_cfg.clone()),
    )
    layer_cfg.self_attention.attention = attention
    emb_cfg = TransformerTextEmbeddings.default_config().set(pos_emb=None)
    emb_cfg.token_emb.param_partition_spec = (("expert", "fsdp", "seq"), "model")
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
        ffn_structure=ffn_structure,
        **kwargs,
    )
    if z_loss_scale:
        cfg.metrics.metrics["lm"].z_loss_scale = z_loss_scale
    outer_batch = 1
    if mesh_shape is not None:
        outer_batch = get_outer_batch_from_mesh(
            mesh_axis_names=MESH_AXIS_NAMES,
            outer_batch_axis_names=MOE_OUTER_BATCH_AXIS_NAMES,
            mesh_shape=mesh_shape,
        )
    dense = cfg.decoder.transformer.layer
    expert = TransformerFeedForwardMoE.default_config().set(
        input_dim=hidden_dim,
        hidden_dim=dense.feed_forward.hidden_dim,
        activation=dense.feed_forward.activation,
        structure=ffn_structure,
        norm=dense.feed_forward.norm.clone(),
        outer_batch=outer_batch,
        num_experts=num_experts,
        num_groups=num_groups,
        dim_to_mesh_axis_map=dict(MOE_DIM_TO_MESH_AXIS_MAP),
    )
    expert.gating.train_capacity_factor = train_capacity_factor
    layers = [
        dense.clone() if kind == "dense" else dense.clone(feed_forward=expert.clone())
        for kind in ffn_layer_types
    ]
    cfg.decoder.transformer.set(
        num_layers=num_layers // len(ffn_layer_types),
        layer=StackedTransformerLayer.default_config().set(
            num_layers=len(ffn_layer_types), layer=layers
        ),
    )
    if flash_attention:
        cfg.decoder.transformer.layer.remat_spec = RematSpec(
            prevent_cse=False, policy=jax_remat_policies.dots_saveable
        )
    return cfg


def _single_host(base: TrainerConfigFn) -> TrainerConfigFn:
    """`base` with 8-example feed batches and no activations saved (one host)."""

    def config_fn():
        cfg = base().clone()
        cfg.input.batcher.feed_batch_size = 8
        for evaler in cfg.evalers.values():
            evaler.input.batcher.feed_batch_size = 8
        modifier = _remat(jax_remat_policies.nothing_saveable, prevent_cse=True).instantiate()
        return modifier(cfg)

    return config_fn


def trainer_configs(
    train_input_source: SourceBuilder, eval_input_sources: SourceBuilder
) -> dict[str, TrainerConfigFn]:
    """{config name: TrainerConfigFn} of the Envy sizes (and Switch-Base's single-host variant).

    Args:
        train_input_source: fn(vocab_size=, max_sequence_length=) -> training input config.
        eval_input_sources: fn(vocab_size=, max_sequence_length=) -> {name: eval input config}.

    Returns:
        The config functions by name.
    """
    configs: dict[str, TrainerConfigFn] = {}
    for model_size in MODEL_SIZES:
        name = make_config_name(arch="envy", model_size=model_size)
        kwargs = get_trainer_kwargs(
            model_size,
            vocab_size=VOCAB_SIZE,
            max_sequence_length=MAX_SEQUENCE_LENGTH[model_size],
            flash_attention=model_size != "test",
        )
        seq_len = kwargs.pop("max_sequence_length")
        configs[name] = get_trainer_config_fn(
            train_input_source=train_input_source(
                vocab_size=VOCAB_SIZE, max_sequence_length=seq_len
            ),
            evalers=evaler_config_dict(
                eval_input_sources(vocab_size=VOCAB_SIZE, max_sequence_length=seq_len)
            ),
            **kwargs,
        )
        if model_size == "Switch-Base":
            configs[f"{name}-single-host"] = _single_host(configs[name])
    return configs


__all__ = ["model_config", "trainer_configs"]
