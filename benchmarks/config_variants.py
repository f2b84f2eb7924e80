"""Each way of writing the P1 model, through the full SpmdTrainer vs plain JAX doing the same math.

P1 (docs/performance.md): decoder, 2 layers, d=256, 4 heads of 64, RoPE theta 5e5, QK-norm, SwiGLU
hidden 1024, vocab 32768, sequence 128, global batch 4, AdamW, fp32, one device.

The base variant, `dump_p1`, is P1 written field by field in the structure of the reference dump
(tests/testdata/trainer/honeycrisp_trainer_config.txt), as a new user writes it:
`GroupedQueryAttention` with `RoFormerQKVLinear(rotary_value=False)` wrapping
`FusedGroupedQKVLinear`, `ScaleQuery` / `ScaleKey` with RMSNorm, `causal=True`,
`RepeatedTransformerLayer`, `z_loss_scale=1e-6` on the model, the dump's partition specs on a
3-axis mesh ("data", "fsdp", "model") of size 1, `FakeLmInput`, summaries every step. Each other
variant changes one thing:

    separate_qkv    GroupedQKVLinear (q_proj, k_proj, v_proj) instead of the fused projection
    gqa             2 KV heads instead of 4 (GroupedQueryAttention with num_kv_heads=2)
    mha             MultiheadAttention with QKVLinear (no GQA classes)
    mask_fn         `mask=causal_mask` instead of `causal=True`
    explicit_bias   `causal=False` and the decoder's CausalAttentionLogitBiasLayer (a bias tensor)
    stacked         StackedTransformerLayer instead of RepeatedTransformerLayer
    no_z_loss       z_loss_scale=0
    untied_head     a separate LmHead instead of the tied embedding
    mesh_1axis      a 1-axis mesh ("data",) with no partition specs naming other axes
    mesh_6axis      the dump's 6-axis mesh (pipeline, data, expert, fsdp, seq, model)
    summaries_100   summaries written every 100 steps instead of every step
    builder_p1      P1 built by `transformer_lm_config(stack="stack")` (benchmarks/p1.py)

The reference for each variant is `benchmarks/plain_jax_lm.py` configured to the same math
(fused or separate projections, KV heads, scan over layers or unrolled, z-loss, tied head) with
`optax.adamw`, fed the same FakeLmInput batches in a loop that reads step N-1's loss while step N
runs (as the trainer does).

Interleaved: in each round every variant runs the trainer (fresh, compiled) and plain JAX, the
trainer first in even rounds and plain JAX first in odd ones;
the first `SKIP` steps of each run are dropped; a run's time is its median step time; a variant's
ratio is the median over rounds of the per-round ratio trainer / plain. Each run also reports its
median process CPU time per step (all threads; the trainer's host work included), whose ratio is
far less disturbed than wall time when other processes share the machine.

Prints one JSON object. Usage:
    python benchmarks/config_variants.py [--rounds 3] [--steps 20] [--variants dump_p1,stacked]
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
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plain_jax_lm  # noqa: E402  pylint: disable=wrong-import-position
from p1 import (  # noqa: E402  pylint: disable=wrong-import-position
    B1,
    B2,
    BATCH,
    EPS,
    LR,
    MESH_AXIS_NAMES,
    P1_DIMS,
    SEQ,
    VOCAB,
    WD,
    p1_model_config,
)

from axlearn.common import causal_lm, learner, optimizers  # noqa: E402
from axlearn.common.attention import (  # noqa: E402
    CausalAttentionLogitBiasLayer,
    FusedGroupedQKVLinear,
    GroupedQKVLinear,
    GroupedQueryAttention,
    MultiheadAttention,
    QKVLinear,
    RepeatedTransformerLayer,
    RoFormerQKVLinear,
    ScaleKey,
    ScaleQuery,
    StackedTransformerLayer,
    TransformerLayer,
    causal_mask,
)
from axlearn.common.config import config_for_function  # noqa: E402
from axlearn.common.decoder import Decoder, LmHead  # noqa: E402
from axlearn.common.device_peak import device_peak_flops  # noqa: E402
from axlearn.common.input_fake import FakeLmInput  # noqa: E402
from axlearn.common.layers import RMSNorm  # noqa: E402
from axlearn.common.param_init import (  # noqa: E402
    PARAM_REGEXP_WEIGHT,
    DefaultInitializer,
    WeightInitializer,
)
from axlearn.common.trainer import SpmdTrainer  # noqa: E402

SKIP = 3
Z_LOSS = 1e-6
DUMP_AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True)
class Shape:
    """One way of writing the model and trainer (see the module docstring)."""

    qkv: str = "fused"  # "fused", "separate" or "mha".
    num_kv_heads: int = 4
    mask: str = "causal"  # "causal", "mask_fn" or "bias".
    stack: str = "repeat"  # "repeat" or "stack".
    z_loss_scale: float = Z_LOSS
    tied: bool = True
    mesh: str = "3axis"  # "1axis", "3axis" or "6axis".
    summary_every: int = 1
    builder: bool = False  # P1 from transformer_lm_config (benchmarks/p1.py).


VARIANTS = dict(
    dump_p1=Shape(),
    separate_qkv=Shape(qkv="separate"),
    gqa=Shape(num_kv_heads=2),
    mha=Shape(qkv="mha"),
    mask_fn=Shape(mask="mask_fn"),
    explicit_bias=Shape(mask="bias"),
    stacked=Shape(stack="stack"),
    no_z_loss=Shape(z_loss_scale=0.0),
    untied_head=Shape(tied=False),
    mesh_1axis=Shape(mesh="1axis"),
    mesh_6axis=Shape(mesh="6axis"),
    summaries_100=Shape(summary_every=100),
    builder_p1=Shape(builder=True, stack="stack", z_loss_scale=0.0, mesh="6axis"),
)


def _norm() -> RMSNorm.Config:
    return RMSNorm.default_config().set(eps=1e-5, forward_dtype=None)


def dump_structured_model(shape: Shape, dims: Optional[dict] = None) -> causal_lm.Model.Config:
    """The model written field by field in the reference dump's structure.

    Args:
        shape: The variant.
        dims: Model sizes in `plain_jax_lm.LmConfig` field names (default: P1_DIMS).

    Returns:
        The causal LM config.
    """
    d = dict(P1_DIMS if dims is None else dims)
    sharded = shape.mesh != "1axis"
    batch_axes = BATCH_AXES if sharded else ("data",)
    fsdp = "fsdp" if sharded else None
    model_axis = "model" if sharded else None

    model = causal_lm.Model.default_config().set(
        z_loss_scale=shape.z_loss_scale,
        dtype=jnp.float32,
        batch_axis_names=batch_axes,
        param_init=DefaultInitializer.default_config().set(
            init_by_param_name={
                PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(
                    fan="fan_in", distribution="normal", scale=1.0
                )
            }
        ),
    )
    decoder: Decoder.Config = model.decoder
    decoder.set(
        dim=d["dim"],
        vocab_size=d["vocab_size"],
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        output_norm=_norm(),
        logits_partition_spec=(batch_axes, None, model_axis),
        attention_mask=CausalAttentionLogitBiasLayer.default_config()
        if shape.mask == "bias"
        else None,
    )
    decoder.emb.token_emb.param_partition_spec = (fsdp, model_axis)
    if not shape.tied:
        decoder.lm_head = LmHead.default_config().set(param_partition_spec=(None, model_axis))

    stack_cls = RepeatedTransformerLayer if shape.stack == "repeat" else StackedTransformerLayer
    decoder.transformer = stack_cls.default_config().set(num_layers=d["num_layers"])
    layer: TransformerLayer.Config = decoder.transformer.layer

    if shape.qkv == "fused":
        qkv = FusedGroupedQKVLinear.default_config().set(num_kv_heads=d["num_kv_heads"])
    elif shape.qkv == "separate":
        qkv = GroupedQKVLinear.default_config().set(num_kv_heads=d["num_kv_heads"])
    else:
        qkv = QKVLinear.default_config()
    qkv.layer.set(bias=False, param_partition_spec=(fsdp, model_axis, None))
    rope = RoFormerQKVLinear.default_config().set(input_linear=qkv, rotary_value=False)
    rope.rope_pos_emb_layer.theta = d["rope_theta"]
    attention_cls = MultiheadAttention if shape.qkv == "mha" else GroupedQueryAttention
    attention = attention_cls.default_config().set(num_heads=d["num_heads"], input_linear=rope)
    if shape.mask == "causal":
        attention.causal = True
    elif shape.mask == "mask_fn":
        attention.mask = causal_mask
    attention.output_linear.set(bias=False, param_partition_spec=(fsdp, model_axis, None))
    attention.query_scale = ScaleQuery.default_config().set(norm=_norm())
    attention.key_scale = ScaleKey.default_config().set(norm=_norm())
    layer.self_attention.set(attention=attention, norm=_norm(), structure="prenorm")

    ff = layer.feed_forward.set(
        hidden_dim=d["hidden_dim"],
        activation=("nn.silu", "linear"),
        norm=_norm(),
        structure="prenorm",
    )
    ff.linear1.set(
        bias=False,
        param_partition_spec=(fsdp, model_axis),
        output_partition_spec=(batch_axes, None, model_axis),
    )
    ff.linear2.set(
        bias=False,
        param_partition_spec=(model_axis, fsdp),
        output_partition_spec=(batch_axes, None, model_axis),
    )
    return model


def trainer_config(
    shape: Shape, trainer_dir: str, *, max_step: int, peak_flops: float
) -> SpmdTrainer.Config:
    """The variant's SpmdTrainer: FakeLmInput, AdamW, no evalers, no checkpoint saves.

    Args:
        shape: The variant.
        trainer_dir: The trainer's directory.
        max_step: Steps to train.
        peak_flops: The MFU denominator.

    Returns:
        The trainer config.
    """
    if shape.mesh == "1axis":
        axes, batch_axes = ("data",), ("data",)
    elif shape.mesh == "3axis":
        axes, batch_axes = DUMP_AXES, BATCH_AXES
    else:
        axes, batch_axes = MESH_AXIS_NAMES, ("data", "expert", "fsdp", "seq")
    model = p1_model_config(stack=shape.stack) if shape.builder else dump_structured_model(shape)
    cfg = SpmdTrainer.default_config().set(
        name="variant_trainer",
        dir=trainer_dir,
        max_step=max_step,
        mesh_axis_names=axes,
        mesh_shape=(1,) * len(axes),
        batch_axis_names=batch_axes,
        input=FakeLmInput.default_config().set(
            is_training=True, global_batch_size=BATCH, source_length=SEQ, max_token_id=VOCAB
        ),
        model=model,
        learner=learner.Learner.default_config().set(
            optimizer=config_for_function(optimizers.adamw_optimizer).set(
                learning_rate=LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD
            )
        ),
        peak_flops_per_device=peak_flops,
    )
    cfg.summary_writer.write_every_n_steps = shape.summary_every
    cfg.checkpointer.save_policy.n = 10**8
    return cfg


def plain_config(shape: Shape) -> plain_jax_lm.LmConfig:
    """The plain-JAX model doing the variant's math."""
    dims = dict(P1_DIMS)
    if shape.qkv != "mha":
        dims["num_kv_heads"] = shape.num_kv_heads
    return plain_jax_lm.LmConfig(
        **dims,
        z_loss_scale=shape.z_loss_scale,
        fused_qkv=shape.qkv == "fused",
        tied_embedding=shape.tied,
    )


