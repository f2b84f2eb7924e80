"""The reference 3B trainer (`tests/testdata/trainer/honeycrisp_trainer_config.txt`), rebuilt.

`honeycrisp-3B` builds, from the real classes and functions, the trainer config whose dump is the
reference dump line for line: a 2.7B-parameter decoder (26 repeated layers, dim 3072, 24 query /
8 KV heads, SwiGLU 8064, vocab 49152, QK-norm, RoPE theta 5e5) trained with adastar inside
skip-and-clip for 750k steps on a 6-axis mesh with per-hardware mesh rules. It names the original
data sets and vocabulary, which are not shipped: use it for review (`axlearn config dump`), or
train it on synthetic data with `--data_dir=FAKE` on hardware that fits a 3B model.
"""

from __future__ import annotations

import jax.numpy as jnp

from axlearn.common import evaler, input_tf_data, learner, optimizers, schedule
from axlearn.common.checkpointer import every_n_steps_and_last_policy
from axlearn.common.config import config_for_function
from axlearn.common.trainer import SpmdTrainer
from axlearn.experiments.text.common import vocab
from axlearn.experiments.text.gpt.common import tfds_input
from axlearn.experiments.text.gpt.model_builders import honeycrisp_model_config

MAX_STEP = 750_000
GLOBAL_BATCH_SIZE = 2048
MAX_SEQUENCE_LENGTH = 4096
TRAIN_DATASET = "pajama_honeycrisp_15t_202408072230"
EVAL_DATASET = "pile/openwebtext_2:1.0.0"
VOCAB = "bpe_48k_honeycrisp.model"
# Per-parameter Adam update scales (muP-style) by parameter path.
MUP_SCALES = [
    (".*attention/o_proj/weight", 0.25),
    (".*attention/i_proj/i_proj/qkv_proj/weight", 0.25),
    (".*feed_forward/linear1_0/weight", 0.25),
    (".*feed_forward/linear1_1/weight", 0.25),
    (".*feed_forward/linear2/weight", 0.25),
    (".*feed_forward/wi_0_weight", 0.25),
    (".*feed_forward/wi_1_weight", 0.25),
    (".*feed_forward/wo_weight", 0.25),
]


def _batcher():
    return config_for_function(input_tf_data.batch).set(
        global_batch_size=GLOBAL_BATCH_SIZE,
        prefetch_buffer_size=-1,
        pad_example_fn=input_tf_data.default_pad_example_fn,
    )


def _train_input() -> input_tf_data.Input.Config:
    return input_tf_data.Input.default_config().set(
        is_training=True,
        source=config_for_function(input_tf_data.tfds_dataset).set(
            dataset_name=TRAIN_DATASET,
            split="train",
            is_training=True,
            download=False,
            train_shuffle_buffer_size=0,
            train_shuffle_files=False,
        ),
        processor=config_for_function(input_tf_data.identity),
        batcher=_batcher(),
    )


def _eval_input() -> input_tf_data.Input.Config:
    return input_tf_data.Input.default_config().set(
        is_training=False,
        source=config_for_function(tfds_input).set(
            is_training=False,
            dataset_name=EVAL_DATASET,
            split="test[:5000]",
            vocab_cfg=config_for_function(vocab).set(sentencepiece_model_name=VOCAB),
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            replace_newlines_with="<n>",
        ),
        processor=config_for_function(input_tf_data.identity),
        batcher=_batcher(),
    )


def _learner() -> learner.Learner.Config:
    adastar = config_for_function(optimizers.adastar_optimizer).set(
        learning_rate=0.01,
        gradient_ema_decay=None,
        gradient_ema_debias=None,
        gradient_square_ema_decay=0.95,
        gradient_square_ema_debias=True,
        eps=0,
        eps_square=1e-30,
        raw_update_clipping_threshold=1.0,
        update_ema_decay=0.95,
        update_ema_debias=False,
        weight_decay=0.000316,
        update_schedule=config_for_function(schedule.cosine_with_linear_warmup).set(
            peak_lr=1.0, max_step=MAX_STEP, warmup_steps=5000, begin_value=0.0, alpha=0.005
        ),
        adam_update_transformation=config_for_function(optimizers.scale_update_per_param).set(
            per_param_scale=config_for_function(optimizers.per_param_scale_by_path).set(
                description="scale_by_mup_simple", scale_by_path=MUP_SCALES, default_scale=1.0
            )
        ),
    )
    return learner.Learner.default_config().set(
        optimizer=config_for_function(optimizers.skip_and_clip_by_global_norm).set(
            inner=adastar, drop_norm=100, max_norm=1
        )
    )


