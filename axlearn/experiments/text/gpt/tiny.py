"""A tiny GPT trained on the embedded corpus: the README's main job, in minutes on 2 CPU cores.

    python -m axlearn.common.launch_trainer_main --module=text.gpt.tiny --config=gpt-tiny \\
        --trainer_dir=/tmp/gpt-tiny --jax_backend=cpu

The model is a 2-layer decoder (dim 128, 4 query heads / 2 KV heads with RoPE and QK-norm,
SwiGLU hidden 512, tied embedding, vocabulary 4096: ~1.0M parameters) trained for 300 steps on
sequences of 128 tokens of the embedded `python_docs` corpus (Python documentation text; see
axlearn/data/python_docs/README.md); the training loss falls from ~8.5 to ~4. It evaluates on
the validation split, writes TensorBoard summaries and metrics.jsonl, and commits a checkpoint
every 100 steps (3 during the run).

Mesh: data parallel over all devices by default; `--mesh_selector` picks one of `mesh_rules`
(CPU meshes for tests, and the TPU/GPU launch targets of docs/launch.md: `LAUNCH_MESH_RULES`).
"""

from __future__ import annotations

import jax.numpy as jnp

from axlearn.common import (
    evaler,
    input_grain,
    input_grain_lm,
    input_tf_data,
    learner,
    optimizers,
    schedule,
)
from axlearn.common.checkpointer import every_n_steps_and_last_policy
from axlearn.common.config import config_for_function
from axlearn.common.embedded_data import DATASET_NAME
from axlearn.common.trainer import SpmdTrainer
from axlearn.experiments.text.common import embedded_vocab_config
from axlearn.experiments.text.gpt.common import REPLACE_NEWLINES_WITH, tfds_input
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

# The reference trainer's mesh axes; partition specs of the model refer to them.
MESH_AXIS_NAMES = ("pipeline", "data", "expert", "fsdp", "seq", "model")
# Batches are split over these mesh axes.
BATCH_AXIS_NAMES = ("data", "expert", "fsdp", "seq")


def _mesh(*, pipeline: int = 1, data: int = 1, fsdp: int = 1, model: int = 1) -> tuple[int, ...]:
    """A mesh shape over MESH_AXIS_NAMES."""
    return (pipeline, data, 1, fsdp, 1, model)


# The meshes of the launch targets the docs use (docs/launch.md), by `--mesh_selector`
# (AXLearn's convention: instance type, "-<slices>" for several TPU slices, "-<GPUs>" for GPUs).
# Chosen by AOT-compiled per-chip memory (libtpu, on CPU) where it can be measured:
# - tpu-v5p-8 (4 chips): fsdp=4 needs 36.6 MB per chip vs 44.6 MB data-parallel.
# - 128 / 256 chips (tpu-v5p-128 x2, tpu-v6e-256): the global batch of 16 sequences cannot be
#   split over more than 16 devices, so the batch axes hold 16 and the rest are replicas on the
#   `pipeline` axis (not a batch axis; this model has no pipeline stages, so each replica
#   computes the same step). fsdp=16 needs 21.7 MB per chip on tpu-v5p-128 x2; see
#   docs/launch.md for the alternatives measured.
# - gpu-a3-highgpu-8g x2 (16 GPUs): fsdp over a node's 8 GPUs (NVLink), data over the nodes,
#   as AXLearn's GPU rules do (XLA:GPU cannot be compiled for here without a GPU).
LAUNCH_MESH_RULES = [
    ("tpu-v5p-8(-2)?", _mesh(data=-1, fsdp=4)),
    ("tpu-(v5p-128-2|v6e-256)", _mesh(pipeline=-1, fsdp=16)),
    ("gpu-a3-highgpu-8g-(8|16)", _mesh(data=-1, fsdp=8)),
]


def _input(*, is_training: bool, split: str, global_batch_size: int, seq_len: int):
    source = config_for_function(tfds_input).set(
        dataset_name=DATASET_NAME,
        split=split,
        vocab_cfg=embedded_vocab_config(),
        max_sequence_length=seq_len,
        train_shuffle_buffer_size=1024,
        replace_newlines_with=REPLACE_NEWLINES_WITH,
    )
    return input_tf_data.Input.default_config().set(
        is_training=is_training,
        source=source,
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=global_batch_size,
            pad_example_fn=input_tf_data.default_pad_example_fn,
        ),
    )


def _grain_input(*, is_training: bool, split: str, global_batch_size: int, seq_len: int):
    """The Grain twin of `_input`: the embedded corpus's ArrayRecord copy, same processing."""
    source = config_for_function(input_grain_lm.array_record_lm_source).set(
        is_training=is_training,
        vocab_cfg=embedded_vocab_config(),
        max_sequence_length=seq_len,
        global_batch_size=global_batch_size,
        split=split,
        replace_newlines_with=REPLACE_NEWLINES_WITH,
    )
    return input_grain.Input.default_config().set(source=source)


