"""The Fuji family (AXLearn's LLaMA-style GPTs): AXLearn's `fuji` module, plus our `fuji-tiny-v3`.

`trainer_configs(train_input_source, eval_input_sources)` returns AXLearn's Fuji configs for
given input sources (AXLearn's `axlearn.experiments.text.gpt.c4_trainer` registers them with C4
data), with AXLearn's names:

    fuji-{test,7B,70B}-v1, fuji-{test,7B,70B}-v2, fuji-{test,1B,3B,7B,70B,405B}-v3,
    fuji-{test,1B,3B,8B,70B,405B}-v3-tiktoken (Llama 3's tokenizer; pad 128004, EOS 128001),
    each also as "-flash" (FlashAttention); every non-test one also as "-fp8"
    (FP8ConfigModifier on its GPU mesh rules); "-single-host" variants of the 1B/3B/7B/8B
    configs and of their "-fp8" ones (batch / 128); "fuji-golden-run-test-v{1,2,3,3-tiktoken}".

Every model is a pre-norm RMSNorm decoder with RoPE grouped-query attention (8 KV heads from v2
70B and v3; fused QKV projection), a SwiGLU feed-forward and decoupled AdamW; v3 uses a
131072-token vocabulary (`VOCAB_SIZE[V3] = 128 * 1024`; 128256 is `V3_TIKTOKEN`), 8192-token
sequences, 16M tokens per batch (2048 sequences) and 15T tokens (983040 steps). The mesh rules
are AXLearn's (`ChainConfigModifier` chains keyed by instance-type regexes).

This module's own `named_trainer_configs()` has only `fuji-tiny-v3`, a 2-layer Fuji that trains
here on the embedded corpus in minutes:

    python -m axlearn.common.launch_trainer_main --module=text.gpt.fuji --config=fuji-tiny-v3 \\
        --trainer_dir=/tmp/fuji-tiny --jax_backend=cpu

The large configs are `--module=text.gpt.c4_trainer --config=fuji-7B-v3` (and so on).
"""

from __future__ import annotations

import enum
import functools
import itertools
from typing import Any, Callable, Optional, Union

from jax.ad_checkpoint import checkpoint_policies as jax_remat_policies

from axlearn.common import causal_lm
from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    FusedQKVLinear,
    GroupedQKVLinear,
    GroupedQueryAttention,
    KVCache,
    MultiheadAttention,
    RematRegexSavePatterns,
    RepeatedTransformerLayer,
    RoFormerQKVLinear,
    StackedTransformerLayer,
)
from axlearn.common.base_layer import RematSpec
from axlearn.common.config import FunctionConfigBase, InstantiableConfig, config_for_function
from axlearn.common.decoder import LmHead
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.flash_attention.layer import FlashBlockSizeModifier
from axlearn.common.flash_attention.remat import save_or_offload_flash_attention_policy
from axlearn.common.layers import RMSNorm
from axlearn.common.trainer_config_modifier import (
    ChainConfigModifier,
    FP8ConfigModifier,
    GradientAccumulationModifier,
    MeshShapeModifier,
    ModuleConfigModifier,
    PartitionSpecModifier,
    RematSpecModifier,
)
from axlearn.common.utils import (
    combine_remat_policies,
    extended_checkpoint_policies,
    save_and_offload_only_these_names_regex,
)
from axlearn.experiments.text.gpt.common import (
    STEP_DTYPE,
    SourceBuilder,
    adamw_decoupled_learner_config,
    evaler_config_dict,
    flash_attention_config,
    get_trainer_config_fn,
    make_config_name,
    mesh_shape_from_axes,
    scaled_hidden_dim,
)
from axlearn.experiments.text.gpt.common import model_config as common_model_config
from axlearn.experiments.text.gpt.fuji_tiny import tiny_trainer_configs
from axlearn.experiments.trainer_config_utils import (
    SplashAttentionConfigModifier,
    TrainerConfigFn,
    V6eFlashConfigModifier,
    V7xFlashConfigModifier,
)

MODEL_SIZES = ("test", "1B", "3B", "7B", "8B", "70B", "405B")