def honeycrisp_trainer_config() -> SpmdTrainer.Config:
    """Returns the reference 3B trainer config (its dump equals the reference dump)."""
    cfg = SpmdTrainer.default_config().set(
        name="gpt_trainer",
        max_step=MAX_STEP,
        mesh_axis_names=("pipeline", "data", "expert", "fsdp", "seq", "model"),
        mesh_shape=(1, -1, 1, 8, 1, 1),
        batch_axis_names=("data", "expert", "fsdp", "seq"),
        mesh_rules=[
            ("tpu-v4-256", (1, 1, 1, -1, 1, 1)),
            ("tpu-v5litepod-256", (1, -1, 1, 256, 1, 1)),
            (
                "gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-(64|128|256|512|1024)",
                (1, -1, 1, 8, 1, 1),
            ),
            ("gpu-p4d.24xlarge-256", (1, -1, 1, 8, 1, 1)),
            ("tpu-v5p-(1024|2048|4096)", (1, -1, 1, 1, 1, 1)),
        ],
        save_input_iterator=True,
        train_dtype=jnp.bfloat16,
        input=_train_input(),
        model=honeycrisp_model_config(),
        learner=_learner(),
    )
    cfg.summary_writer.set(max_queue=1000, write_every_n_steps=100)
    cfg.checkpointer.set(keep_last_n=3, keep_every_n_steps=5000, gc_loop_interval_seconds=60)
    cfg.checkpointer.save_policy = config_for_function(every_n_steps_and_last_policy).set(
        n=5000, max_step=MAX_STEP
    )
    cfg.checkpointer.storage.set(timeout_secs=3600)
    eval_cfg = evaler.SpmdEvaler.default_config().set(input=_eval_input(), eval_dtype=jnp.bfloat16)
    eval_cfg.eval_policy.set(n=25000, max_step=MAX_STEP)
    cfg.evalers["openwebtext_2"] = eval_cfg
    return cfg


# Mesh rules for the launch targets the docs use (docs/launch.md) that the reference rules do not
# match, by `--mesh_selector` (AXLearn's convention: the instance type, "-<slices>" for several
# TPU slices, "-<GPUs>" for GPUs). Every weight is fsdp-sharded over the chips of one slice (ICI)
# and data-parallel over slices (DCN) or GPU nodes, as the reference's tpu-v5litepod-256 and GPU
# rules do. Chosen by AOT-compiled per-chip memory on the target (see docs/launch.md): the state
# (parameters + adastar's two slots, fp32) is 12 bytes x 2.74B parameters / fsdp, so the largest
# fsdp a slice allows; the activations of 2048 x 4096-token sequences per step do not depend on
# the mesh (the same total split over the same chips).
LAUNCH_MESH_RULES = [
    ("tpu-v5p-8", (1, -1, 1, 4, 1, 1)),
    ("tpu-v5p-128-2", (1, -1, 1, 64, 1, 1)),
    ("tpu-v6e-256", (1, -1, 1, 256, 1, 1)),
    ("gpu-a3-highgpu-8g-(8|16|32)", (1, -1, 1, 8, 1, 1)),
]


def honeycrisp_launch_config() -> SpmdTrainer.Config:
    """The named config honeycrisp-3B: the reference config plus `LAUNCH_MESH_RULES`.

    Its dump is the reference dump with the added rules after the reference's five
    (`mesh_rules[5]` on), so every reference rule keeps its index and wins where it matches.
    """
    cfg = honeycrisp_trainer_config()
    cfg.mesh_rules = list(cfg.mesh_rules) + LAUNCH_MESH_RULES
    return cfg


def named_trainer_configs() -> dict:
    """The named trainer configs of this module."""
    return {"honeycrisp-3B": honeycrisp_launch_config}
