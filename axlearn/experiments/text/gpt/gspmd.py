"""GSPMD's pipelined 16B transformer (AXLearn's `axlearn.experiments.text.gpt.gspmd`).

The 16B configuration of the GSPMD paper (https://arxiv.org/abs/2105.04663, its table 4 "2x16x8":
2 pipeline stages x 16-way data x 8-way model): 64 layers of dim 4096 with 64 heads
(grouped-query attention with 8 KV heads and RoPE, as AXLearn's current config), a 4x ReLU
feed-forward, RMSNorm, a 32K vocabulary and 1024-token sequences, trained with Adafactor on
batches of 512 for 100K steps. The 64 layers are a `PipelinedTransformerLayer` of 2 stages and
16 microbatches (GPipe schedule); the mesh is hybrid: 8-way "model" within a slice, 2-way
"pipeline" across slices, data over the rest. These configs are for performance testing.

`trainer_configs(train_input_source, eval_input_sources)` returns them under AXLearn's names
`gspmd-16B-2x16x8` and `gspmd-16B-2x16x8-stream` (the same with `pipeline.StreamSchedule`);
`axlearn.experiments.text.gpt.c4_trainer` registers them with C4 inputs.
"""

from __future__ import annotations

from typing import Any

from axlearn.common.attention import (
    FusedGroupedQKVLinear,
    GroupedQueryAttention,
    KVCache,
    PipelinedTransformerLayer,
    RepeatedTransformerLayer,
    RoFormerQKVLinear,
)
from axlearn.common.base_model import BaseModel
from axlearn.common.config import InstantiableConfig, TrainerConfigFn, config_for_function
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.layers import RMSNorm
from axlearn.common.learner import Learner
from axlearn.common.optimizers import adafactor_optimizer
from axlearn.common.pipeline import GPipeSchedule, StreamSchedule
from axlearn.common.schedule import adafactor, adafactor_decay_rate
from axlearn.common.utils import HybridMeshShape
from axlearn.experiments.text.gpt.common import (
    STEP_DTYPE,
    SourceBuilder,
    evaler_config_dict,
    get_trainer_config_fn,
    make_config_name,
    mesh_shape_from_axes,
    scaled_hidden_dim,
    update_model_remat_config,
)
from axlearn.experiments.text.gpt.common import model_config as common_model_config

VOCAB_SIZE = 32 * 1024  # The vocabulary size (C4's 32K sentencepiece model).
MAX_SEQUENCE_LENGTH = 1024  # Tokens per sequence.
MAX_STEP = 100_000  # Training steps.


def model_config(schedule: InstantiableConfig) -> BaseModel.Config:
    """The 16B model with a 2-stage, 16-microbatch pipeline of the given schedule.

    Args:
        schedule: The pipeline schedule config (e.g. `GPipeSchedule.default_config()`).

    Returns:
        The model config.
    """
    emb_cfg = TransformerTextEmbeddings.default_config()
    # The token embedding is sharded over "pipeline" (its batch dim) and "model".
    emb_cfg.token_emb.param_partition_spec = ("pipeline", "model")
    stack_cfg = PipelinedTransformerLayer.default_config().set(num_stages=2, num_microbatches=16)
    stack_cfg.pipeline.schedule = schedule
    # Grouped-query attention (8 KV heads) with RoPE (theta 5e5), as AXLearn's current config.
    qkv_linear = RoFormerQKVLinear.default_config().set(
        input_linear=FusedGroupedQKVLinear.default_config().set(num_kv_heads=8),
        rotary_value=False,
    )
    qkv_linear.rope_pos_emb_layer.theta = 5e5
    cfg = common_model_config(
        num_layers=64,
        hidden_dim=128 * 32,
        num_heads=64,
        stack_cfg=stack_cfg,
        vocab_size=VOCAB_SIZE,
        ffn_dim=scaled_hidden_dim(4),
        activation_fn="nn.relu",
        normalization=RMSNorm.default_config().set(forward_dtype=None),
        emb_cfg=emb_cfg,
        attention_cfg=GroupedQueryAttention.default_config(),
        attention_qkv_linear=qkv_linear,
        attention_kv_cache=KVCache.default_config().set(cache_dtype=STEP_DTYPE),
    )
    transformer = cfg.decoder.transformer
    # Each layer saves its attention projections and context (as the repeated stacks do).
    update_model_remat_config(
        stack_cfg=RepeatedTransformerLayer.default_config(), layer_cfg=transformer.layer
    )
    # The stage's layer is `transformer.layer` (PipelinedTransformerLayer sets it).
    transformer.stage.layer = None
    return cfg


def _trainer_kwargs() -> dict[str, dict[str, Any]]:
    """{config name: get_trainer_config_fn kwargs}."""
    learner_cfg = Learner.default_config().set(
        optimizer=config_for_function(adafactor_optimizer).set(
            learning_rate=config_for_function(adafactor).set(scale=1e-3),
            b1=0.9,
            b2=config_for_function(adafactor_decay_rate),
            multiply_by_parameter_scale=False,
            clipping_threshold=5,
            weight_decay=1e-3,
            weight_decay_scale_by_learning_rate_exponent=1,
        )
    )
    common = dict(
        learner_cfg=learner_cfg,
        train_batch_size=512,
        max_step=MAX_STEP,
        mesh_shape=HybridMeshShape(
            ici_mesh_shape=mesh_shape_from_axes(data=-1, model=8),
            dcn_mesh_shape=mesh_shape_from_axes(data=-1, pipeline=2),
        ),
    )
    return {
        make_config_name("gspmd", "16B", suffix="-2x16x8"): dict(
            model_cfg=model_config(GPipeSchedule.default_config()), **common
        ),
        # The same with the streaming schedule.
        make_config_name("gspmd", "16B", suffix="-2x16x8-stream"): dict(
            model_cfg=model_config(StreamSchedule.default_config()), **common
        ),
    }


def trainer_configs(
    train_input_source: SourceBuilder, eval_input_sources: SourceBuilder
) -> dict[str, TrainerConfigFn]:
    """{config name: TrainerConfigFn} of the GSPMD configs for the given input sources.

    Args:
        train_input_source: (vocab_size, max_sequence_length) -> training source config.
        eval_input_sources: (vocab_size, max_sequence_length) -> {name: eval source config}.

    Returns:
        The configs, named as AXLearn names them.
    """
    sources = dict(vocab_size=VOCAB_SIZE, max_sequence_length=MAX_SEQUENCE_LENGTH)
    return {
        name: get_trainer_config_fn(
            train_input_source=train_input_source(**sources),
            evalers=evaler_config_dict(eval_input_sources(**sources)),
            **kwargs,
        )
        for name, kwargs in _trainer_kwargs().items()
    }