class Version(enum.Enum):
    """Fuji versions (V3_TIKTOKEN: v3 with Llama 3's 128256-token tiktoken vocabulary)."""

    V1 = 1
    V2 = 2
    V3 = 3
    V3_TIKTOKEN = "3-tiktoken"


# Vocabulary size of each version.
VOCAB_SIZE = {
    Version.V1: 32 * 1024,
    Version.V2: 32 * 1024,
    Version.V3: 128 * 1024,
    Version.V3_TIKTOKEN: 128256,
}

# Sequence length of each version.
MAX_SEQUENCE_LENGTH = {
    Version.V1: 2048,
    Version.V2: 4096,
    Version.V3: 8192,
    Version.V3_TIKTOKEN: 8192,
}

# RoPE theta of each version.
ROPE_THETA = {
    Version.V1: 1e4,
    Version.V2: 1e4,
    Version.V3: 5e5,
    Version.V3_TIKTOKEN: 5e5,
}

# Training tokens of each version and size (the sizes each version has).
TOTAL_TOKENS = {
    Version.V1: {"test": 1 * (1024**4), "7B": 1 * (1024**4), "70B": int(1.4 * (1024**4))},
    Version.V2: {"test": 2 * (1024**4), "7B": 2 * (1024**4), "70B": 2 * (1024**4)},
    Version.V3: {size: 15 * (1024**4) for size in MODEL_SIZES if size != "8B"},
    # Llama 3's tokenizer (`vocabulary_fuji_v3.FujiV3Vocabulary`); 8B is Llama 3 8B's shape.
    Version.V3_TIKTOKEN: {
        size: 15 * (1024**4) for size in ("test", "1B", "3B", "8B", "70B", "405B")
    },
}

# Padding and end-of-sequence ids of the tiktoken vocabulary (Llama 3's special tokens
# <|finetune_right_pad_id|> and <|end_of_text|>); the sentencepiece versions use 0 and 1.
TIKTOKEN_PAD_ID = 128004
TIKTOKEN_EOS_ID = 128001

# Tokens per batch (LLaMA 3 uses 16M tokens per batch after 2.87T tokens).
TOKENS_PER_BATCH = {
    Version.V1: 4 * (1024**2),
    Version.V2: 4 * (1024**2),
    Version.V3: 16 * (1024**2),
    Version.V3_TIKTOKEN: 16 * (1024**2),
}


@functools.cache
def _offload_dots() -> Callable[..., Any]:
    return extended_checkpoint_policies.offload_dots_saveable(
        offload_src="device", offload_dst="pinned_host"
    )


@functools.cache
def _offload_attention_proj() -> Callable[..., Any]:
    return save_and_offload_only_these_names_regex(
        names_which_can_be_saved=None,
        names_which_can_be_offloaded=RematRegexSavePatterns.SELF_ATTENTION.value,
        offload_src="device",
        offload_dst="pinned_host",
    )


def offload_dots_saveable_policy(*args, **kwargs):
    """Remat policy: offload matmul results (no batch dims) from device to pinned host memory.

    Args:
        *args: (primitive, *operands) as jax.checkpoint passes them.
        **kwargs: The primitive's params.

    Returns:
        The remat decision.
    """
    return _offload_dots()(*args, **kwargs)


def offload_attention_proj_policy(*args, **kwargs):
    """Remat policy: offload the attention projections and context to pinned host memory.

    Args:
        *args: (primitive, *operands) as jax.checkpoint passes them.
        **kwargs: The primitive's params.

    Returns:
        The remat decision.
    """
    return _offload_attention_proj()(*args, **kwargs)


def _chain(*modifiers: InstantiableConfig) -> ChainConfigModifier.Config:
    return ChainConfigModifier.default_config().set(config_modifiers=list(modifiers))


def _mesh(**axes: int) -> MeshShapeModifier.Config:
    return MeshShapeModifier.default_config().set(mesh_shape=mesh_shape_from_axes(**axes))


def _remat(policy: Any, *, prevent_cse: bool = False) -> RematSpecModifier.Config:
    return RematSpecModifier.default_config().set(
        remat_policies={
            "model.decoder.transformer.layer": RematSpec(prevent_cse=prevent_cse, policy=policy)
        }
    )


