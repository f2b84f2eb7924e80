"""Pipeline parallelism on 8 CPU devices: measured bubble vs the formula, memory per device.

    python benchmarks/pipeline_bubble.py [--repeats=5] [--microbatches=4,8,16]

1. Bubble. A stack of 8 tanh(Linear(1024)) layers pipelined over S=4 stages (GPipe: 2 layers per
   stage; circular: V=2 chunks of 1 layer per stage), microbatch of 128 rows, M microbatches.
   One forward+backward step runs V*M + S - 1 pipeline steps, so its time is
   T(M) = a*M + b. The slope `a` (least squares over the M values) is the cost of useful work
   per microbatch; the measured bubble is 1 - a*M / T(M), compared with (S-1)/(V*M+S-1).
   Timings of all configurations are interleaved; medians of `--repeats`.
2. Memory. The 8-layer decoder of tests/common/test_pipeline.py (dim 64), unpipelined
   (data=4 x model=2) vs pipelined over 4 stages (pipeline=4 x model=2): parameter bytes per
   device and XLA's compiled memory analysis of the train step (per device).

Prints one JSON object. On CPU the 8 "devices" share the host's cores, so absolute times say
nothing about real pipelining speed-ups; the ratios (bubble) do, because in SPMD pipelining an
idle stage computes on padding: a bubble step costs as much as a busy one.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

# pylint: disable=wrong-import-position
import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common.attention import pipelined_stack_config
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import config_class
from axlearn.common.layers import Linear
from axlearn.common.module import functional
from axlearn.common.pipeline import CircularSchedule, GPipeSchedule, Pipeline, pipeline_report
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

DIM, MICROBATCH, NUM_STAGES, NUM_LAYERS = 1024, 128, 4, 8


class _Chunk(BaseLayer):
    """`num_linears` layers x -> tanh(Linear(x)) of dim DIM: one chunk of the pipelined stack."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures _Chunk."""

        # Layers in the chunk.
        num_linears: int = 1

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        for i in range(self.config.num_linears):
            self._add_child(
                f"linear{i}", Linear.default_config().set(input_dim=DIM, output_dim=DIM)
            )

    def forward(self, x):
        for i in range(self.config.num_linears):
            x = jnp.tanh(getattr(self, f"linear{i}")(x))
        return x


class _LinearStack(Pipeline):
    """A Pipeline of _Chunks."""

    def forward(self, x):
        return self._run(lambda carry, _: (self.layer(carry), {}), x).carry


def _bubble_case(v: int, m: int, mesh: Mesh):
    schedule = (
        GPipeSchedule.default_config()
        if v == 1
        else CircularSchedule.default_config().set(num_virtual_stages=v)
    )
    per_chunk = NUM_LAYERS // (NUM_STAGES * v)
    layer = _Chunk.default_config().set(num_linears=per_chunk)
    pipe = (
        _LinearStack.default_config()
        .set(name="pipe", layer=layer, num_layers=NUM_STAGES, num_microbatches=m, schedule=schedule)
        .instantiate(parent=None)
    )
    params = pipe.initialize_parameters_recursively(jax.random.PRNGKey(0))
    specs = pipe.create_parameter_specs_recursively()
    shardings = jax.tree.map(
        lambda s: NamedSharding(mesh, PartitionSpec(*s.mesh_axes)),
        specs,
        is_leaf=lambda x: hasattr(x, "mesh_axes"),
    )

    def loss(params, x):
        out, _ = functional(pipe, None, params, [x], is_training=True)
        return jnp.mean(out**2)

    x = jax.random.normal(jax.random.PRNGKey(1), (m * MICROBATCH, DIM))
    with jax.set_mesh(mesh):
        params = jax.device_put(params, shardings)
        step = jax.jit(jax.value_and_grad(loss)).lower(params, x).compile()
    return lambda: jax.block_until_ready(step(params, x))


