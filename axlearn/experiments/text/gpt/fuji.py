"""The Fuji family (AXLearn's LLaMA-style GPTs), version 3, built from AXLearn-style builders.

Configs: `fuji-1B-v3`, `fuji-3B-v3`, `fuji-7B-v3`, `fuji-70B-v3` (C4 data, a 128256-token
sentencepiece vocabulary, 8192-token sequences, 4M tokens per batch, 15T tokens) and
`fuji-tiny-v3`, a 2-layer Fuji that trains here on the embedded corpus in minutes:

    python -m axlearn.common.launch_trainer_main --module=text.gpt.fuji --config=fuji-tiny-v3 \\
        --trainer_dir=/tmp/fuji-tiny --jax_backend=cpu

Every model is a pre-norm RMSNorm decoder with RoPE (theta 5e5) grouped-query attention (8 KV
heads, fused QKV projection), a SwiGLU feed-forward and decoupled AdamW. Sizes follow AXLearn's
`fuji.py` (parameters counted from abstract shapes; `experiments/test_fuji.py` checks them
against AXLearn's published `_init.txt` parameter shapes):

| config | layers | dim | heads | ffn | LM head | parameters |
|---|---|---|---|---|---|---|
| fuji-1B-v3 | 16 | 2048 | 32 | 8192 | tied | 1,235,814,400 |
| fuji-3B-v3 | 28 | 3072 | 24 | 8192 | tied | 3,212,749,824 |
| fuji-7B-v3 | 32 | 4096 | 32 | 11008 (8/3, multiple of 256) | tied | 6,196,301,824 |
| fuji-70B-v3 | 80 | 8192 | 64 | 28672 (3.5x) | untied | 70,553,706,496 |

The C4 data set and the 128k vocabulary are not shipped: use the large configs for review
(`axlearn config dump`) or train them on synthetic data with `--data_dir=FAKE`.
"""

from __future__ import annotations

from typing import Any, Optional

from axlearn.common import causal_lm
from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    GroupedQueryAttention,
    RoFormerQKVLinear,
    StackedTransformerLayer,
)
from axlearn.common.config import config_for_function
from axlearn.common.decoder import LmHead
from axlearn.common.embedded_data import DATASET_NAME
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.layers import RMSNorm
from axlearn.experiments.text.common import embedded_vocab_config, vocab
from axlearn.experiments.text.gpt.common import (
    REPLACE_NEWLINES_WITH,
    STEP_DTYPE,
    TrainerConfigFn,
    adamw_decoupled_learner_config,
    evaler_config_dict,
    flash_attention_config,
    get_trainer_config_fn,
    make_config_name,
    mesh_shape_from_axes,
    scaled_hidden_dim,
    tfds_input,
)
from axlearn.experiments.text.gpt.common import model_config as common_model_config

MODEL_SIZES = ("tiny", "1B", "3B", "7B", "70B")
VERSION = "v3"
VOCAB_SIZE = 128256
MAX_SEQUENCE_LENGTH = 8192
ROPE_THETA = 5e5
TOTAL_TOKENS = 15 * (1024**4)
TOKENS_PER_BATCH = 4 * (1024**2)
NUM_KV_HEADS = 8
# The (unshipped) data and vocabulary of the large configs.
C4_DATASET = "c4/en:3.0.1"
VOCAB_NAME = "bpe_128k_c4.model"
# The tiny config's vocabulary (the embedded corpus's sentencepiece model).
TINY_VOCAB_SIZE = 4096