def _grad_acc(steps: int) -> GradientAccumulationModifier.Config:
    return GradientAccumulationModifier.default_config().set(grad_acc_steps=steps)


def _save_names(
    names: Optional[str], *, offload: bool = True, offloaded: Optional[str] = None
) -> FunctionConfigBase:
    return config_for_function(save_and_offload_only_these_names_regex).set(
        names_which_can_be_saved=names,
        names_which_can_be_offloaded=offloaded,
        offload_src="device" if offload else None,
        offload_dst="pinned_host" if offload else None,
    )


def _trn2_modifiers(model_size: str, *, version: Version) -> list[InstantiableConfig]:
    """The module and partition-spec modifications of Fuji on AWS Trainium2 (AXLearn's)."""
    modifiers = [
        ModuleConfigModifier.default_config().set(
            target_config="model.decoder.transformer",
            modification=StackedTransformerLayer.default_config(),
        )
    ]
    if version == Version.V3 or (model_size == "70B" and version != Version.V1):
        modifiers.append(
            ModuleConfigModifier.default_config().set(
                target_config="model.decoder.transformer.layer.self_attention.attention."
                "input_linear.input_linear",
                modification=GroupedQKVLinear.default_config(),
            )
        )
    norm = {
        "input_partition_spec": (("data", "fsdp"), "model", None),
        "output_partition_spec": (("data", "fsdp"), None, None),
    }
    modifiers.append(
        PartitionSpecModifier.default_config().set(
            partition_specs={
                # Vocab-parallel embeddings (Megatron-LM).
                "model.decoder.emb.token_emb": {
                    "param_partition_spec": ("model", ("expert", "fsdp", "seq")),
                    "input_partition_spec": (("data", "fsdp"), None),
                    "output_partition_spec": (("data", "fsdp"), None, None),
                    "embedding_partition_spec": ("model", None),
                },
                # Sequence-parallel norms.
                "model.decoder.transformer.layer.self_attention.norm": dict(norm),
                "model.decoder.transformer.layer.feed_forward.norm": dict(norm),
                "model.decoder.output_norm": dict(norm),
                "model.decoder.transformer.layer.feed_forward.linear2": {
                    "output_partition_spec": (("data", "fsdp"), None, None),
                },
            }
        )
    )
    if model_size in ("70B", "8B"):
        modifiers.append(
            PartitionSpecModifier.default_config().set(
                partition_specs={
                    "model.decoder.lm_head": {
                        "param_partition_spec": ("model", ("expert", "fsdp", "seq")),
                    },
                }
            )
        )
    return modifiers


_TRN2 = "neuron-(trn2|trn2n).48xlarge-64"


def _v4_v5e_rules() -> tuple:
    """The TPU v4 and v5e rules that 7B and 8B share."""
    return (
        ("tpu-v4-(1024|2048)", mesh_shape_from_axes(data=-1, fsdp=16)),
        (
            "tpu-v5litepod-256",
            _chain(_mesh(data=-1, fsdp=256), _remat(offload_dots_saveable_policy), _grad_acc(4)),
        ),
        (
            "tpu-v5litepod-256-2",
            _chain(_mesh(data=-1, fsdp=256), _remat(offload_dots_saveable_policy)),
        ),
        (
            "tpu-v5litepod-256-4",
            _chain(_mesh(data=-1, fsdp=256), _remat(jax_remat_policies.dots_saveable)),
        ),
    )


