"""Workload P1 (docs/performance.md) as an SpmdTrainer config, shared by the benchmarks.

Decoder, 2 layers, d=256, 4 heads of 64 (4 KV heads), RoPE theta 5e5, QK-norm, SwiGLU hidden
1024, tied embedding, vocab 32768, sequence 128, global batch 4, AdamW, fp32, one device,
summaries every step. About 10.5M parameters.
"""

from __future__ import annotations

from axlearn.common import learner, optimizers
from axlearn.common.config import config_for_function
from axlearn.common.input_fake import FakeLmInput
from axlearn.common.trainer import SpmdTrainer
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

VOCAB, SEQ, BATCH = 32768, 128, 4
# The reference trainer's mesh axes (the model's partition specs name them); all of size 1.
MESH_AXIS_NAMES = ("pipeline", "data", "expert", "fsdp", "seq", "model")
MESH_SHAPE = (1,) * len(MESH_AXIS_NAMES)
# AdamW.
LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.95, 1e-8, 0.01
# The model's sizes, in `plain_jax_lm.LmConfig`'s field names.
P1_DIMS = dict(
    vocab_size=VOCAB,
    dim=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=4,
    hidden_dim=1024,
    rope_theta=5e5,
    qk_norm=True,
)


def p1_plain_config():
    """The P1 model as `benchmarks/plain_jax_lm.py` builds it (the same math in plain JAX)."""
    import plain_jax_lm  # pylint: disable=import-outside-toplevel

    return plain_jax_lm.LmConfig(**P1_DIMS)


def p1_model_config(stack: str = "stack"):
    """The P1 causal LM config (`transformer_lm_config`).

    Args:
        stack: How the layers are stacked ("stack" or "repeat").

    Returns:
        The model config.
    """
    d = P1_DIMS
    return transformer_lm_config(
        num_layers=d["num_layers"],
        model_dim=d["dim"],
        num_heads=d["num_heads"],
        num_kv_heads=d["num_kv_heads"],
        hidden_dim=d["hidden_dim"],
        vocab_size=d["vocab_size"],
        rope_theta=d["rope_theta"],
        qk_norm=d["qk_norm"],
        stack=stack,
    )


def p1_trainer_config(
    trainer_dir: str, *, max_step: int, peak_flops_per_device: float
) -> SpmdTrainer.Config:
    """The P1 trainer: FakeLmInput, summaries every step, no evalers, no checkpoint saves.

    Args:
        trainer_dir: The trainer's directory.
        max_step: Steps to train.
        peak_flops_per_device: The MFU denominator (skips the trainer's start-up CPU probe).

    Returns:
        The config; callers add a save policy, writers, etc.
    """
    cfg = SpmdTrainer.default_config().set(
        name="p1_trainer",
        dir=trainer_dir,
        max_step=max_step,
        mesh_axis_names=MESH_AXIS_NAMES,
        mesh_shape=MESH_SHAPE,
        batch_axis_names=("data", "expert", "fsdp", "seq"),
        input=FakeLmInput.default_config().set(
            is_training=True, global_batch_size=BATCH, source_length=SEQ, max_token_id=VOCAB
        ),
        model=p1_model_config(),
        learner=learner.Learner.default_config().set(
            optimizer=config_for_function(optimizers.adamw_optimizer).set(
                learning_rate=LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD
            )
        ),
        peak_flops_per_device=peak_flops_per_device,
    )
    cfg.summary_writer.write_every_n_steps = 1
    cfg.checkpointer.save_policy.n = 10**8
    return cfg