def model_config(
    *,
    num_layers: int,
    hidden_dim: int,
    num_heads: int,
    num_kv_heads: int,
    vocab_size: int,
    rope_theta: float,
    shared_lm_head: bool,
    dropout_rate: float = 0.0,
    ffn_dim: Optional[Any] = None,
    flash_attention: bool = False,
    stack_cfg: Optional[Any] = None,
) -> causal_lm.Model.Config:
    """A Fuji model config (AXLearn's `fuji.model_config`).

    Args:
        num_layers: Transformer layers.
        hidden_dim: Model dim.
        num_heads: Query heads.
        num_kv_heads: Key/value heads (grouped-query attention).
        vocab_size: Vocabulary size.
        rope_theta: RoPE base.
        shared_lm_head: Whether the LM head is the token embedding.
        dropout_rate: Dropout rate.
        ffn_dim: Feed-forward dim or function (default: 8/3 x dim, a multiple of 256).
        flash_attention: Whether to use FlashAttention.
        stack_cfg: The stack (default: RepeatedTransformerLayer).

    Returns:
        The model config.
    """
    if ffn_dim is None:
        ffn_dim = scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=256)
    qkv = FusedGroupedQKVLinear.default_config().set(num_kv_heads=num_kv_heads)
    qkv.cache_dtype = STEP_DTYPE
    rope = RoFormerQKVLinear.default_config().set(
        cache_dtype=STEP_DTYPE, input_linear=qkv, rotary_value=False
    )
    rope.rope_pos_emb_layer.theta = rope_theta
    return common_model_config(
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        vocab_size=vocab_size,
        stack_cfg=stack_cfg,
        activation_fn=("nn.silu", "linear"),
        ffn_dim=ffn_dim,
        normalization=RMSNorm.default_config().set(eps=1e-5, forward_dtype=None),
        dropout_rate=dropout_rate,
        emb_cfg=TransformerTextEmbeddings.default_config().set(pos_emb=None),
        lm_head_cfg=None if shared_lm_head else LmHead.default_config(),
        attention_cfg=(
            flash_attention_config() if flash_attention else GroupedQueryAttention.default_config()
        ),
        attention_qkv_linear=rope,
    )


def get_trainer_kwargs(model_size: str, *, flash_attention: bool = False) -> dict[str, Any]:
    """The get_trainer_config_fn kwargs (plus max_sequence_length) of a Fuji v3 size.

    Args:
        model_size: One of MODEL_SIZES.
        flash_attention: Whether to use FlashAttention.

    Returns:
        The kwargs.

    Raises:
        NotImplementedError: For an unknown size.
    """
    max_step = TOTAL_TOKENS // TOKENS_PER_BATCH
    train_batch_size = TOKENS_PER_BATCH // MAX_SEQUENCE_LENGTH
    common = dict(
        vocab_size=VOCAB_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        rope_theta=ROPE_THETA,
        flash_attention=flash_attention,
    )
    if model_size == "tiny":
        kwargs = dict(
            model_kwargs=dict(
                common,
                num_layers=2,
                hidden_dim=64,
                num_heads=4,
                num_kv_heads=2,
                vocab_size=TINY_VOCAB_SIZE,
                ffn_dim=scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=16),
                shared_lm_head=True,
                # Unrolled layers compile faster than a scanned stack on CPU.
                stack_cfg=StackedTransformerLayer.default_config(),
            ),
            learner_kwargs=dict(peak_lr=3e-3, weight_decay=0.01, lr_warmup_steps=20),
            max_sequence_length=128,
            train_batch_size=16,
            eval_batch_size=16,
            max_step=200,
            eval_every_n_steps=100,
            save_every_n_steps=100,
            mesh_shape=mesh_shape_from_axes(data=-1),
            mesh_rules=(("cpu-fsdp", mesh_shape_from_axes(fsdp=-1)),),
        )
    elif model_size == "1B":
        kwargs = dict(
            model_kwargs=dict(
                common,
                num_layers=16,
                hidden_dim=2048,
                num_heads=32,
                ffn_dim=8192,
                shared_lm_head=True,
            ),
            learner_kwargs=dict(peak_lr=3e-4, weight_decay=0.1),
            mesh_shape=mesh_shape_from_axes(data=-1, fsdp=8),
            mesh_rules=(
                ("neuron-(trn2|trn2n).48xlarge-64", mesh_shape_from_axes(fsdp=-1, model=4)),
            ),
        )
    elif model_size == "3B":
        kwargs = dict(
            model_kwargs=dict(
                common,
                num_layers=28,
                hidden_dim=3072,
                num_heads=24,
                ffn_dim=8192,
                shared_lm_head=True,
            ),
            learner_kwargs=dict(peak_lr=3e-4, weight_decay=0.1),
            mesh_shape=mesh_shape_from_axes(data=-1, fsdp=8),
            mesh_rules=(
                ("neuron-(trn2|trn2n).48xlarge-64", mesh_shape_from_axes(fsdp=-1, model=4)),
            ),
        )
    elif model_size == "7B":
        kwargs = dict(
            model_kwargs=dict(
                common, num_layers=32, hidden_dim=128 * 32, num_heads=32, shared_lm_head=True
            ),
            learner_kwargs=dict(peak_lr=3e-4, weight_decay=0.1),
            mesh_shape=mesh_shape_from_axes(data=-1, fsdp=8),
            mesh_rules=(
                ("tpu-v4-(1024|2048)", mesh_shape_from_axes(data=-1, fsdp=16)),
                ("tpu-v5litepod-256", mesh_shape_from_axes(data=-1, fsdp=256)),
                ("tpu-v5p-.*", mesh_shape_from_axes(data=-1, fsdp=8)),
                (
                    "gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-(256|512|1024)",
                    mesh_shape_from_axes(data=-1, fsdp=8),
                ),
                ("neuron-(trn2|trn2n).48xlarge-64", mesh_shape_from_axes(fsdp=-1, model=4)),
                ("neuron-(trn1|trn1n).32xlarge-64", mesh_shape_from_axes(fsdp=-1, model=8)),
            ),
        )
    elif model_size == "70B":
        kwargs = dict(
            model_kwargs=dict(
                common,
                num_layers=80,
                hidden_dim=128 * 64,
                num_heads=64,
                ffn_dim=scaled_hidden_dim(scale=3.5, round_up_to_multiples_of=256),
                shared_lm_head=False,
            ),
            learner_kwargs=dict(peak_lr=1.5e-4, weight_decay=0.1),
            mesh_shape=mesh_shape_from_axes(fsdp=-1),
            mesh_rules=(
                ("tpu-v5litepod-256-4", mesh_shape_from_axes(data=-1, fsdp=256)),
                (
                    "gpu-(p5.48xlarge|p4de.24xlarge)-(512|1024)",
                    mesh_shape_from_axes(data=-1, fsdp=128),
                ),
                ("neuron-(trn2|trn2n).48xlarge-64", mesh_shape_from_axes(fsdp=-1, model=4)),
            ),
        )
    else:
        raise NotImplementedError(f"Unknown Fuji model size {model_size!r}; use {MODEL_SIZES}")
    kwargs.setdefault("max_sequence_length", MAX_SEQUENCE_LENGTH)
    kwargs.setdefault("train_batch_size", train_batch_size)
    kwargs.setdefault("max_step", max_step)
    kwargs["model_cfg"] = model_config(**kwargs.pop("model_kwargs"))
    kwargs["learner_cfg"] = adamw_decoupled_learner_config(
        max_step=kwargs["max_step"], **kwargs.pop("learner_kwargs")
    )
    return kwargs


