"""A ~1B-parameter honeycrisp-structured model trained in bf16 through SpmdTrainer on one device.

The model is written in the reference dump's structure (`config_variants.dump_structured_model`:
GroupedQueryAttention with RoFormerQKVLinear over FusedGroupedQKVLinear, QK-norm, causal,
RepeatedTransformerLayer, z-loss 1e-6, tied head) at dim 2048, 20 layers, 16 query / 8 KV heads of
128, SwiGLU hidden 5632, vocab 49152 (about 1.0B parameters); fp32 parameters and optimizer
state, bf16 compute (`train_dtype`), sequence 2048, global batch 8, FakeLmInput, AdamW, summaries
every 100 steps. `--attention flash` uses FlashAttention (cuDNN on GPU for bf16).

Prints one JSON object: parameters, model FLOPs per step, median step time after 3 warm-up steps,
MFU against the device's peak (axlearn.common.device_peak; H100/H200 bf16 dense), tokens/s.
On an accelerator only; `--tiny` runs a few-MB version of the same structure on CPU to check the
script.

Usage: python benchmarks/honeycrisp_1b.py [--steps 20] [--attention flash|plain] [--tiny]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import config_variants  # noqa: E402  pylint: disable=wrong-import-position

from axlearn.common import learner, optimizers  # noqa: E402
from axlearn.common.attention import FlashAttention  # noqa: E402
from axlearn.common.config import config_for_function  # noqa: E402
from axlearn.common.device_peak import device_peak_flops  # noqa: E402
from axlearn.common.flops import lm_training_flops, matmul_param_count  # noqa: E402
from axlearn.common.input_fake import FakeLmInput  # noqa: E402
from axlearn.common.trainer import SpmdTrainer  # noqa: E402

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
DIMS_TINY = dict(DIMS_1B, vocab_size=512, dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 hidden_dim=128)  # fmt: skip
SKIP = 3


def main() -> None:
    """Trains and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--attention", choices=("flash", "plain"), default="flash")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="A tiny model, to check on CPU.")
    args = parser.parse_args()
    dims = DIMS_TINY if args.tiny else DIMS_1B
    seq, batch = (32, 2) if args.tiny else (args.seq, args.batch)

    shape = dataclasses.replace(config_variants.Shape(), mesh="3axis", summary_every=100)
    model = config_variants.dump_structured_model(shape, dims)
    layer = model.decoder.transformer.layer
    if args.attention == "flash":
        attention = layer.self_attention.attention
        layer.self_attention.attention = FlashAttention.default_config().set(
            **{k: v for k, v in attention.items() if k != "klass"}
        )
    device = jax.devices()[0]
    peak = device_peak_flops([device], dtype=jnp.bfloat16)
    trainer_dir = tempfile.mkdtemp(prefix="honeycrisp_1b_")
    try:
        cfg = SpmdTrainer.default_config().set(
            name="honeycrisp_1b",
            dir=trainer_dir,
            max_step=args.steps,
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
            peak_flops_per_device=peak.flops_per_s,
        )
        cfg.summary_writer.write_every_n_steps = 100
        cfg.checkpointer.save_policy.n = 10**8
        trainer = cfg.instantiate(parent=None, devices=np.array([device]).reshape(1, 1, 1))
        trainer.run(jax.random.PRNGKey(0))
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        specs = trainer.model.create_parameter_specs_recursively()
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    num_params = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(specs))
    flops = lm_training_flops(
        matmul_params=matmul_param_count(specs),
        num_layers=dims["num_layers"],
        num_heads=dims["num_heads"],
        per_head_dim=dims["dim"] // dims["num_heads"],
        seq_len=seq,
        global_batch_size=batch,
    )
    step_s = statistics.median(
        r["perf/step_time_s"] for r in records if r["step"] > SKIP and "perf/step_time_s" in r
    )
    print(
        json.dumps(
            dict(
                device=device.device_kind,
                attention=args.attention,
                parameters=num_params,
                seq_len=seq,
                global_batch=batch,
                model_tflops_per_step=flops.total_flops / 1e12,
                step_s=step_s,
                mfu=flops.total_flops / step_s / peak.flops_per_s,
                peak_tflops=peak.flops_per_s / 1e12,
                peak_source=peak.describe(),
                tokens_per_s=seq * batch / step_s,
                loss_first=records[0]["loss"],
                loss_last=records[-1]["loss"],
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