def _mesh_rules(model_size: str, *, version: Version) -> tuple:
    """AXLearn's mesh rules of a size (instance-type regex -> mesh shape or modifier)."""
    trn2 = _trn2_modifiers(model_size, version=version)
    if model_size in ("1B", "3B"):
        extra = [_grad_acc(4)] if model_size == "3B" else []
        return ((_TRN2, _chain(_mesh(fsdp=-1, model=4), *trn2, *extra)),)
    if model_size == "7B":
        return (
            *_v4_v5e_rules(),
            (
                "tpu-v6e-256-(2|4|8)",
                _chain(
                    _mesh(data=-1, fsdp=256),
                    _remat(offload_attention_proj_policy),
                    V6eFlashConfigModifier.default_config(),
                ),
            ),
            (
                "tpu-v5p-.*",
                _chain(
                    _mesh(data=-1, fsdp=64),
                    _remat(
                        config_for_function(combine_remat_policies).set(
                            policy_1=save_or_offload_flash_attention_policy(),
                            policy_2=jax_remat_policies.dots_saveable,
                        )
                    ),
                ),
            ),
            (
                "gpu-(p5.48xlarge|p4de.24xlarge)-(256|512|1024)",
                mesh_shape_from_axes(data=-1, fsdp=8),
            ),
            (
                "gpu-(a3-highgpu-8g|a3-megagpu-8g|a3-ultragpu-8g)-(256|512|1024)",
                _chain(_mesh(data=-1, fsdp=8)),
            ),
            (
                "gpu-(a4-highgpu-8g)-(256|512|1024)",
                _chain(
                    _mesh(data=-1, fsdp=8),
                    FlashBlockSizeModifier.default_config().set(gpu_block_size=64),
                ),
            ),
            (_TRN2, _chain(_mesh(fsdp=-1, model=4), *trn2)),
        )
    if model_size == "8B":
        return (
            *_v4_v5e_rules(),
            ("tpu-v5p-.*", mesh_shape_from_axes(data=-1, fsdp=8)),
            (
                "gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g|a3-megagpu-8g|a3-ultragpu-8g|"
                "a4-highgpu-8g)-(256|512|1024)",
                mesh_shape_from_axes(data=-1, fsdp=8),
            ),
            (_TRN2, _chain(_mesh(fsdp=-1, model=4), *trn2)),
        )
    if model_size == "70B":
        return (
            (
                "tpu-v5litepod-256-4",
                _chain(_mesh(data=-1, fsdp=256), _remat(offload_dots_saveable_policy)),
            ),
            (
                "tpu-v5p-.*",
                _chain(
                    _mesh(fsdp=-1),
                    _remat(_save_names(".*[kqv]_proj", offloaded=".*input")),
                ),
            ),
            (
                "tpu-7x-128",
                _chain(
                    _mesh(data=-1, fsdp=128),
                    V7xFlashConfigModifier.default_config().set(tpu_block_size=2048),
                    SplashAttentionConfigModifier.default_config().set(
                        splash_block_q=4096, splash_block_kv_compute=1024
                    ),
                    _remat(_save_names(".*[kqv]_proj", offloaded=".*input")),
                ),
            ),
            (
                "tpu-7x-256",
                _chain(
                    _mesh(data=-1, fsdp=128),
                    V7xFlashConfigModifier.default_config().set(tpu_block_size=2048),
                    SplashAttentionConfigModifier.default_config().set(
                        splash_block_q=4096, splash_block_kv_compute=1024
                    ),
                    _remat(_save_names(None, offloaded=".*input")),
                ),
            ),
            (
                "tpu-v6e-256-(4|8)",
                _chain(
                    _mesh(data=-1, fsdp=256),
                    _remat(_save_names(None, offloaded=".*[kqv]_proj|.*input")),
                    V6eFlashConfigModifier.default_config(),
                ),
            ),
            (
                "tpu-v6e-256",
                _chain(
                    _mesh(data=-1, fsdp=256),
                    _remat(offload_attention_proj_policy),
                    V6eFlashConfigModifier.default_config(),
                    _grad_acc(4),
                ),
            ),
            ("gpu-(p5.48xlarge|p4de.24xlarge)-(512|1024)", mesh_shape_from_axes(data=-1, fsdp=128)),
            (
                "gpu-(a3-highgpu-8g|a3-megagpu-8g|a3-ultragpu-8g)-(256|512|1024)",
                _chain(_mesh(data=-1, fsdp=64)),
            ),
            (
                "gpu-(a4-highgpu-8g)-(256|512|1024)",
                _chain(
                    _mesh(data=-1, fsdp=16),
                    FlashBlockSizeModifier.default_config().set(gpu_block_size=64),
                ),
            ),
            (
                _TRN2,
                _chain(
                    _mesh(fsdp=-1, model=4),
                    _remat(
                        _save_names(
                            "|".join(
                                [
                                    RematRegexSavePatterns.QKV_PROJ.value,
                                    RematRegexSavePatterns.LINEAR1_X.value,
                                ]
                            ),
                            offload=False,
                        ),
                        prevent_cse=True,
                    ),
                    *trn2,
                ),
            ),
        )
    if model_size == "405B":
        return (
            (
                "tpu-v5p-.*",
                _chain(_mesh(fsdp=-1), _remat(_save_names(None, offloaded=".*input"))),
            ),
            (
                "tpu-7x-.*",
                _chain(
                    _mesh(data=-1, fsdp=256),
                    V7xFlashConfigModifier.default_config().set(tpu_block_size=2048),
                    SplashAttentionConfigModifier.default_config().set(
                        splash_block_kv_compute=256,
                        splash_block_kv_dkv_compute=256,
                        splash_block_q_dkv=1024,
                    ),
                    _remat(_save_names(None, offloaded=".*input")),
                ),
            ),
        )
    return ()


