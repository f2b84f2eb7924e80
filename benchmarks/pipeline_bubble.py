"""Pipeline parallelism on 8 CPU devices: bubble and temp memory per schedule, memory per device.

    python benchmarks/pipeline_bubble.py [--repeats=5] [--microbatches=4,8,12,16]
        [--memory_microbatches=1,2,4,8,16,32] [--schedules=gpipe,circular,1f1b,interleaved_1f1b]
        [--parts=bubble,curve,memory] [--dim=1024] [--microbatch_rows=128] [--output=F.json]

1. Bubble per schedule. A stack of 8 tanh(Linear(1024)) layers pipelined over S=4 stages with
   GPipe and 1F1B (2 layers per stage) and with the circular and interleaved 1F1B schedules
   (V=2 chunks of 1 layer per stage), microbatches of 128 rows, M microbatches. For every
   (schedule, M): the step time of the forward+backward step and XLA's compiled temp memory
   (`memory_analysis().temp_size_in_bytes`, per device). A step runs V*M + S - 1 pipeline ticks
   of equal cost (in SPMD an idle stage computes on padding, so a bubble tick costs as much as a
   busy one): step_time(M) = (V*M + S - 1) * t_tick. The least-squares line a*M + b over the M
   values gives t_tick = a / V and the intercept b, which should be (S - 1) * t_tick; the fitted
   bubble b / (a*M + b) is compared with the formula (S-1)/(V*M+S-1) (`fitted_over_formula`,
   and `intercept_over_formula` = b / ((S-1) a / V), 1 when the schedule behaves as the formula
   says). On CPU the 8 "devices" share the host's cores, so a tick's time is the sum of all
   stages' work and absolute times say nothing about real pipelining speed-ups; the tick
   structure (how many ticks a step runs) is what the fit measures, and that is what the formula
   describes. Timings of all cases are interleaved round-robin; the fit uses each case's median
   of `--repeats` (at least 3), and is repeated on the fastest times (`fit_min`) and on the
   median process CPU time of a step (`fit_cpu`: the CPU seconds of all stages, idle slots
   included, which other jobs on a shared host change less than the wall time).
2. Temp memory curve: compiled temp bytes per device of GPipe and 1F1B (S=4) for each M of
   `--memory_microbatches` (compile only), with 1F1B's ring slots.
3. Memory. The 8-layer decoder of tests/common/test_pipeline.py (dim 256), unpipelined
   (data=4 x model=2) vs pipelined over 4 stages (pipeline=4 x model=2) with GPipe and 1F1B:
   parameter bytes per device and XLA's compiled memory analysis of the train step.

Prints one JSON object (and writes it to --output).
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

from axlearn.common.attention import pipelined_stack_config, schedule_config
from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import config_class
from axlearn.common.layers import Linear
from axlearn.common.module import functional
from axlearn.common.pipeline import Pipeline, pipeline_report
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


# (schedule name, virtual stages).
SCHEDULES = (("gpipe", 1), ("circular", 2), ("1f1b", 1), ("interleaved_1f1b", 2))


def _bubble_case(name: str, v: int, m: int, mesh: Mesh, compile_only: bool = False):
    per_chunk = NUM_LAYERS // (NUM_STAGES * v)
    layer = _Chunk.default_config().set(num_linears=per_chunk)
    pipe = (
        _LinearStack.default_config()
        .set(
            name="pipe",
            layer=layer,
            num_layers=NUM_STAGES,
            num_microbatches=m,
            schedule=schedule_config(name, num_virtual_stages=v),
        )
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
    temp = int(step.memory_analysis().temp_size_in_bytes)
    if compile_only:
        return None, temp, pipe.schedule
    return (lambda: jax.block_until_ready(step(params, x))), temp, pipe.schedule


def fit_bubble(microbatches, step_times, *, num_stages: int, num_virtual_stages: int) -> dict:
    """Fits step_time(M) = a * M + b; the bubble that fit implies against the formula.

    A step runs V * M + S - 1 pipeline ticks of equal cost (in SPMD an idle stage computes on
    padding), so step_time(M) = (V * M + S - 1) * t_tick: the slope is a = V * t_tick and the
    intercept b = (S - 1) * t_tick. The measured bubble at M is b / step_time_fit(M) and equals
    the formula (S - 1) / (V * M + S - 1) at every M iff b / ((S - 1) * a / V) = 1.

    Args:
        microbatches: The M values.
        step_times: The step time per M (seconds).
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        A dict with fit_s_per_microbatch (a), fit_s_per_tick (a / V), fit_intercept_s (b),
        fit_b_microbatches (b / a) and formula_b_microbatches ((S - 1) / V),
        intercept_over_formula (b / ((S - 1) a / V)) and per_m: {M: dict(fitted_bubble,
        formula_bubble, fitted_over_formula, measured_bubble (1 - a M / measured time))}.
    """
    s, v = num_stages, num_virtual_stages
    ms = np.asarray(microbatches, float)
    times = np.asarray(step_times, float)
    slope, intercept = np.polyfit(ms, times, 1)
    per_m = {}
    for m, t in zip(microbatches, times):
        formula = (s - 1) / (v * m + s - 1)
        fitted = intercept / (slope * m + intercept)
        per_m[int(m)] = dict(
            fitted_bubble=float(fitted),
            formula_bubble=float(formula),
            fitted_over_formula=float(fitted / formula),
            measured_bubble=float(1 - slope * m / t),
        )
    return dict(
        fit_s_per_microbatch=float(slope),
        fit_s_per_tick=float(slope / v),
        fit_intercept_s=float(intercept),
        # t(M) = a (M + b): b in microbatches, the formula's b is (S - 1) / V.
        fit_b_microbatches=float(intercept / slope),
        formula_b_microbatches=(s - 1) / v,
        intercept_over_formula=float(intercept / ((s - 1) * slope / v)),
        per_m=per_m,
    )


def measure_bubble(microbatches, repeats, schedules=SCHEDULES):
    """Step times and compiled temp memory per (schedule, M), interleaved; fitted bubbles.

    Every case is timed `repeats` times (at least 3), the cases interleaved (a new random
    order each round) so load changes on a shared host hit all of them alike. The fit uses
    each case's median; `fit_min` the fastest times; `fit_cpu` the median process CPU time of
    a step (the device-seconds all stages spent, idle slots included, which other jobs on the
    host change far less than the wall time).

    Args:
        microbatches: The M values.
        repeats: Timed steps per case.
        schedules: (schedule name, virtual stages) pairs.

    Returns:
        One row per (schedule, M) and one fit row per schedule.
    """
    repeats = max(3, repeats)
    mesh = Mesh(np.asarray(jax.devices()[:NUM_STAGES]), ("pipeline",))
    cases = {}
    for name, v in schedules:
        for m in microbatches:
            fn, temp, schedule = _bubble_case(name, v, m, mesh)
            fn()  # Warm-up.
            cases[(name, m)] = (fn, [], temp, schedule)
    cpu = {key: [] for key in cases}
    order = list(cases)
    rng = np.random.default_rng(0)
    for _ in range(repeats):
        # A fresh order every round: a load that rises during a round must not always land on
        # the largest M (that would tilt the fitted line).
        for i in rng.permutation(len(order)):
            key = order[i]
            fn, times, _, _ = cases[key]
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times.append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
    results = []
    for name, v in schedules:
        medians = [statistics.median(cases[(name, m)][1]) for m in microbatches]
        fastest = [min(cases[(name, m)][1]) for m in microbatches]
        cpu_medians = [statistics.median(cpu[(name, m)]) for m in microbatches]
        fit = fit_bubble(microbatches, medians, num_stages=NUM_STAGES, num_virtual_stages=v)
        fit_min = fit_bubble(microbatches, fastest, num_stages=NUM_STAGES, num_virtual_stages=v)
        fit_cpu = fit_bubble(microbatches, cpu_medians, num_stages=NUM_STAGES, num_virtual_stages=v)
        for m, t, t_min in zip(microbatches, medians, fastest):
            _, times, temp, schedule = cases[(name, m)]
            per_m = fit["per_m"][m]
            assert abs(per_m["formula_bubble"] - schedule.bubble_fraction()) < 1e-12
            results.append(
                dict(
                    schedule=type(schedule).__name__,
                    num_stages=NUM_STAGES,
                    num_virtual_stages=v,
                    num_microbatches=int(m),
                    step_time_median_s=float(t),
                    step_time_min_s=float(t_min),
                    step_times_s=[float(x) for x in times],
                    step_time_per_microbatch_s=float(t / m),
                    compiled_temp_bytes=temp,
                    num_steps=schedule.num_steps(),
                    **per_m,
                    fitted_over_formula_min=fit_min["per_m"][m]["fitted_over_formula"],
                    cpu_times_s=[float(x) for x in cpu[(name, m)]],
                    cpu_fitted_bubble=fit_cpu["per_m"][m]["fitted_bubble"],
                    cpu_fitted_over_formula=fit_cpu["per_m"][m]["fitted_over_formula"],
                )
            )
        results.append(
            dict(
                schedule=name,
                **{k: v_ for k, v_ in fit.items() if k != "per_m"},
                fit_min={k: v_ for k, v_ in fit_min.items() if k != "per_m"},
                fit_cpu={k: v_ for k, v_ in fit_cpu.items() if k != "per_m"},
            )
        )
    return results


def measure_temp_memory(microbatches) -> list[dict]:
    """Compiled temp bytes per device of GPipe and 1F1B (S = 4) for each M (compile only).

    Args:
        microbatches: The M values.

    Returns:
        Rows of schedule, num_microbatches, compiled_temp_bytes, ring_slots (1F1B) and
        temp_over_gpipe.
    """
    mesh = Mesh(np.asarray(jax.devices()[:NUM_STAGES]), ("pipeline",))
    rows, gpipe = [], {}
    for name in ("gpipe", "1f1b"):
        for m in microbatches:
            _, temp, schedule = _bubble_case(name, 1, m, mesh, compile_only=True)
            if name == "gpipe":
                gpipe[m] = temp
            row = dict(schedule=type(schedule).__name__, num_microbatches=m)
            row.update(compiled_temp_bytes=temp, temp_over_gpipe=temp / gpipe[m])
            if schedule.explicit_backward:
                row["ring_slots"] = schedule.tick_table()["ring_slots"]
            rows.append(row)
    return rows


def summarize(bubble: list[dict]) -> dict:
    """Temp-memory ratios against GPipe at the same M (16 microbatches in the acceptance check).

    Args:
        bubble: `measure_bubble`'s rows.

    Returns:
        {schedule: {M: temp bytes / GPipe's temp bytes}}.
    """
    rows = [r for r in bubble if "num_microbatches" in r]
    gpipe = {
        r["num_microbatches"]: r["compiled_temp_bytes"]
        for r in rows
        if r["schedule"] == "GPipeSchedule"
    }
    out = {}
    for r in rows:
        out.setdefault(r["schedule"], {})[str(r["num_microbatches"])] = (
            r["compiled_temp_bytes"] / gpipe[r["num_microbatches"]]
        )
    return out


def measure_memory():
    """Per-device parameter bytes and compiled memory, unpipelined vs pipelined (S=4)."""
    axes = ("pipeline", "data", "expert", "fsdp", "seq", "model")
    out = {}
    for name, shape, pipelined in (
        ("unpipelined", (1, 4, 1, 1, 1, 2), None),
        ("pipelined_4x1", (4, 1, 1, 1, 1, 2), "gpipe"),
        ("pipelined_4x1_1f1b", (4, 1, 1, 1, 1, 2), "1f1b"),
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
                cfg.decoder.transformer, num_stages=4, num_microbatches=4, schedule=pipelined
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
    global DIM, MICROBATCH  # pylint: disable=global-statement
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--microbatches", default="4,8,12,16")
    parser.add_argument(
        "--memory_microbatches", default="1,2,4,8,16,32", help="M values of the memory curve."
    )
    parser.add_argument(
        "--schedules",
        default=",".join(name for name, _ in SCHEDULES),
        help="Schedules of the bubble part (names of SCHEDULES).",
    )
    parser.add_argument(
        "--parts", default="bubble,curve,memory", help="Which parts to run (comma-separated)."
    )
    parser.add_argument("--dim", type=int, default=DIM, help="Width of the bubble part's layers.")
    parser.add_argument(
        "--microbatch_rows", type=int, default=MICROBATCH, help="Rows per microbatch (bubble)."
    )
    parser.add_argument("--output", default=None, help="Also write the JSON to this file.")
    args = parser.parse_args()
    DIM, MICROBATCH = args.dim, args.microbatch_rows
    microbatches = [int(x) for x in args.microbatches.split(",")]
    parts = args.parts.split(",")
    chosen = args.schedules.split(",")
    result = dict(
        devices=len(jax.devices()),
        dim=DIM,
        microbatch_rows=MICROBATCH,
        load_average_start=list(os.getloadavg()),
    )
    if "bubble" in parts:
        bubble = measure_bubble(
            microbatches, args.repeats, tuple(sv for sv in SCHEDULES if sv[0] in chosen)
        )
        result.update(bubble=bubble)
        if "gpipe" in chosen:
            result.update(temp_memory_vs_gpipe=summarize(bubble))
    if "curve" in parts:
        result.update(
            temp_memory_curve=measure_temp_memory(
                [int(x) for x in args.memory_microbatches.split(",")]
            )
        )
    if "memory" in parts:
        result.update(memory=measure_memory())
    result.update(load_average_end=list(os.getloadavg()))
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