def measure_bubble(microbatches, repeats):
    """Step times per (schedule, M), interleaved; fitted and formula bubbles."""
    mesh = Mesh(np.asarray(jax.devices()[:NUM_STAGES]), ("pipeline",))
    cases = {}
    for v in (1, 2):
        for m in microbatches:
            fn = _bubble_case(v, m, mesh)
            fn()  # Warm-up.
            cases[(v, m)] = (fn, [])
    for _ in range(repeats):
        for fn, times in cases.values():
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    results = []
    for v in (1, 2):
        ms = np.array(microbatches, float)
        med = np.array([statistics.median(cases[(v, m)][1]) for m in microbatches])
        slope, intercept = np.polyfit(ms, med, 1)
        for m, t in zip(microbatches, med):
            results.append(
                dict(
                    schedule="GPipeSchedule" if v == 1 else "CircularSchedule",
                    num_stages=NUM_STAGES,
                    num_virtual_stages=v,
                    num_microbatches=int(m),
                    step_time_s=float(t),
                    step_time_per_microbatch_s=float(t / m),
                    measured_bubble=float(1 - slope * m / t),
                    formula_bubble=(NUM_STAGES - 1) / (v * m + NUM_STAGES - 1),
                )
            )
        results.append(
            dict(
                schedule="GPipeSchedule" if v == 1 else "CircularSchedule",
                fit_s_per_microbatch=float(slope),
                fit_intercept_s=float(intercept),
            )
        )
    return results


def measure_memory():
    """Per-device parameter bytes and compiled memory, unpipelined vs pipelined (S=4)."""
    axes = ("pipeline", "data", "expert", "fsdp", "seq", "model")
    out = {}
    for name, shape, pipelined in (
        ("unpipelined", (1, 4, 1, 1, 1, 2), False),
        ("pipelined_4x1", (4, 1, 1, 1, 1, 2), True),
    ):
        mesh = Mesh(np.asarray(jax.devices()).reshape(shape), axes)
        cfg = transformer_lm_config(
            num_layers=NUM_LAYERS,
            model_dim=256,
            num_heads=4,
            num_kv_heads=2,
            hidden_dim=1024,
            vocab_size=1024,
            stack="repeat",
            sharding=True,
        )
        if pipelined:
            cfg.decoder.transformer = pipelined_stack_config(
                cfg.decoder.transformer, num_stages=4, num_microbatches=4
            )
        model = cfg.set(name="model").instantiate(parent=None)
        specs = model.create_parameter_specs_recursively()
        shardings = jax.tree.map(
            lambda s, mesh=mesh: NamedSharding(mesh, PartitionSpec(*(s.mesh_axes or ()))),
            specs,
            is_leaf=lambda x: hasattr(x, "mesh_axes"),
        )
        abstract = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype or jnp.float32, sharding=sh),
            specs,
            shardings,
            is_leaf=lambda x: hasattr(x, "mesh_axes"),
        )
        batch = dict(
            input_ids=jax.ShapeDtypeStruct((16, 128), jnp.int32),
            target_labels=jax.ShapeDtypeStruct((16, 128), jnp.int32),
        )

        def loss(params, batch, model=model):
            (value, _), _ = functional(
                model, None, params, dict(input_batch=batch), is_training=True
            )
            return value

        with jax.set_mesh(mesh):
            compiled = jax.jit(jax.value_and_grad(loss)).lower(abstract, batch).compile()
        mem = compiled.memory_analysis()
        param_bytes = sum(
            int(np.prod(sh.shard_shape(tuple(s.shape)))) * 4
            for s, sh in zip(
                jax.tree.leaves(specs, is_leaf=lambda x: hasattr(x, "mesh_axes")),
                jax.tree.leaves(shardings),
            )
        )
        out[name] = dict(
            mesh=dict(zip(axes, shape)),
            param_bytes_per_device=param_bytes,
            compiled_argument_bytes=int(mem.argument_size_in_bytes),
            compiled_temp_bytes=int(mem.temp_size_in_bytes),
            compiled_output_bytes=int(mem.output_size_in_bytes),
        )
        if pipelined:
            out[name]["report"] = pipeline_report(model, specs, dict(mesh.shape))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--microbatches", default="4,8,16")
    args = parser.parse_args()
    microbatches = [int(x) for x in args.microbatches.split(",")]
    result = dict(
        devices=len(jax.devices()),
        bubble=measure_bubble(microbatches, args.repeats),
        memory=measure_memory(),
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
