"""Building blocks of GPT trainer configs, with AXLearn's names and signatures.

- Inputs: `tfds_input`, `mixture_train_input_source`, `tfds_read_config`.
- Model: `model_config` (a causal LM from layer-level choices), `scaled_hidden_dim`,
  `flash_attention_config`.
- Learner: `adamw_decoupled_learner_config`, `adastar_learner_config`,
  `mup_simple_adam_update_transformation`.
- Trainer: `get_trainer_config_fn` (per-feed batching through an `SpmdInputDispatcher`, inputs
  partitioned by `input_base.partition_by_path_rank`), `evaler_config_dict`,
  `mesh_shape_from_axes`, `make_config_name`, `update_model_remat_config`, `MESH_AXIS_NAMES`,
  `STEP_DTYPE`, `EVAL_EVERY_N_STEPS`, `SourceBuilder`.

The Fuji family (`axlearn/experiments/text/gpt/fuji.py`) is written against these builders.
(`model_builders.py` has the builders of our own experiments.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional, Protocol, Union

import jax.numpy as jnp
from jax.sharding import PartitionSpec

from axlearn.common import causal_lm, input_lm, input_tf_data, learner, optimizers, schedule
from axlearn.common.attention import (
    RepeatedTransformerLayer,
    TransformerLayer,
    build_remat_spec,
    set_double_shard_weights_config,
)
from axlearn.common.checkpointer import every_n_steps_and_last_policy
from axlearn.common.config import (
    ConfigOr,
    FunctionConfigBase,
    InstantiableConfig,
    config_for_function,
    maybe_instantiate,
    maybe_set_config,
)
from axlearn.common.decoder import Decoder
from axlearn.common.embedding import TransformerTextEmbeddings
from axlearn.common.evaler import ModelSummaryAccumulator, SpmdEvaler
from axlearn.common.evaler import every_n_steps_policy as eval_every_n_steps_policy
from axlearn.common.flash_attention.layer import FlashAttention
from axlearn.common.input_base import partition_by_path_rank
from axlearn.common.input_dispatch import SpmdInputDispatcher
from axlearn.common.input_processors import sample_from_datasets, with_processor
from axlearn.common.layers import set_bias_recursively, set_norm_recursively
from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer
from axlearn.common.trainer import SpmdTrainer
from axlearn.common.utils import HybridMeshShape
from axlearn.experiments.text.common import DataMixtureComponent, tfds_text_source
from axlearn.experiments.trainer_config_utils import TrainerConfigFn

# The dtype of train and eval steps (parameters stay float32).
STEP_DTYPE = jnp.bfloat16

# The logical mesh axes, from least to most communication intensive.
MESH_AXIS_NAMES = ("pipeline", "data", "expert", "fsdp", "seq", "model")

# Newlines are replaced with this piece for sentencepiece BPE vocabularies.
REPLACE_NEWLINES_WITH = "<n>"

# The default evaluation period (steps).
EVAL_EVERY_N_STEPS = 5_000


def tfds_input(
    *,
    is_training: bool,
    dataset_name: str,
    split: str,
    vocab_cfg: InstantiableConfig,
    max_sequence_length: int,
    train_shuffle_buffer_size: int = 1024 * 16,
    replace_newlines_with: str = "\n",
    packing: Optional[bool] = None,
    data_dir: Optional[str] = None,
) -> input_tf_data.BuildDatasetFn:
    """Returns a source of language-model examples from a TFDS text data set.

    Training: documents are shuffled, repeated, tokenized and concatenated-and-split into
    `max_sequence_length` pieces (or packed with segment ids when `packing`), then shuffled.
    Evaluation: each document is read once in strided windows (stride `max_sequence_length // 4`),
    every token scored once (see `input_lm.text_to_lm_eval_input`).

    Args:
        is_training: Whether the input is for training.
        dataset_name: The TFDS name, e.g. "python_docs:1.0.0" (the embedded data).
        split: The split, e.g. "train" or "test[:5000]".
        vocab_cfg: Config of a seqio vocabulary (e.g. `axlearn.experiments.text.common.vocab`).
        max_sequence_length: Tokens per example.
        train_shuffle_buffer_size: Document shuffle buffer when training.
        replace_newlines_with: Newlines become this piece before tokenizing ("<n>" for the
            sentencepiece BPE vocabularies).
        packing: Training only: pack documents with `input_segment_ids`/`input_positions` instead
            of concatenating them. None means False.
        data_dir: The TFDS data dir; None: see `input_tf_data.tfds_dataset`.

    Returns:
        A BuildDatasetFn.
    """
    source = config_for_function(tfds_text_source).set(
        dataset_name=dataset_name,
        split=split,
        train_shuffle_buffer_size=train_shuffle_buffer_size,
        data_dir=data_dir,
    )
    if is_training:
        processor = config_for_function(input_lm.text_to_lm_training_input).set(
            vocab_cfg=vocab_cfg,
            max_len=max_sequence_length,
            replace_newlines_with=replace_newlines_with,
            packing=bool(packing),
        )
    else:
        processor = config_for_function(input_lm.text_to_lm_eval_input).set(
            vocab_cfg=vocab_cfg,
            max_len=max_sequence_length,
            replace_newlines_with=replace_newlines_with,
            stride=max(1, max_sequence_length // 4),
        )
    return input_tf_data.with_processor(source=source, processor=processor, is_training=is_training)


def tfds_read_config() -> InstantiableConfig:
    """AXLearn's TFDS read config of training mixtures (1 file at a time, 8 parallel decodes).

    Returns:
        A config of `input_tf_data.tfds_read_config`.
    """
    return config_for_function(input_tf_data.tfds_read_config).set(
        read_parallelism=1, decode_parallelism=8
    )


def mixture_train_input_source(
    *,
    is_training: bool,
    vocab_cfg: InstantiableConfig,
    preprocessor: Union[InstantiableConfig, list[InstantiableConfig]],
    data_mixture_components: Union[InstantiableConfig, list[DataMixtureComponent]],
    max_sequence_length: int,
    replace_newlines_with: str = REPLACE_NEWLINES_WITH,
    fake_input_source_cfg: Optional[InstantiableConfig] = None,
) -> input_tf_data.BuildDatasetFn:
    """A training source sampling from several TFDS text data sets (AXLearn's mixture source).

    Each component's documents (read with a `64 * shuffle_buffer_size` shuffle buffer) go
    through its preprocessor (e.g. `input_lm.lm_text_preprocessor`, given `vocab_cfg`,
    `max_sequence_length` and `replace_newlines_with`); then examples are sampled from the
    processed components with the components' weights, so each example comes from one source.

    Args:
        is_training: Whether the input is for training.
        vocab_cfg: Config of the seqio vocabulary.
        preprocessor: One preprocessor config for all components, or one per component.
        data_mixture_components: The components (or a config instantiating to them).
        max_sequence_length: The sequence length.
        replace_newlines_with: Newlines are replaced with this piece before tokenizing.
        fake_input_source_cfg: Optional BuildDatasetFn config of `{"text"}` documents used
            instead of every component's TFDS data (for tests).

    Returns:
        A BuildDatasetFn.

    Raises:
        ValueError: If a list of preprocessors does not have one per component.
    """
    components = maybe_instantiate(data_mixture_components)
    if isinstance(preprocessor, (list, tuple)):
        if len(preprocessor) != len(components):
            raise ValueError(
                f"mixture_train_input_source: {len(preprocessor)} preprocessors for "
                f"{len(components)} data_mixture_components: give one per component or one"
            )
        preprocessors = list(preprocessor)
    else:
        preprocessors = [preprocessor] * len(components)
    sources = []
    for component, processor in zip(components, preprocessors):
        if fake_input_source_cfg is not None:
            source = fake_input_source_cfg
        else:
            source = config_for_function(input_tf_data.tfds_dataset).set(
                dataset_name=component.name,
                split=component.split,
                train_shuffle_buffer_size=64 * component.shuffle_buffer_size,
                read_config=tfds_read_config(),
            )
        processor = maybe_set_config(
            processor.clone(),
            vocab_cfg=vocab_cfg,
            max_sequence_length=max_sequence_length,
            replace_newlines_with=replace_newlines_with,
        )
        sources.append(config_for_function(with_processor).set(source=source, processor=processor))
    return sample_from_datasets(
        is_training, sources=sources, weights=[c.weight for c in components]
    )


def scaled_hidden_dim(scale: float, *, round_up_to_multiples_of: int = 256) -> FunctionConfigBase:
    """A feed-forward `hidden_dim` config: ceil(input_dim * scale) rounded up to a multiple.

    Args:
        scale: The multiplier of the input dim.
        round_up_to_multiples_of: The result is a multiple of this.

    Returns:
        A function config taking `input_dim`.
    """

    def scale_fn(input_dim: int, *, scale: float, round_up_to_multiples_of: int) -> int:
        return math.ceil(input_dim * scale / round_up_to_multiples_of) * round_up_to_multiples_of

    return config_for_function(scale_fn).set(
        scale=scale, round_up_to_multiples_of=round_up_to_multiples_of
    )


def flash_attention_config() -> FlashAttention.Config:
    """A causal `flash_attention.layer.FlashAttention` config sharded as AXLearn's.

    Batch over (data, expert, fsdp), heads over (seq, model) inside the attention; the context
    [batch, target, heads, head_dim] over (batch axes, seq, model).
    """
    batch = ("data", "expert", "fsdp")
    return FlashAttention.default_config().set(
        causal=True,
        mha_dim_to_partition_spec={
            "btnh": PartitionSpec(batch, None, ("seq", "model"), None),
            "bsnh": PartitionSpec(batch, None, ("seq", "model"), None),
            "bnts": PartitionSpec(batch, None, None, None),
        },
        output_dim_to_partition_spec={
            "btnh": PartitionSpec(batch, "seq", "model", None),
            "bnts": PartitionSpec(batch, "model", "seq", None),
        },
    )


def mesh_shape_from_axes(
    *,
    pipeline: int = 1,
    data: int = 1,
    expert: int = 1,
    fsdp: int = 1,
    seq: int = 1,
    model: int = 1,
) -> tuple[int, ...]:
    """A mesh shape over MESH_AXIS_NAMES; one axis may be -1 (all remaining devices).

    Args:
        pipeline: Pipeline parallelism (layers across stages).
        data: Data parallelism (state replicated).
        expert: Expert parallelism (mixture-of-experts).
        fsdp: Fully-sharded data parallelism.
        seq: Sequence parallelism.
        model: Tensor parallelism.

    Returns:
        The 6-tuple; sizes below 1 other than -1 become 1.
    """
    sizes = (pipeline, data, expert, fsdp, seq, model)
    return tuple(x if x == -1 else max(x, 1) for x in sizes)


def update_model_remat_config(
    *, stack_cfg: InstantiableConfig, layer_cfg: InstantiableConfig
) -> None:
    """Sets `layer_cfg.remat_spec` for a RepeatedTransformerLayer stack (save the attention
    projections and context, recompute the rest).

    Args:
        stack_cfg: The transformer stack config.
        layer_cfg: The transformer layer config (modified in place).

    Raises:
        NotImplementedError: If the stack is not a RepeatedTransformerLayer.
    """
    if stack_cfg.klass is not RepeatedTransformerLayer:
        raise NotImplementedError(
            f"update_model_remat_config: stack_cfg.klass must be RepeatedTransformerLayer, got "
            f"{getattr(stack_cfg.klass, '__name__', stack_cfg.klass)}"
        )
    layer_cfg.set(remat_spec=build_remat_spec(stack_cfg.clone(layer=layer_cfg)))


def model_config(
    *,
    hidden_dim: int,
    num_heads: int,
    num_layers: int,
    vocab_size: int,
    activation_fn: Union[str, Sequence[str]],
    ffn_dim: Union[int, FunctionConfigBase],
    normalization: InstantiableConfig,
    dropout_rate: float = 0.0,
    stack_cfg: Optional[InstantiableConfig] = None,
    emb_cfg: Optional[InstantiableConfig] = None,
    lm_head_cfg: Optional[InstantiableConfig] = None,
    layer_cfg: Optional[InstantiableConfig] = None,
    attention_cfg: Optional[InstantiableConfig] = None,
    attention_qkv_linear: Optional[InstantiableConfig] = None,
    attention_mask: Optional[InstantiableConfig] = None,
    z_loss_scale: float = 0.0,
    ffn_structure: str = "prenorm",
    atten_structure: str = "prenorm",
    atten_logit_cap: Optional[float] = None,
    pad_token_id: Optional[int] = None,
    eos_token_id: Optional[int] = None,
    attention_kv_cache: Optional[InstantiableConfig] = None,
) -> causal_lm.Model.Config:
    """A causal LM config from layer-level choices (AXLearn's `common.model_config`).

    Weights are initialized normal(0, 1/fan_in), biases are removed, every norm is
    `normalization`, attention and feed-forward weights are sharded over the fsdp axes
    (expert, fsdp, seq) and the model axis, and a repeated stack rematerializes its layers
    saving the attention projections.

    Args:
        hidden_dim: Model dim.
        num_heads: Query heads.
        num_layers: Transformer layers.
        vocab_size: Vocabulary size.
        activation_fn: Feed-forward activation (a pair for a gated unit, e.g. SwiGLU).
        ffn_dim: Feed-forward hidden dim or a function config of input_dim.
        normalization: Normalization layer config used everywhere.
        dropout_rate: Decoder-wide dropout.
        stack_cfg: Transformer stack config (default RepeatedTransformerLayer).
        emb_cfg: Embedding config (default TransformerTextEmbeddings).
        lm_head_cfg: Optional untied LM head config.
        layer_cfg: Transformer layer config (default TransformerLayer).
        attention_cfg: Attention config (default: the layer's).
        attention_qkv_linear: QKV projection config (e.g. RoFormerQKVLinear).
        attention_mask: Optional attention-bias layer config (None: causal attention).
        z_loss_scale: Scale of the z-loss.
        ffn_structure: "prenorm", "postnorm" or "hybridnorm".
        atten_structure: "prenorm", "postnorm" or "hybridnorm".
        atten_logit_cap: Optional tanh cap of attention logits.
        pad_token_id: Optional padding id.
        eos_token_id: Optional end-of-sequence id.
        attention_kv_cache: Optional KV cache config of the attention (e.g. `KVCache` with
            `cache_dtype`).

    Returns:
        The model config (loss from `causal_lm.metrics_config()`; inputs are not sharding-
        constrained inside the model: the trainer shards them).
    """
    stack_cfg = (stack_cfg or RepeatedTransformerLayer.default_config()).clone()
    layer_cfg = (layer_cfg or TransformerLayer.default_config()).clone()
    layer_cfg.feed_forward.set(
        activation=activation_fn, hidden_dim=ffn_dim, structure=ffn_structure
    )
    if attention_cfg is not None:
        layer_cfg.self_attention.attention = attention_cfg.clone()
    attention = layer_cfg.self_attention.attention
    attention.set(causal=True, num_heads=num_heads, atten_logit_cap=atten_logit_cap)
    if attention_qkv_linear is not None:
        attention.input_linear = attention_qkv_linear.clone()
    if attention_kv_cache is not None:
        attention.kv_cache = attention_kv_cache.clone()
    layer_cfg.self_attention.structure = atten_structure
    if stack_cfg.klass is RepeatedTransformerLayer:
        update_model_remat_config(stack_cfg=stack_cfg, layer_cfg=layer_cfg)
    stack_cfg.set(num_layers=num_layers, layer=layer_cfg)
    decoder_cfg = Decoder.default_config().set(
        transformer=stack_cfg,
        attention_mask=attention_mask,
        dim=hidden_dim,
        vocab_size=vocab_size,
        emb=(emb_cfg or TransformerTextEmbeddings.default_config()).clone(),
        lm_head=lm_head_cfg,
        dropout_rate=dropout_rate,
    )
    if pad_token_id is not None:
        decoder_cfg.set(pad_token_id=pad_token_id)
    if eos_token_id is not None:
        decoder_cfg.set(eos_token_id=eos_token_id)
    batch_axis_names = ("data", "expert", "fsdp")
    cfg = causal_lm.Model.default_config().set(
        decoder=decoder_cfg,
        param_init=DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan="fan_in", distribution="normal"
                )
            }
        ),
        batch_axis_names=None,
        dtype=jnp.float32,
        metrics=causal_lm.metrics_config(),
    )
    if z_loss_scale:
        cfg.z_loss_scale = z_loss_scale
    set_double_shard_weights_config(
        cfg.decoder.transformer.layer,
        batch_axis_names=batch_axis_names,
        fsdp_axis_names=("expert", "fsdp", "seq"),
        tp_axis_names="model",
        seq_axis_names="seq",
    )
    cfg.decoder.logits_partition_spec = (batch_axis_names, "seq", "model")
    kv_cache = cfg.decoder.transformer.layer.self_attention.attention.kv_cache
    if kv_cache is not None and "kv_partition_spec" in kv_cache:
        # Decoding caches: batch over the batch axes, length over "seq", heads over "model".
        kv_cache.kv_partition_spec = (batch_axis_names, "seq", "model", None)
    set_bias_recursively(cfg, False)
    set_norm_recursively(cfg, normalization)
    return cfg


def mup_simple_adam_update_transformation(scale_factor: float) -> InstantiableConfig:
    """Scales the Adam updates of the linear-layer weights by `scale_factor` (muP-style).

    Args:
        scale_factor: The scale of attention projection and feed-forward weight updates.

    Returns:
        A config of `optimizers.scale_update_per_param`.
    """
    paths = [
        ".*attention/o_proj/weight",
        ".*attention/i_proj/i_proj/qkv_proj/weight",
        ".*feed_forward/linear1_0/weight",
        ".*feed_forward/linear1_1/weight",
        ".*feed_forward/linear2/weight",
        ".*feed_forward/wi_0_weight",
        ".*feed_forward/wi_1_weight",
        ".*feed_forward/wo_weight",
    ]
    return config_for_function(optimizers.scale_update_per_param).set(
        per_param_scale=config_for_function(optimizers.per_param_scale_by_path).set(
            scale_by_path=[(p, scale_factor) for p in paths],
            description="scale_by_mup_simple",
            default_scale=1.0,
        )
    )


def _warmup_cosine_update_schedule(
    *, max_step: int, lr_warmup_steps: int, alpha: float
) -> ConfigOr[Any]:
    """The learners' update schedule: linear warmup from 0 to 1, then cosine decay to `alpha`."""
    return config_for_function(schedule.cosine_with_linear_warmup).set(
        peak_lr=1.0,
        max_step=max_step,
        warmup_steps=lr_warmup_steps,
        begin_value=0.0,
        alpha=alpha,
    )


def adamw_decoupled_learner_config(
    *,
    peak_lr: float,
    max_step: int,
    weight_decay: float,
    lr_warmup_steps: int = 2000,
    alpha: float = 0.1,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    adam_update_transformation: Optional[ConfigOr[Any]] = None,
) -> learner.Learner.Config:
    """A learner: global-norm clipping (1) then decoupled AdamW with a warmup-cosine schedule.

    Args:
        peak_lr: The learning rate (the schedule multiplies it, peaking at 1).
        max_step: Schedule length.
        weight_decay: Decoupled weight decay.
        lr_warmup_steps: Linear warmup steps.
        alpha: Final fraction of the peak.
        b1: Adam b1.
        b2: Adam b2.
        eps: Adam eps.
        adam_update_transformation: Optional transformation of the Adam updates.

    Returns:
        The learner config.
    """
    update_schedule = _warmup_cosine_update_schedule(
        max_step=max_step, lr_warmup_steps=lr_warmup_steps, alpha=alpha
    )
    optimizer = config_for_function(optimizers.chain).set(
        args=[
            config_for_function(optimizers.clip_by_global_norm).set(max_norm=1),
            config_for_function(optimizers.adamw_decoupled_optimizer).set(
                learning_rate=peak_lr,
                b1=b1,
                b2=b2,
                eps=eps,
                update_schedule=update_schedule,
                weight_decay=weight_decay,
                weight_decay_per_param_scale=None,
                adam_update_transformation=adam_update_transformation,
            ),
        ]
    )
    return learner.Learner.default_config().set(optimizer=optimizer)


def adastar_learner_config(
    *,
    peak_lr: float,
    max_step: int,
    lr_warmup_steps: int = 2000,
    alpha: float = 0.005,
    weight_decay: float = 3.16e-4,
    b1: float = 0.95,
    b2: float = 0.95,
    adam_update_transformation: Optional[ConfigOr[Any]] = None,
) -> learner.Learner.Config:
    """A learner: AdaStar in its Adafactor-like setting, skipping steps with a global norm >= 100
    and clipping it to 1, with a warmup-cosine schedule (AXLearn's `adastar_learner_config`).

    AdaStar here: no gradient momentum; debiased second moment (decay b2) of g**2 + 1e-30 (no
    eps on its root); raw updates clipped to block RMS 1, then smoothed (decay b1, not debiased);
    decoupled weight decay.

    Args:
        peak_lr: The learning rate (the schedule multiplies it, peaking at 1).
        max_step: Schedule length.
        lr_warmup_steps: Linear warmup steps.
        alpha: Final fraction of the peak.
        weight_decay: Decoupled weight decay.
        b1: Decay of the update EMA.
        b2: Decay of the second moment.
        adam_update_transformation: Optional transformation of the smoothed updates.

    Returns:
        The learner config.
    """
    update_schedule = _warmup_cosine_update_schedule(
        max_step=max_step, lr_warmup_steps=lr_warmup_steps, alpha=alpha
    )
    optimizer = config_for_function(optimizers.skip_and_clip_by_global_norm).set(
        inner=config_for_function(optimizers.adastar_optimizer).set(
            learning_rate=peak_lr,
            gradient_ema_decay=None,
            gradient_ema_debias=None,
            gradient_square_ema_decay=b2,
            gradient_square_ema_debias=True,
            eps=0,
            eps_square=1e-30,
            raw_update_clipping_threshold=1.0,
            update_ema_decay=b1,
            update_ema_debias=False,
            weight_decay=weight_decay,
            update_schedule=update_schedule,
            adam_update_transformation=adam_update_transformation,
        ),
        drop_norm=100,
        max_norm=1,
    )
    return learner.Learner.default_config().set(optimizer=optimizer)


def _batcher() -> InstantiableConfig:
    """A per-feed batcher (its size comes from the Input's input_dispatcher)."""
    return config_for_function(input_tf_data.per_feed_batch).set(
        prefetch_buffer_size=-1,  # tf.data.AUTOTUNE.
        pad_example_fn=input_tf_data.default_pad_example_fn,
    )


def _dispatcher(global_logical_batch_size: int) -> InstantiableConfig:
    return SpmdInputDispatcher.default_config().set(
        global_logical_batch_size=global_logical_batch_size,
        partition_spec=PartitionSpec(("data", "expert", "fsdp")),
    )


# Batch axes over (data, expert, fsdp); sequence axes over seq.
_INPUT_PARTITION = {
    (None, 1): PartitionSpec(("data", "expert", "fsdp")),
    (None, 2): PartitionSpec(("data", "expert", "fsdp"), "seq"),
}


def evaler_config_dict(
    input_source_configs: dict[str, InstantiableConfig],
    *,
    metric_calculators: Optional[dict[str, InstantiableConfig]] = None,
    summary_writer: Optional[InstantiableConfig] = None,
) -> dict[str, SpmdEvaler.Config]:
    """One SpmdEvaler config per eval input source (per-feed batching; the batch size is set by
    `get_trainer_config_fn` on the input's input_dispatcher).

    Args:
        input_source_configs: {name: BuildDatasetFn config}.
        metric_calculators: Optional {name: metric calculator config} overriding the default
            ModelSummaryAccumulator.
        summary_writer: Optional summary writer config for every evaler.

    Returns:
        {name: SpmdEvaler config}.

    Raises:
        ValueError: If metric_calculators names a source that does not exist.
    """
    unknown = set(metric_calculators or {}) - set(input_source_configs)
    if unknown:
        raise ValueError(
            f"metric_calculators keys {sorted(unknown)} are not input sources "
            f"{sorted(input_source_configs)}"
        )
    evalers = {}
    for name, source in input_source_configs.items():
        evaler_cfg = SpmdEvaler.default_config().set(
            input=input_tf_data.Input.default_config().set(
                is_training=False,
                source=source,
                processor=config_for_function(input_tf_data.identity),
                batcher=_batcher(),
            ),
            eval_dtype=STEP_DTYPE,
            metric_calculator=(metric_calculators or {}).get(
                name, ModelSummaryAccumulator.default_config()
            ),
        )
        if summary_writer is not None:
            evaler_cfg.set(summary_writer=summary_writer)
        evalers[name] = evaler_cfg
    return evalers


def make_config_name(
    arch: str, model_size: str, *, version: Optional[str] = None, suffix: Optional[str] = None
) -> str:
    """f"{arch}-{model_size}", then f"-{version}" if given, then `suffix` (no delimiter).

    Args:
        arch: Architecture name, e.g. "fuji".
        model_size: Size name, e.g. "7B".
        version: Optional version, e.g. "v3".
        suffix: Optional suffix, e.g. "-flash".

    Returns:
        The config name, e.g. "fuji-7B-v3-flash".
    """
    name = f"{arch}-{model_size}"
    if version:
        name += f"-{version}"
    if suffix:
        name += suffix
    return name


def get_trainer_config_fn(
    *,
    model_cfg: InstantiableConfig,
    learner_cfg: learner.Learner.Config,
    max_step: int,
    train_batch_size: int,
    train_input_source: InstantiableConfig,
    evalers: dict[str, SpmdEvaler.Config],
    mesh_shape: Sequence[int],
    mesh_axis_names: Sequence[str] = MESH_AXIS_NAMES,
    mesh_rules: Optional[Sequence[tuple[str, Any]]] = None,
    eval_every_n_steps: int = EVAL_EVERY_N_STEPS,
    eval_batch_size: Optional[int] = None,
    keep_every_n_steps: int = 50_000,
    save_every_n_steps: Optional[int] = None,
    init_state_builder: Optional[InstantiableConfig] = None,
) -> TrainerConfigFn:
    """A function building a SpmdTrainer config from model, learner, input and mesh choices.

    Args:
        model_cfg: The model config.
        learner_cfg: The learner config.
        max_step: Training steps.
        train_batch_size: Global training batch size (the input dispatcher's logical batch).
        train_input_source: BuildDatasetFn config of the training input (e.g. `tfds_input`).
        evalers: {name: SpmdEvaler config} (e.g. from `evaler_config_dict`).
        mesh_shape: The default mesh shape.
        mesh_axis_names: The mesh axis names (batches shard over all but "model"/"pipeline").
        mesh_rules: Optional (instance-type regex, mesh shape or config modifier) rules.
        eval_every_n_steps: Evaluation period (AXLearn's default: EVAL_EVERY_N_STEPS).
        eval_batch_size: Eval batch size (default: train_batch_size).
        keep_every_n_steps: Checkpoints at multiples of this are kept.
        save_every_n_steps: Checkpoint period (default: min(eval_every_n_steps, 5000)).
        init_state_builder: Optional builder of the initial trainer state.

    Returns:
        A TrainerConfigFn.

    Raises:
        ValueError: (when called) if mesh_shape and mesh_axis_names differ in length.
    """

    def config_fn() -> SpmdTrainer.Config:
        hybrid = isinstance(mesh_shape, HybridMeshShape)
        num_axes = len(mesh_shape.ici_mesh_shape) if hybrid else len(mesh_shape)
        if len(mesh_axis_names) != num_axes:
            raise ValueError(
                f"mesh_axis_names {tuple(mesh_axis_names)} and mesh_shape {mesh_shape} "
                "differ in length"
            )
        cfg = SpmdTrainer.default_config().set(
            name="gpt_trainer",
            model=model_cfg.clone(),
            learner=learner_cfg.clone(),
            max_step=max_step,
            train_dtype=STEP_DTYPE,
            mesh_axis_names=tuple(mesh_axis_names),
            mesh_shape=mesh_shape if hybrid else tuple(mesh_shape),
            batch_axis_names=tuple(a for a in mesh_axis_names if a not in ("model", "pipeline")),
            mesh_rules=mesh_rules,
        )
        cfg.input = input_tf_data.Input.default_config().set(
            is_training=True,
            source=train_input_source,
            processor=config_for_function(input_tf_data.identity),
            batcher=_batcher(),
            input_dispatcher=_dispatcher(train_batch_size),
            input_partitioner=config_for_function(partition_by_path_rank).set(
                path_rank_to_partition=dict(_INPUT_PARTITION)
            ),
        )
        cfg.evalers = {}
        for name, evaler_cfg in evalers.items():
            evaler_cfg = evaler_cfg.clone()
            evaler_cfg.input.input_dispatcher = _dispatcher(eval_batch_size or train_batch_size)
            evaler_cfg.summary_writer.max_queue = 1000
            evaler_cfg.eval_policy = config_for_function(eval_every_n_steps_policy).set(
                n=eval_every_n_steps, max_step=max_step
            )
            cfg.evalers[name] = evaler_cfg
        cfg.checkpointer.save_policy = config_for_function(every_n_steps_and_last_policy).set(
            n=save_every_n_steps or min(eval_every_n_steps, 5_000), max_step=max_step
        )
        cfg.checkpointer.keep_every_n_steps = min(max_step, keep_every_n_steps)
        cfg.checkpointer.keep_last_n = 3
        cfg.summary_writer.write_every_n_steps = min(eval_every_n_steps, 100)
        cfg.summary_writer.max_queue = 1000
        if init_state_builder is not None:
            cfg.init_state_builder = init_state_builder
        return cfg

    return config_fn


class SourceBuilder(Protocol):
    """Builds input source config(s) for a vocabulary size and sequence length."""

    def __call__(self, *, vocab_size: int, max_sequence_length: int) -> Any:
        """Returns a BuildDatasetFn config (or a dict of them, for evaluation)."""