class _StampedTrainer(SpmdTrainer):
    """SpmdTrainer that stamps the process CPU time at each step's host sync."""

    def _finish_step(self, pending):
        record = super()._finish_step(pending)
        self._cpu_stamps.append((pending.step, time.process_time()))
        return record


def _cpu_median(stamps: list) -> float:
    """Median process CPU seconds between consecutive stamps after step SKIP."""
    kept = [t for step, t in stamps if step >= SKIP]
    return statistics.median(b - a for a, b in zip(kept, kept[1:]))


def run_trainer(shape: Shape, steps: int, peak: float) -> dict:
    """One fresh trainer run: median reported step time and CPU time per step after SKIP steps."""
    trainer_dir = tempfile.mkdtemp(prefix="variant_trainer_")
    try:
        cfg = trainer_config(shape, trainer_dir, max_step=steps, peak_flops=peak)
        cfg.klass = _StampedTrainer
        devices = np.array(jax.devices()[:1]).reshape(cfg.mesh_shape)
        trainer = cfg.instantiate(parent=None, devices=devices)
        trainer._cpu_stamps = []  # pylint: disable=protected-access
        trainer.run(jax.random.PRNGKey(0))
        with open(os.path.join(trainer_dir, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    finally:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    kept = [r["perf/step_time_s"] for r in records if r["step"] > SKIP and "perf/step_time_s" in r]
    return dict(
        median_s=statistics.median(kept),
        cpu_median_s=_cpu_median(trainer._cpu_stamps),  # pylint: disable=protected-access
        loss_last=records[-1]["loss"],
    )


def _batches():
    return iter(
        FakeLmInput.default_config()
        .set(
            name="input",
            is_training=True,
            global_batch_size=BATCH,
            source_length=SEQ,
            max_token_id=VOCAB,
        )
        .instantiate(parent=None)
    )


def run_plain(shape: Shape, step_fn: Callable, steps: int) -> dict:
    """The plain-JAX loop (pipelined on the loss) for `steps` steps; median step time."""
    cfg = plain_config(shape)
    params = plain_jax_lm.init_params(jax.random.PRNGKey(0), cfg)
    if shape.stack == "repeat":
        params = plain_jax_lm.repeat_layers(params)
    optimizer = optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD)
    opt_state = optimizer.init(params)
    batches = _batches()
    device = jax.devices()[0]
    times, stamps, pending = [], [], None
    last = time.perf_counter()
    for step in range(1, steps + 1):
        batch = jax.device_put(next(batches), device)
        params, opt_state, loss, _ = step_fn(params, opt_state, batch)
        if pending is not None:
            float(pending)
            now = time.perf_counter()
            times.append(now - last)
            stamps.append((step - 1, time.process_time()))
            last = now
        pending = loss
    loss_last = float(pending)
    times.append(time.perf_counter() - last)
    stamps.append((steps, time.process_time()))
    return dict(
        median_s=statistics.median(times[SKIP:]),
        cpu_median_s=_cpu_median(stamps),
        loss_last=loss_last,
    )


def main() -> None:
    """Runs the interleaved rounds and prints the JSON result."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="Comma-separated names.")
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {sorted(VARIANTS)}")

    # Rounds after the first reuse the compiled programs (same HLO) from a persistent cache.
    jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="variants_jit_cache_"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    load_before = os.getloadavg()
    peak = device_peak_flops(jax.devices()[:1], dtype="float32").flops_per_s
    optimizer = optax.adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD)
    plain_steps = {}
    for name in names:
        cfg = plain_config(VARIANTS[name])
        if cfg not in plain_steps:
            plain_steps[cfg] = plain_jax_lm.make_train_step(cfg, optimizer)
    rounds = {name: [] for name in names}
    for round_index in range(args.rounds):
        for name in names:
            shape = VARIANTS[name]
            # Alternate which side runs first (trainer first in even rounds), so that an
            # order effect (caches, allocator state, the machine's clock) cancels in the median.
            if round_index % 2 == 0:
                trainer = run_trainer(shape, args.steps, peak)
                plain = run_plain(shape, plain_steps[plain_config(shape)], args.steps)
            else:
                plain = run_plain(shape, plain_steps[plain_config(shape)], args.steps)
                trainer = run_trainer(shape, args.steps, peak)
            rounds[name].append(
                dict(
                    trainer_s=trainer["median_s"],
                    plain_s=plain["median_s"],
                    ratio=trainer["median_s"] / plain["median_s"],
                    trainer_cpu_s=trainer["cpu_median_s"],
                    plain_cpu_s=plain["cpu_median_s"],
                    cpu_ratio=trainer["cpu_median_s"] / plain["cpu_median_s"],
                    trainer_loss_last=trainer["loss_last"],
                    plain_loss_last=plain["loss_last"],
                )
            )
            print(name, json.dumps(rounds[name][-1]), file=sys.stderr, flush=True)
    result = {}
    for name in names:
        rs = rounds[name]
        result[name] = dict(
            trainer_s_per_step=statistics.median(r["trainer_s"] for r in rs),
            plain_jax_s_per_step=statistics.median(r["plain_s"] for r in rs),
            ratio=statistics.median(r["ratio"] for r in rs),
            round_ratios=[round(r["ratio"], 4) for r in rs],
            cpu_ratio=statistics.median(r["cpu_ratio"] for r in rs),
            round_cpu_ratios=[round(r["cpu_ratio"], 4) for r in rs],
            rounds=rs,
        )
    print(
        json.dumps(
            dict(
                steps=args.steps,
                skipped_steps=SKIP,
                variants=result,
                cpu_probe_gflops=peak / 1e9,
                load_average_before=load_before,
                load_average_after=os.getloadavg(),
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
