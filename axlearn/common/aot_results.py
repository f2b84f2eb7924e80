"""What an ahead-of-time compile produced, and the report built from it.

`aot_compilation.compile_trainer` returns an `AotCompileResult`; `report_from_result` turns it into
an `AotReport` (per-chip memory vs the chip's HBM, FLOPs, XLA's step-time estimate, the mesh rule),
which `write_report` stores as JSON at `default_report_path` unless the user names a path. These
names are re-exported by `axlearn.common.aot_compilation`, their public home.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Optional

import numpy as np

from axlearn.common.system_characteristics import SystemCharacteristics

# The prefix of the error of a compile refused because the state alone exceeds the chip's HBM.
STATE_EXCEEDS_HBM = "State exceeds HBM"


@dataclasses.dataclass
class AotCompileResult:
    """What `compile_trainer` produced.

    Attributes:
        compiled: The compiled train step (None when compilation failed).
        trainer: The trainer built on the topology's devices.
        system: The slice's characteristics.
        num_slices: Number of slices.
        mesh_selector: The instance type the mesh rules were matched against.
        mesh_rule: The regex of the mesh rule that chose the mesh (None: the default mesh).
        build_seconds: Time to build the trainer.
        compile_seconds: Time to lower and compile the train step.
        error: XLA's error message when compilation failed (e.g. out of HBM).
        hlo_text: The optimized HLO (when requested and compiled).
    """

    compiled: Any
    trainer: Any
    system: SystemCharacteristics
    num_slices: int
    mesh_selector: str
    mesh_rule: Optional[str]
    build_seconds: float
    compile_seconds: float
    error: Optional[str] = None
    hlo_text: Optional[str] = None


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _parse_size(text: str) -> int:
    value, unit = re.fullmatch(r"([0-9.]+)([KMGT]?)B?", text).groups()
    return int(float(value) * _UNITS[unit])


def bytes_needed_from_oom(message: str) -> Optional[int]:
    """Returns the per-chip bytes an XLA out-of-HBM compile error says the program needs.

    XLA:TPU words it several ways ("Used 49.34G of 32.00G hbm", "Requires 3.84T, has 90.96G",
    "the total memory required for HLO temporaries (36.40G) exceeds available HBM (15.75G)"); the
    last counts temporaries only, so the caller adds arguments and outputs.

    Args:
        message: The error text.

    Returns:
        Bytes (XLA's G is GiB), or None if no size is found.
    """
    size = r"([0-9.]+[KMGT]?)"
    for pattern in (rf"Used {size} of", rf"Requires {size},", rf"required for [^(]*\({size}\)"):
        m = re.search(pattern, message)
        if m:
            return _parse_size(m.group(1))
    return None


def state_bytes_per_chip(specs: Any, shardings: Any) -> int:
    """Bytes of one device's shards of a tree of specs (the largest device).

    Args:
        specs: A tree of `TensorSpec`s (shape and dtype) of the trainer state.
        shardings: The matching tree of `jax.sharding.Sharding`s.

    Returns:
        The bytes held by the device that holds the most.
    """
    # pylint: disable-next=import-outside-toplevel
    import jax

    from axlearn.common import utils  # pylint: disable=import-outside-toplevel

    total = 0
    is_spec = lambda x: isinstance(x, (utils.TensorSpec, jax.ShapeDtypeStruct))  # noqa: E731
    spec_leaves = jax.tree.leaves(specs, is_leaf=is_spec)
    sharding_leaves = jax.tree.leaves(shardings)
    if len(spec_leaves) != len(sharding_leaves):
        raise ValueError(f"{len(spec_leaves)} specs but {len(sharding_leaves)} shardings.")
    pairs = zip(spec_leaves, sharding_leaves)
    for spec, sharding in pairs:
        shard = sharding.shard_shape(tuple(spec.shape))
        total += math.prod(shard) * np.dtype(spec.dtype).itemsize
    return total


@dataclasses.dataclass
class AotReport:
    """The result of compiling a trainer for a topology: does it fit, how fast should it be.

    Memory numbers are per chip, in bytes (XLA's memory analysis of one device's program).
    `total_bytes` = arguments + outputs + temporaries + generated code - aliased (donated).
    When XLA refuses the program (out of HBM), only `bytes_needed` (from its message, plus
    arguments where it counted temporaries only) and the analytic state bytes are known.

    Attributes:
        config: "module:config" or a description of the trainer config.
        topology: Slice type ("v5litepod-256").
        num_slices: Number of slices.
        chip: Chip name ("TPU v5e").
        num_chips: Chips in all slices.
        hbm_per_chip_bytes: The chip's HBM.
        mesh_selector: The instance type matched against `mesh_rules`.
        mesh_rule: The regex of the rule that chose the mesh (None: the config's default mesh).
        mesh_shape: Axis name -> size of the mesh the trainer built.
        fits: Whether the program fits in the chip's HBM.
        bytes_needed: Per-chip bytes the program needs (XLA's total, or from its OOM error).
        headroom_bytes: HBM minus bytes needed (negative: does not fit).
        memory: XLA's memory analysis (argument/output/temp/generated_code/alias/total bytes),
            or None when XLA refused the program.
        param_bytes_per_chip: One chip's shards of the model parameters.
        optimizer_bytes_per_chip: One chip's shards of the optimizer (learner) state.
        model_flops_per_step: FLOPs per step by the documented formula (docs/metrics.md).
        xla_flops_per_step: XLA's cost analysis FLOPs, per chip x chips (None if unavailable).
        xla_step_seconds: XLA's estimated step time, where its cost analysis gives one.
        estimated_mfu: model FLOPs / (step time x chips x peak), where a step time is known.
        peak_flops_per_chip: The chip's bf16 peak (from the instance-type table).
        build_seconds: Time to build the trainer.
        compile_seconds: Time to lower and compile the train step on this machine.
        error: XLA's error when it refused the program.
    """

    config: str
    topology: str
    num_slices: int
    chip: str
    num_chips: int
    hbm_per_chip_bytes: int
    mesh_selector: str
    mesh_rule: Optional[str]
    mesh_shape: dict[str, int]
    fits: bool
    bytes_needed: Optional[int]
    headroom_bytes: Optional[int]
    memory: Optional[dict[str, int]]
    param_bytes_per_chip: int
    optimizer_bytes_per_chip: int
    model_flops_per_step: Optional[float]
    xla_flops_per_step: Optional[float]
    xla_step_seconds: Optional[float]
    estimated_mfu: Optional[float]
    peak_flops_per_chip: float
    build_seconds: float
    compile_seconds: float
    error: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        """Returns the report as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """Returns the report as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def refusal_message(self) -> str:
        """Returns why a job with this report is refused (names chip, HBM, bytes, mesh rule)."""
        rule = repr(self.mesh_rule) if self.mesh_rule else "none (the config's default mesh)"
        needed = _gib(self.bytes_needed) if self.bytes_needed is not None else "unknown"
        return (
            f"{self.config} does not fit on {self.topology} x{self.num_slices}: each "
            f"{self.chip} chip has {_gib(self.hbm_per_chip_bytes)} of HBM but the train step "
            f"needs {needed} ({self.bytes_needed} bytes) per chip with mesh "
            f"{self.mesh_shape} chosen by mesh rule {rule} for {self.mesh_selector}."
        )

    def describe(self) -> str:
        """Returns the multi-line text report."""
        lines = [
            f"AOT compilation of {self.config} for {self.topology} x{self.num_slices} "
            f"({self.num_chips} x {self.chip}, {_gib(self.hbm_per_chip_bytes)} HBM per chip)",
            f"  mesh: {self.mesh_shape} (rule {self.mesh_rule!r} for {self.mesh_selector})",
            f"  build: {self.build_seconds:.1f} s, compile: {self.compile_seconds:.1f} s "
            "(on this machine)",
        ]
        if self.memory is not None:
            m = self.memory
            lines.append(
                "  memory per chip: arguments {}, outputs {}, temporaries {}, generated code {}, "
                "aliased {}, total {}".format(
                    *(
                        _gib(m[k])
                        for k in (
                            "argument_bytes",
                            "output_bytes",
                            "temp_bytes",
                            "generated_code_bytes",
                            "alias_bytes",
                            "total_bytes",
                        )
                    )
                )
            )
        lines.append(
            f"  trainer state per chip: parameters {_gib(self.param_bytes_per_chip)}, optimizer "
            f"state {_gib(self.optimizer_bytes_per_chip)}"
        )
        needed = _gib(self.bytes_needed) if self.bytes_needed is not None else "unknown"
        headroom = _gib(self.headroom_bytes) if self.headroom_bytes is not None else "unknown"
        lines.append(
            f"  fits: {'yes' if self.fits else 'NO'} (needs {needed} of "
            f"{_gib(self.hbm_per_chip_bytes)}, headroom {headroom})"
        )
        if self.model_flops_per_step is not None:
            lines.append(f"  model FLOPs per step: {self.model_flops_per_step:.4g}")
        if self.xla_flops_per_step is not None:
            lines.append(f"  XLA FLOPs per step (all chips): {self.xla_flops_per_step:.4g}")
            model = self.model_flops_per_step
            if model and self.xla_flops_per_step < model / 2:
                lines.append(
                    "    (XLA's cost analysis counts a loop body once, e.g. one layer of a scan "
                    "over repeated layers; the model FLOPs count every layer)"
                )
        if self.xla_step_seconds is None and self.memory is not None:
            lines.append("  XLA estimated step time: not given by XLA's cost analysis")
        if self.xla_step_seconds is not None:
            lines.append(f"  XLA estimated step time: {self.xla_step_seconds:.4g} s")
        if self.estimated_mfu is not None:
            lines.append(
                f"  estimated MFU: {100 * self.estimated_mfu:.1f}% "
                f"(peak {self.peak_flops_per_chip / 1e12:.0f} TFLOP/s per chip)"
            )
        if not self.fits:
            lines.append("  " + self.refusal_message())
        if self.error:
            lines.append(f"  XLA: {self.error.splitlines()[0][:300]}")
        return "\n".join(lines)


def _prng_bytes(trainer: Any) -> int:
    spec = trainer.trainer_state_specs.prng_key
    return math.prod(spec.shape) * np.dtype(spec.dtype).itemsize


def _gib(num_bytes: Optional[float]) -> str:
    if num_bytes is None:
        return "n/a"
    return f"{num_bytes / (1 << 30):.2f} GiB"


def _cost_analysis(compiled: Any) -> dict[str, float]:
    try:
        cost = compiled.cost_analysis()
    except Exception:  # pylint: disable=broad-except
        return {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def _model_flops(trainer: Any) -> Optional[float]:
    # pylint: disable-next=import-outside-toplevel
    import jax

    from axlearn.common.flops import lm_flops_from_model_config  # pylint: disable=C0415
    from axlearn.common.trainer_utils import global_batch_specs  # pylint: disable=C0415

    cfg = trainer.config
    batch = global_batch_specs(trainer.input, mesh=trainer.mesh(), batch_axis_names=None)
    shapes = [x.shape for x in jax.tree.leaves(batch) if len(x.shape) >= 2]
    if not shapes:
        return None
    try:
        flops = lm_flops_from_model_config(
            cfg.model,
            trainer.trainer_state_specs.model,
            global_batch_size=int(shapes[0][0]),
            seq_len=int(shapes[0][1]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    return float(flops.total_flops)


def report_from_result(result: AotCompileResult, *, config_name: str) -> AotReport:
    """Builds the `AotReport` of a `compile_trainer` result.

    Args:
        result: From `compile_trainer`.
        config_name: How the report names the config.

    Returns:
        The report.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.device_memory import compiled_memory_stats

    trainer, sc = result.trainer, result.system
    specs, shardings = trainer.trainer_state_specs, trainer.trainer_stateshardings_of_specs
    param_bytes = state_bytes_per_chip(specs.model, shardings.model)
    opt_bytes = state_bytes_per_chip(specs.learner, shardings.learner)
    hbm = sc.hbm_per_chip_bytes
    num_chips = sc.chips_per_slice * result.num_slices
    peak = sc.peak_flops_per_chip("bfloat16")
    memory, xla_flops, step_seconds = None, None, None
    if result.compiled is not None:
        stats = compiled_memory_stats(result.compiled)
        memory = stats.to_dict() if stats is not None else None
        bytes_needed = stats.total_bytes if stats is not None else None
        cost = _cost_analysis(result.compiled)
        if cost.get("flops"):
            xla_flops = float(cost["flops"]) * num_chips
        for key in ("optimal_seconds", "estimated_seconds"):
            if cost.get(key, 0) > 0:
                step_seconds = float(cost[key])
                break
    elif (result.error or "").startswith(STATE_EXCEEDS_HBM):
        bytes_needed = param_bytes + opt_bytes + _prng_bytes(trainer)
    else:
        bytes_needed = bytes_needed_from_oom(result.error or "")
        if bytes_needed is not None and "temporaries" in (result.error or ""):
            # XLA counted temporaries only; the state (arguments) is live too.
            bytes_needed += param_bytes + opt_bytes + _prng_bytes(trainer)
    model_flops = _model_flops(trainer)
    mfu = None
    if model_flops and step_seconds:
        mfu = model_flops / (step_seconds * num_chips * peak)
    fits = result.compiled is not None and (bytes_needed is None or bytes_needed <= hbm)
    return AotReport(
        config=config_name,
        topology=sc.device_type,
        num_slices=result.num_slices,
        chip=sc.chip,
        num_chips=num_chips,
        hbm_per_chip_bytes=hbm,
        mesh_selector=result.mesh_selector,
        mesh_rule=result.mesh_rule,
        mesh_shape={k: int(v) for k, v in trainer.mesh().shape.items()},
        fits=fits,
        bytes_needed=bytes_needed,
        headroom_bytes=None if bytes_needed is None else hbm - bytes_needed,
        memory=memory,
        param_bytes_per_chip=param_bytes,
        optimizer_bytes_per_chip=opt_bytes,
        model_flops_per_step=model_flops,
        xla_flops_per_step=xla_flops,
        xla_step_seconds=step_seconds,
        estimated_mfu=mfu,
        peak_flops_per_chip=peak,
        build_seconds=result.build_seconds,
        compile_seconds=result.compile_seconds,
        error=result.error,
    )


def default_report_path(config_name: str, topology: str, num_slices: int = 1) -> str:
    """Returns where a report goes when the user names no `--report`: the user's cache dir.

    `${XDG_CACHE_HOME:-~/.cache}/axlearn/aot_reports/<config>@<topology>x<slices>.json`: never
    the current directory (a git tree that a launch then refuses as dirty), never the temp dir.

    Args:
        config_name: "module:config".
        topology: The slice type.
        num_slices: Number of slices.

    Returns:
        The path.
    """
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = re.sub(r"[^-_.@a-zA-Z0-9]", "_", f"{config_name}@{topology}x{num_slices}")
    return os.path.join(cache, "axlearn", "aot_reports", name + ".json")


def write_report(report: AotReport, path: str) -> str:
    """Writes the report's JSON to `path` (creating its directory) and returns the path."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(report.to_json() + "\n")
    return path


def aot_model_analysis(compiled: Any) -> str:
    """A text summary of a compiled step's memory (AXLearn's `trainer.aot_model_analysis`).

    Lines for argument, output, aliased input/output, temporary and generated-code memory, and
    the total, in MB (2**20 bytes). The total counts a donated buffer that the output aliases
    once: argument + output - aliased + temp + generated code.

    Args:
        compiled: A `jax.stages.Compiled` (e.g. `jax.jit(f).lower(...).compile()`).

    Returns:
        The text; "Memory analysis is not available." when the platform gives none.
    """
    stats = compiled.memory_analysis()
    if stats is None:
        return "Memory analysis is not available."
    mb = 1024**2
    parts = dict(
        argument=stats.argument_size_in_bytes,
        output=stats.output_size_in_bytes,
        alias=stats.alias_size_in_bytes,
        temp=stats.temp_size_in_bytes,
        code=stats.generated_code_size_in_bytes,
    )
    total = parts["argument"] + parts["output"] - parts["alias"] + parts["temp"] + parts["code"]
    lines = [
        f"Argument memory: {parts['argument'] / mb:.1f}MB",
        f"Output memory: {parts['output'] / mb:.1f}MB",
        f"Aliased input/output memory: {parts['alias'] / mb:.1f}MB",
        f"Temp memory: {parts['temp'] / mb:.1f}MB",
        f"Generated code memory: {parts['code'] / mb:.1f}MB",
        f"Total HBM memory: {total / mb:.1f}MB",
    ]
    flops = _cost_analysis(compiled).get("flops")
    if flops is not None:
        lines.append(f"FLOPs: {flops:.4g}")
    return "\n".join(lines)