# Model shapes: (num_layers, hidden_dim, num_heads, ffn_dim, shared_lm_head, peak_lr).
_SHAPES = {
    "1B": (16, 2048, 32, 8192, True, 3e-4),
    "3B": (28, 3072, 24, 8192, True, 3e-4),
    "7B": (32, 128 * 32, 32, None, True, 3e-4),
    "8B": (32, 128 * 32, 32, "3.5x", False, 3e-4),
    "70B": (80, 128 * 64, 64, "3.5x", False, 1.5e-4),
    "405B": (126, 16384, 128, 53248, False, 1.5e-4),
}


def get_trainer_kwargs(
    model_size: str,
    *,
    vocab_size: int,
    version: Version,
    flash_attention: bool = False,
) -> dict[str, Any]:
    """The `get_trainer_config_fn` kwargs (plus max_sequence_length) of a Fuji size.

    Args:
        model_size: One of MODEL_SIZES (and in TOTAL_TOKENS[version]).
        vocab_size: The vocabulary size.
        version: The Fuji version.
        flash_attention: Whether to use FlashAttention.

    Returns:
        The kwargs.

    Raises:
        NotImplementedError: For a size the version does not have.
    """
    if version not in TOTAL_TOKENS or model_size not in TOTAL_TOKENS[version]:
        sizes = {v.name: sorted(t) for v, t in TOTAL_TOKENS.items()}
        raise NotImplementedError(
            f"Unknown Fuji model size {model_size!r} for {version}; sizes by version: {sizes}"
        )
    tokens_per_batch = TOKENS_PER_BATCH[version]
    max_step = TOTAL_TOKENS[version][model_size] // tokens_per_batch
    max_sequence_length = MAX_SEQUENCE_LENGTH[version]
    rope_theta = ROPE_THETA[version]
    num_kv_heads = 8 if version in (Version.V3, Version.V3_TIKTOKEN) else None
    if model_size == "test":
        kwargs = dict(
            model_kwargs=dict(
                num_layers=4,
                hidden_dim=8,
                ffn_dim=scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=16),
                num_heads=4,
                num_kv_heads=2,
                vocab_size=32,
                rope_theta=rope_theta,
                shared_lm_head=True,
                flash_attention=flash_attention,
            ),
            learner_kwargs=dict(peak_lr=6e-4, weight_decay=0.01),
            max_sequence_length=64,
            train_batch_size=32,
            eval_batch_size=32,
            max_step=3000,
            eval_every_n_steps=1500,
            save_every_n_steps=500,
            mesh_shape=mesh_shape_from_axes(data=-1),
        )
    else:
        num_layers, hidden_dim, num_heads, ffn_dim, shared, peak_lr = _SHAPES[model_size]
        if model_size in ("70B", "405B"):
            num_kv_heads = None if version == Version.V1 else 8
        if ffn_dim == "3.5x":
            ffn_dim = scaled_hidden_dim(scale=3.5, round_up_to_multiples_of=256)
        model_kwargs = dict(
            num_layers=num_layers,
            hidden_dim=hidden_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            rope_theta=rope_theta,
            shared_lm_head=shared,
            flash_attention=flash_attention,
        )
        if ffn_dim is not None:
            model_kwargs["ffn_dim"] = ffn_dim
        kwargs = dict(
            model_kwargs=model_kwargs,
            learner_kwargs=dict(peak_lr=peak_lr, weight_decay=0.1),
            max_sequence_length=max_sequence_length,
            train_batch_size=tokens_per_batch // max_sequence_length,
            max_step=max_step,
            mesh_shape=mesh_shape_from_axes(
                **(dict(fsdp=-1) if model_size in ("70B", "405B") else dict(data=-1, fsdp=8))
            ),
            mesh_rules=_mesh_rules(model_size, version=version),
        )
    model_kwargs = kwargs.pop("model_kwargs")
    model_kwargs.setdefault("vocab_size", vocab_size)
    if version == Version.V3_TIKTOKEN:
        model_kwargs.update(pad_token_id=TIKTOKEN_PAD_ID, eos_token_id=TIKTOKEN_EOS_ID)
    kwargs["model_cfg"] = model_config(**model_kwargs)
    kwargs["learner_cfg"] = adamw_decoupled_learner_config(
        max_step=kwargs["max_step"], **kwargs.pop("learner_kwargs")
    )
    return kwargs


