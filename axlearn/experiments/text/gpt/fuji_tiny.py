"""`fuji-tiny-v3`: a 2-layer Fuji v3 that trains here on the embedded corpus (our config).

Built like AXLearn's Fuji v3 (`fuji.model_config`, `common.get_trainer_config_fn`: per-feed
batching, KV cache, loss metrics) with the shipped 4096-piece sentencepiece vocabulary, 128-token
sequences and batch 16. `fuji.named_trainer_configs()` registers it.
"""

from __future__ import annotations

from typing import Callable

from axlearn.common.attention import StackedTransformerLayer
from axlearn.common.config import config_for_function
from axlearn.common.embedded_data import DATASET_NAME
from axlearn.experiments.text.common import embedded_vocab_config
from axlearn.experiments.text.gpt.common import (
    REPLACE_NEWLINES_WITH,
    adamw_decoupled_learner_config,
    evaler_config_dict,
    get_trainer_config_fn,
    mesh_shape_from_axes,
    scaled_hidden_dim,
    tfds_input,
)
from axlearn.experiments.trainer_config_utils import TrainerConfigFn

# The embedded corpus's sentencepiece vocabulary size.
TINY_VOCAB_SIZE = 4096
# Sequence length of fuji-tiny-v3.
TINY_MAX_SEQUENCE_LENGTH = 128


def tiny_model_kwargs() -> dict:
    """The `fuji.model_config` kwargs of fuji-tiny-v3 (v3 architecture, small shapes)."""
    return dict(
        num_layers=2,
        hidden_dim=64,
        num_heads=4,
        num_kv_heads=2,
        vocab_size=TINY_VOCAB_SIZE,
        rope_theta=5e5,
        ffn_dim=scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=16),
        shared_lm_head=True,
        # Unrolled layers compile faster than a scanned stack on CPU.
        stack_cfg=StackedTransformerLayer.default_config(),
    )


def tiny_sources(max_sequence_length: int = TINY_MAX_SEQUENCE_LENGTH):
    """(train source, {"validation": eval source}) over the embedded corpus.

    Args:
        max_sequence_length: Tokens per example.

    Returns:
        The source configs.
    """
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


def tiny_trainer_configs(model_config: Callable[..., object]) -> dict[str, TrainerConfigFn]:
    """{"fuji-tiny-v3": TrainerConfigFn}.

    Args:
        model_config: `fuji.model_config` (passed in: fuji imports this module).

    Returns:
        The config map.
    """
    train, evals = tiny_sources()
    max_step = 200
    return {
        "fuji-tiny-v3": get_trainer_config_fn(
            model_cfg=model_config(**tiny_model_kwargs()),
            learner_cfg=adamw_decoupled_learner_config(
                peak_lr=3e-3, weight_decay=0.01, lr_warmup_steps=20, max_step=max_step
            ),
            max_step=max_step,
            train_batch_size=16,
            eval_batch_size=16,
            train_input_source=train,
            evalers=evaler_config_dict(evals),
            eval_every_n_steps=100,
            save_every_n_steps=100,
            mesh_shape=mesh_shape_from_axes(data=-1),
            mesh_rules=(("cpu-fsdp", mesh_shape_from_axes(fsdp=-1)),),
        )
    }