def _sources(model_size: str, max_sequence_length: int):
    """(train source, {eval name: source}) of a size: the embedded corpus for tiny, else C4."""
    if model_size == "tiny":
        kw = dict(
            dataset_name=DATASET_NAME,
            vocab_cfg=embedded_vocab_config(),
            max_sequence_length=max_sequence_length,
            train_shuffle_buffer_size=1024,
            replace_newlines_with=REPLACE_NEWLINES_WITH,
        )
        train = config_for_function(tfds_input).set(is_training=True, split="train", **kw)
        evals = {
            "validation": config_for_function(tfds_input).set(
                is_training=False, split="validation", **kw
            )
        }
        return train, evals
    kw = dict(
        dataset_name=C4_DATASET,
        vocab_cfg=config_for_function(vocab).set(sentencepiece_model_name=VOCAB_NAME),
        max_sequence_length=max_sequence_length,
        replace_newlines_with=REPLACE_NEWLINES_WITH,
    )
    train = config_for_function(tfds_input).set(is_training=True, split="train", **kw)
    evals = {
        "c4_validation": config_for_function(tfds_input).set(
            is_training=False, split="validation", **kw
        )
    }
    return train, evals


def trainer_configs() -> dict[str, TrainerConfigFn]:
    """{config name: TrainerConfigFn} of the Fuji v3 family."""
    configs = {}
    for model_size in MODEL_SIZES:
        kwargs = get_trainer_kwargs(model_size)
        max_sequence_length = kwargs.pop("max_sequence_length")
        train, evals = _sources(model_size, max_sequence_length)
        name = make_config_name(arch="fuji", model_size=model_size, version=VERSION)
        configs[name] = get_trainer_config_fn(
            train_input_source=train, evalers=evaler_config_dict(evals), **kwargs
        )
    return configs


def named_trainer_configs() -> dict[str, TrainerConfigFn]:
    """The named trainer configs of this module."""
    return trainer_configs()