def tiny_grain_trainer_config(**kwargs) -> SpmdTrainer.Config:
    """`gpt-tiny` reading its corpus through Grain (`input_grain`) instead of tf.data.

    Same model, schedule, batch and sequence length; the inputs are
    `input_grain_lm.array_record_lm_source` over the embedded corpus's ArrayRecord files.

    Args:
        **kwargs: Forwarded to `tiny_trainer_config`.

    Returns:
        The trainer config.
    """
    cfg = tiny_trainer_config(**kwargs)
    batch = kwargs.get("global_batch_size", 16)
    seq_len = kwargs.get("seq_len", 128)
    cfg.input = _grain_input(
        is_training=True, split="train", global_batch_size=batch, seq_len=seq_len
    )
    cfg.evalers["validation"].input = _grain_input(
        is_training=False, split="validation", global_batch_size=batch, seq_len=seq_len
    )
    return cfg


def tiny_trainer_config(
    *,
    max_step: int = 300,
    global_batch_size: int = 16,
    seq_len: int = 128,
    num_layers: int = 2,
    model_dim: int = 128,
    eval_every_n_steps: int = 100,
    checkpoint_every_n_steps: int = 100,
    peak_lr: float = 3e-3,
) -> SpmdTrainer.Config:
    """Returns the tiny GPT trainer config.

    Args:
        max_step: Training steps.
        global_batch_size: Sequences per step.
        seq_len: Tokens per sequence.
        num_layers: Transformer layers.
        model_dim: Model dim (heads of dim 32).
        eval_every_n_steps: Evaluation interval.
        checkpoint_every_n_steps: Checkpoint interval (the last step is always saved).
        peak_lr: Peak learning rate of the cosine schedule.

    Returns:
        The trainer config.
    """
    vocab_size = 4096
    num_heads = model_dim // 32
    cfg = SpmdTrainer.default_config().set(
        name="gpt_trainer",
        max_step=max_step,
        mesh_axis_names=MESH_AXIS_NAMES,
        mesh_shape=_mesh(data=-1),
        batch_axis_names=BATCH_AXIS_NAMES,
        mesh_rules=[
            ("cpu-fsdp", _mesh(fsdp=-1)),
            ("cpu-data2-fsdp", _mesh(data=2, fsdp=-1)),
            ("cpu-data2-model", _mesh(data=2, model=-1)),
            *LAUNCH_MESH_RULES,
        ],
        train_dtype=jnp.float32,
        save_input_iterator=True,
    )
    cfg.model = transformer_lm_config(
        num_layers=num_layers,
        model_dim=model_dim,
        num_heads=num_heads,
        num_kv_heads=max(1, num_heads // 2),
        hidden_dim=4 * model_dim,
        vocab_size=vocab_size,
        rope_theta=5e5,
        qk_norm=True,
        # Unrolled layers compile ~3x faster than a scanned (repeated) stack on CPU.
        stack="stack",
        sharding=True,
    )
    cfg.input = _input(
        is_training=True, split="train", global_batch_size=global_batch_size, seq_len=seq_len
    )
    lr = config_for_function(schedule.cosine_with_linear_warmup).set(
        peak_lr=peak_lr,
        max_step=max_step,
        warmup_steps=max(1, max_step // 10),
        begin_value=0.0,
        alpha=0.1,
    )
    cfg.learner = learner.Learner.default_config().set(
        optimizer=config_for_function(optimizers.skip_and_clip_by_global_norm).set(
            inner=config_for_function(optimizers.adamw_optimizer).set(
                learning_rate=lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=1e-4
            ),
            drop_norm=100.0,
            max_norm=1.0,
        )
    )
    eval_cfg = evaler.SpmdEvaler.default_config().set(
        input=_input(
            is_training=False,
            split="validation",
            global_batch_size=global_batch_size,
            seq_len=seq_len,
        ),
    )
    eval_cfg.eval_policy.set(n=eval_every_n_steps, max_step=max_step)
    cfg.evalers["validation"] = eval_cfg
    cfg.checkpointer.save_policy = config_for_function(every_n_steps_and_last_policy).set(
        n=checkpoint_every_n_steps, max_step=max_step
    )
    cfg.checkpointer.keep_last_n = 3
    cfg.summary_writer.write_every_n_steps = 10
    return cfg


def named_trainer_configs() -> dict:
    """The named trainer configs of this module."""
    return {"gpt-tiny": tiny_trainer_config, "gpt-tiny-grain": tiny_grain_trainer_config}