def model_config(
    *,
    num_layers: int,
    hidden_dim: int,
    num_heads: int,
    num_kv_heads: Optional[int],
    vocab_size: int,
    rope_theta: float,
    shared_lm_head: bool,
    dropout_rate: float = 0.0,
    ffn_dim: Optional[Union[int, FunctionConfigBase]] = None,
    flash_attention: bool = False,
    stack_cfg: Optional[InstantiableConfig] = None,
    pad_token_id: Optional[int] = None,
    eos_token_id: Optional[int] = None,
) -> causal_lm.Model.Config:
    """A Fuji model config (AXLearn's `fuji.model_config`).

    Args:
        num_layers: Transformer layers.
        hidden_dim: Model dim.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (grouped-query attention); None: multi-head attention.
        vocab_size: Vocabulary size.
        rope_theta: RoPE base.
        shared_lm_head: Whether the LM head is the token embedding.
        dropout_rate: Dropout rate.
        ffn_dim: Feed-forward dim or function (default: 8/3 x dim, a multiple of 256).
        flash_attention: Whether to use FlashAttention.
        stack_cfg: The stack (default: RepeatedTransformerLayer).
        pad_token_id: Optional padding id.
        eos_token_id: Optional end-of-sequence id.

    Returns:
        The model config.
    """
    if ffn_dim is None:
        ffn_dim = scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=256)
    if num_kv_heads:
        attention_cfg = GroupedQueryAttention.default_config()
        input_linear = FusedGroupedQKVLinear.default_config().set(num_kv_heads=num_kv_heads)
    else:
        attention_cfg = MultiheadAttention.default_config()
        input_linear = FusedQKVLinear.default_config()
    qkv_linear = RoFormerQKVLinear.default_config().set(
        input_linear=input_linear, rotary_value=False
    )
    qkv_linear.rope_pos_emb_layer.theta = rope_theta
    return common_model_config(
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        vocab_size=vocab_size,
        stack_cfg=stack_cfg if stack_cfg is not None else RepeatedTransformerLayer.default_config(),
        activation_fn=("nn.silu", "linear"),
        ffn_dim=ffn_dim,
        normalization=RMSNorm.default_config().set(eps=1e-5, forward_dtype=None),
        dropout_rate=dropout_rate,
        emb_cfg=TransformerTextEmbeddings.default_config().set(pos_emb=None),
        lm_head_cfg=None if shared_lm_head else LmHead.default_config(),
        attention_cfg=flash_attention_config() if flash_attention else attention_cfg,
        attention_qkv_linear=qkv_linear,
        attention_kv_cache=KVCache.default_config().set(cache_dtype=STEP_DTYPE),
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
    )


def _single_host(base: TrainerConfigFn, *, divisor: int) -> TrainerConfigFn:
    """A variant of `base` with every input's logical batch divided by `divisor`."""

    def config_fn():
        cfg = base().clone()
        cfg.input.input_dispatcher.global_logical_batch_size //= divisor
        for evaler in cfg.evalers.values():
            evaler.input.input_dispatcher.global_logical_batch_size //= divisor
        return cfg

    return config_fn


