"""The 1B yardstick (G1) as an SpmdTrainer config: the one home of its model and trainer.

Shared by the benchmarks that compile or train G1 (`honeycrisp_1b.py` with checkpoint saves, the
sweep, the memory report) with throughput options: batch size, remat by name
(`attention.REMAT_CHOICES`), chunked loss (`causal_lm.Model.Config.logits_chunk_size`),
attention kind and fp8 matmuls (`fp8=True`: `FP8ConfigModifier` with an amax history of 128, the
value of AXLearn's fp8 configs). The model (reference-dump structure, dim 2048, 20 layers, 16
query / 8 KV heads, SwiGLU 5632, vocab 49152, z-loss 1e-6, tied head), bf16 compute with fp32
state, FakeLmInput, AdamW, on a one-device mesh; `tiny=True` gives the same structure at a few MB
(`DIMS_TINY`) for CPU checks.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Optional

import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import config_variants  # noqa: E402  pylint: disable=wrong-import-position

from axlearn.common import learner, optimizers  # noqa: E402
from axlearn.common.attention import FlashAttention, remat_spec_by_name  # noqa: E402
from axlearn.common.config import config_for_function  # noqa: E402
from axlearn.common.input_fake import FakeLmInput  # noqa: E402
from axlearn.common.trainer import SpmdTrainer  # noqa: E402
from axlearn.common.trainer_config_modifier import FP8ConfigModifier  # noqa: E402

# G1's sizes (`plain_jax_lm.LmConfig` field names), and the same structure at a few MB.
DIMS_1B = dict(
    vocab_size=49152,
    dim=2048,
    num_layers=20,
    num_heads=16,
    num_kv_heads=8,
    hidden_dim=5632,
    rope_theta=5e5,
    qk_norm=True,
)
# The fp8 amax history length of `fp8=True` (AXLearn's fp8 configs use 128).
FP8_AMAX_HISTORY_LENGTH = 128
DIMS_TINY = dict(DIMS_1B, vocab_size=512, dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 hidden_dim=128)  # fmt: skip


def g1_dims(tiny: bool) -> dict:
    """The model sizes (`plain_jax_lm.LmConfig` field names) of G1 or of its tiny version."""
    return dict(DIMS_TINY if tiny else DIMS_1B)


def g1_trainer_config(
    trainer_dir: str,
    *,
    tiny: bool = False,
    batch: int = 8,
    seq: int = 2048,
    max_step: int = 20,
    attention: str = "flash",
    remat: str = "none",
    logits_chunk_size: Optional[int] = None,
    peak_flops_per_device: Optional[float] = None,
    fp8: bool = False,
) -> SpmdTrainer.Config:
    """The G1 trainer config on a (1, 1, 1) mesh of the reference's 3 axes.

    Args:
        trainer_dir: The trainer's directory.
        tiny: The few-MB version (`DIMS_TINY`) instead of the 1B model.
        batch: Global batch size.
        seq: Sequence length.
        max_step: Steps to train.
        attention: "flash" (FlashAttention: cuDNN on GPU for bf16) or "plain".
        remat: A name of `attention.REMAT_CHOICES` for the decoder layers.
        logits_chunk_size: The model's `logits_chunk_size` (None: full logits).
        peak_flops_per_device: The MFU denominator (None: the trainer's own).
        fp8: Train the model's `DenseGeneralBaseLayer` matmuls in fp8 with delayed scaling
            (`FP8ConfigModifier`, `fp8_amax_history_length=FP8_AMAX_HISTORY_LENGTH`); False: bf16.

    Returns:
        The config (summaries every 100 steps, no checkpoint saves).
    """
    dims = g1_dims(tiny)
    shape = dataclasses.replace(config_variants.Shape(), mesh="3axis", summary_every=100)
    model = config_variants.dump_structured_model(shape, dims)
    model.logits_chunk_size = logits_chunk_size
    stack = model.decoder.transformer
    stack.layer.remat_spec = remat_spec_by_name(remat, stack_cfg=stack)
    if attention == "flash":
        attn = stack.layer.self_attention.attention
        stack.layer.self_attention.attention = FlashAttention.default_config().set(
            **{k: v for k, v in attn.items() if k != "klass"}
        )
    cfg = SpmdTrainer.default_config().set(
        name="g1",
        dir=trainer_dir,
        max_step=max_step,
        mesh_axis_names=config_variants.DUMP_AXES,
        mesh_shape=(1, 1, 1),
        batch_axis_names=config_variants.BATCH_AXES,
        input=FakeLmInput.default_config().set(
            is_training=True,
            global_batch_size=batch,
            source_length=seq,
            max_token_id=dims["vocab_size"],
        ),
        model=model,
        learner=learner.Learner.default_config().set(
            optimizer=config_for_function(optimizers.adamw_optimizer).set(
                learning_rate=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.01
            )
        ),
        train_dtype=jnp.bfloat16,
        peak_flops_per_device=peak_flops_per_device,
    )
    cfg.summary_writer.write_every_n_steps = 100
    cfg.checkpointer.save_policy.n = 10**8
    if fp8:
        modifier = FP8ConfigModifier.default_config().set(
            fp8_amax_history_length=FP8_AMAX_HISTORY_LENGTH
        )
        cfg = modifier.instantiate()(cfg)
    return cfg