# Instance types whose mesh rules the "-fp8" configs extend with FP8ConfigModifier (GPUs with
# fp8 matmuls: H100, H200, B200 and A100 hosts, as AXLearn lists them).
FP8_ACCELERATORS = (
    "a3-highgpu-8g",
    "a3-megagpu-8g",
    "a3-ultragpu-8g",
    "a4-highgpu-8g",
    "p5.48xlarge",
    "p4de.24xlarge",
)

# The amax history length of the "-fp8" configs.
FP8_AMAX_HISTORY_LENGTH = 128


def _fp8(base: TrainerConfigFn) -> TrainerConfigFn:
    """AXLearn's "-fp8" variant of `base`: FP8ConfigModifier appended to its GPU mesh rules.

    Every mesh rule whose selector names one of FP8_ACCELERATORS and whose value is a
    ChainConfigModifier gets `FP8ConfigModifier(fp8_amax_history_length=128)` appended; fp8 then
    applies when `--mesh_selector` picks such a rule. As in AXLearn, a matching rule that is a
    plain mesh shape (no chain) is left as it is, and configs without such rules (e.g. 405B)
    equal their base.
    """

    def config_fn():
        cfg = base().clone()
        for selector, rule in cfg.mesh_rules:
            if isinstance(rule, ChainConfigModifier.Config) and any(
                accelerator in selector for accelerator in FP8_ACCELERATORS
            ):
                rule.config_modifiers.append(
                    FP8ConfigModifier.default_config().set(
                        fp8_amax_history_length=FP8_AMAX_HISTORY_LENGTH
                    )
                )
        return cfg

    return config_fn


def _golden_run_test(base: TrainerConfigFn) -> TrainerConfigFn:
    """AXLearn's golden-run variant of the test size: 5 steps at a large constant rate."""

    def config_fn():
        cfg = base()
        cfg.max_step = 5
        cfg.learner.optimizer.args[1].learning_rate = 0.3
        cfg.learner.optimizer.args[1].update_schedule = 1
        cfg.vlog = 1
        return cfg

    return config_fn


def trainer_configs(
    train_input_source: SourceBuilder, eval_input_sources: SourceBuilder
) -> dict[str, TrainerConfigFn]:
    """{config name: TrainerConfigFn} of the Fuji family for the given input sources.

    Args:
        train_input_source: (vocab_size, max_sequence_length) -> training source config.
        eval_input_sources: (vocab_size, max_sequence_length) -> {name: eval source config}.

    Returns:
        The configs, named as AXLearn names them (see the module docstring).
    """
    config_map = {}
    versions = (Version.V1, Version.V2, Version.V3, Version.V3_TIKTOKEN)
    for version, model_size, flash in itertools.product(versions, MODEL_SIZES, (True, False)):
        if model_size not in TOTAL_TOKENS[version]:
            continue
        vocab_size = VOCAB_SIZE[version]
        name = make_config_name(
            arch="fuji",
            model_size=model_size,
            version=f"v{version.value}",
            suffix="-flash" if flash else "",
        )
        kwargs = get_trainer_kwargs(
            model_size, vocab_size=vocab_size, version=version, flash_attention=flash
        )
        max_sequence_length = kwargs.pop("max_sequence_length")
        sources = dict(vocab_size=vocab_size, max_sequence_length=max_sequence_length)
        config_map[name] = get_trainer_config_fn(
            train_input_source=train_input_source(**sources),
            evalers=evaler_config_dict(eval_input_sources(**sources)),
            **kwargs,
        )
        if model_size != "test":
            config_map[f"{name}-fp8"] = _fp8(config_map[name])
        if model_size == "test":
            golden = make_config_name(
                arch="fuji", model_size="golden-run-test", version=f"v{version.value}"
            )
            config_map[golden] = _golden_run_test(config_map[name])
        if model_size in ("1B", "3B", "7B", "8B"):
            divisor = 128
            config_map[f"{name}-single-host"] = _single_host(config_map[name], divisor=divisor)
            config_map[f"{name}-fp8-single-host"] = _single_host(
                config_map[f"{name}-fp8"], divisor=divisor
            )
    return config_map


def named_trainer_configs() -> dict[str, TrainerConfigFn]:
    """This module's named configs: our `fuji-tiny-v3` (AXLearn's sizes are in c4_trainer)."""
    return tiny_trainer_configs(model_config)
