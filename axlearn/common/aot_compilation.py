"""Ahead-of-time (AOT) compilation of a trainer for a TPU topology, on any machine.

libtpu (the `[tpu]` extra) can describe a TPU slice it is not running on:
`jax.experimental.topologies.get_topology_desc` returns the slice's devices, and a function jitted
over a mesh of them lowers and compiles here, on a CPU-only machine, with XLA's memory and cost
analysis of the program the slice would run. So before paying for a v5p-128 one can know that the
experiment compiles for it, whether it fits in HBM, and how long XLA expects a step to take.

- `get_devices_for_topology("v5p-128", topology_num_slices=2)`: the devices of the slices.
- `compile_trainer_programs(trainer_config, topology=...)`: builds the real trainer on those
  devices, with the experiment's mesh rule for the launch's selector (`tpu-v5p-128`, or
  `tpu-v5p-128-2` for two slices; `axlearn.common.mesh_resolution`, which refuses a selector no
  rule matches), and compiles its train step: `{"train_step": Compiled}`. Progress lines go to
  stderr; the trainer's temporary directory is removed.
- `aot_report(...)` / `run_preflight(...)`: the same, plus a report (`AotReport`) of per-chip
  memory vs the chip's HBM, FLOPs, XLA's step-time estimate and the mesh rule that chose the mesh.
  A program that does not fit is a report with `fits=False` (XLA's out-of-memory error is
  parsed for the bytes needed), not an exception.

Topologies are keys of the one instance-type table
(`axlearn.cloud.gcp.system_characteristics`, re-exported here): `v4-8`, `v5p-128`,
`v5litepod-256`, `v6e-256`; `tpu-v5p-128` (a launch instance type) and `v5e-256` are accepted too.
Inputs are not read: input configs are replaced by `input_fake.FakeLmInput` with the same batch
shape (`--data_dir=FAKE`), and the batch shapes come from the input's `element_spec()`.
See docs/aot.md.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import math
import os
import re
import tempfile
import time
from typing import Any, Optional

import numpy as np

from axlearn.cloud.gcp.system_characteristics import (  # noqa: F401 (public re-exports)
    USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS,
    SystemCharacteristics,
    get_system_characteristics,
    mesh_selector_for,
)

# libtpu refuses a second process on the machine unless this is set; AOT never runs on a TPU.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Do not ask a GCE metadata server for the TPU type (there is none here).
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
if not glob.glob("/dev/accel*") and not os.path.exists("/dev/vfio"):
    # No TPU on this machine: libtpu, loaded only to describe and compile for a topology, would
    # log errors about the host's TPU type and worker hostnames it cannot find ("Failed to find
    # host bounds", "unexpected worker hostname"). It does not use them for AOT; these values
    # silence it (they describe no topology: the one compiled for is given explicitly).
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_WORKER_ID", "0")
# TensorFlow (imported by input pipelines) logs "failed call to cuInit" as an error on a machine
# without a GPU; level 3 keeps its C++ errors quiet in this compile-only process. (The commands
# set level 2 by default, which still shows errors; a user's 0 or 1 is kept.)
if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2") == "2":
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

TPU_EXTRA_HINT = "pip install 'axlearn[tpu]' (the [tpu] extra installs jax[tpu] with libtpu)"


# The error of a trainer whose state alone exceeds the chip's HBM (compilation is skipped).
STATE_EXCEEDS_HBM = "State exceeds HBM"


class LibTpuMissingError(ImportError):
    """libtpu is not installed, so TPU topologies cannot be described or compiled for."""


def require_libtpu() -> None:
    """Raises `LibTpuMissingError` naming the extra to install when libtpu is missing."""
    if importlib.util.find_spec("libtpu") is None:
        raise LibTpuMissingError(
            f"AOT compilation for a TPU topology needs libtpu, which is not installed: "
            f"{TPU_EXTRA_HINT}."
        )


def topology_system_characteristics(topology: str) -> SystemCharacteristics:
    """Returns the table entry of a topology ("v5p-128", "tpu-v5p-128" or "v5e-256").

    Args:
        topology: A key of `USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS`, optionally with the
            "tpu-" prefix of a launch instance type; "v5e-" is read as "v5litepod-".

    Returns:
        The `SystemCharacteristics` of one slice.

    Raises:
        ValueError: Unknown or non-TPU topology; the message lists the closest known names.
    """
    key = topology[len("tpu-") :] if topology.startswith("tpu-") else topology
    if key.startswith("v5e-"):
        key = "v5litepod-" + key[len("v5e-") :]
    sc = get_system_characteristics(key)
    if sc.platform != "tpu":
        raise ValueError(f"AOT compilation supports TPU topologies; {topology!r} is a GPU type.")
    return sc


def get_devices_for_topology(topology: str, topology_num_slices: int = 1) -> list[Any]:
    """Returns the devices of `topology_num_slices` slices of a TPU topology (no TPU needed).

    One device per chip (v4/v5p as megacore, as JAX exposes them on the slice). With several
    slices each device has a `slice_index`, which `utils_spmd.create_device_mesh` uses to build
    the hybrid ICI x DCN mesh.

    Args:
        topology: E.g. "v5p-128" (see `topology_system_characteristics`).
        topology_num_slices: Number of slices (connected over DCN).

    Returns:
        The devices, slice by slice.

    Raises:
        ValueError: Unknown topology or `topology_num_slices` < 1.
        LibTpuMissingError: libtpu is not installed.
    """
    sc = topology_system_characteristics(topology)
    if topology_num_slices < 1:
        raise ValueError(f"topology_num_slices must be >= 1, got {topology_num_slices}.")
    require_libtpu()
    # pylint: disable-next=import-outside-toplevel
    from jax.experimental.topologies import get_topology_desc

    desc = get_topology_desc(
        platform="tpu",
        topology_name=sc.topology_name,
        chips_per_host_bounds=sc.chips_per_host_bounds,
        num_slices=topology_num_slices,
        chip_config_name=sc.chip_config_name,
    )
    devices = list(desc.devices)
    expected = sc.chips_per_slice * topology_num_slices
    if len(devices) != expected:
        raise RuntimeError(
            f"libtpu described {topology} x{topology_num_slices} with {len(devices)} devices; "
            f"the instance-type table says {expected} chips."
        )
    return devices


def reshape_devices(devices: list[Any], *, mesh_shape: Any) -> np.ndarray:
    """Lays topology devices out as a mesh (hybrid ICI x DCN when they span several slices).

    Args:
        devices: From `get_devices_for_topology`.
        mesh_shape: A mesh shape (one -1 allowed) or `utils_spmd.HybridMeshShape`.

    Returns:
        An object array of devices shaped like the mesh.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.utils_spmd import create_device_mesh

    return create_device_mesh(mesh_shape, devices=devices)


def matching_mesh_rule(trainer_config: Any, mesh_selector: str) -> Optional[str]:
    """Returns the regex of the first `mesh_rules` entry that fully matches, or None.

    Args:
        trainer_config: An `SpmdTrainer.Config`.
        mesh_selector: E.g. "tpu-v5litepod-256".

    Returns:
        The regex, or None when no rule matches.
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.mesh_resolution import match_mesh_rule

    match = match_mesh_rule(trainer_config, mesh_selector)
    return None if match is None else match[1]


class Progress:
    """Prints what is being done and, every `interval_s`, how long it has taken so far.

    Used as a context manager around a long step (building the trainer, XLA's compile), so that
    a compile of minutes is not silent. Lines go to `out` (default stderr, so that a dry run's
    stdout stays the JobSet).
    """

    def __init__(self, what: str, *, interval_s: float = 10.0, out: Any = None):
        self.what = what
        self.interval_s = interval_s
        self.out = out
        self.seconds = 0.0
        self._stop = None
        self._thread = None
        self._start = 0.0

    def _print(self, line: str) -> None:
        # pylint: disable-next=import-outside-toplevel
        import sys

        out = self.out or sys.stderr
        out.write(line + "\n")
        out.flush()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._print(f"  ... {self.what}: {time.perf_counter() - self._start:.0f} s")

    def __enter__(self) -> Progress:
        # pylint: disable-next=import-outside-toplevel
        import threading

        self._print(f"{self.what} ...")
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self._start
        status = "failed after" if exc[0] is not None else "done in"
        self._print(f"{self.what}: {status} {self.seconds:.1f} s")


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


def compile_trainer(
    trainer_config: Any,
    *,
    topology: str,
    topology_num_slices: int = 1,
    compiler_options: Optional[dict[str, Any]] = None,
    keep_hlo: bool = False,
    mesh_resolution: Any = None,
    mesh_selector: Optional[str] = None,
    config_name: str = "trainer",
    progress_out: Any = None,
) -> AotCompileResult:
    """Builds the trainer on a TPU topology's devices and compiles its train step.

    The mesh comes from `axlearn.common.mesh_resolution`, as in the pods: either the config is
    already resolved (`mesh_resolution` given, e.g. by `build_trainer_config`), or the rule that
    `mesh_selector` (default: the launch's selector for `topology_num_slices` slices of the
    topology, e.g. "tpu-v5p-128-2") selects is applied here. Progress lines (what, elapsed time
    every 10 s, build and compile times) go to `progress_out` (default stderr). The trainer's
    throwaway directory is removed before returning.

    An XLA resource-exhausted error (the program does not fit in HBM) is returned in `error`;
    any other error is raised.

    Args:
        trainer_config: The experiment's `SpmdTrainer.Config` (not modified).
        topology: E.g. "v5litepod-256" or "tpu-v5litepod-256".
        topology_num_slices: Number of slices.
        compiler_options: XLA options for the compile (`axlearn.common.compiler_options`).
        keep_hlo: Whether to keep the optimized HLO text.
        mesh_resolution: The `MeshResolution` of an already resolved config (None: resolve).
        mesh_selector: The selector to resolve with (None: the launch's for the topology).
        config_name: How progress lines name the config.
        progress_out: Where progress lines go (default stderr).

    Returns:
        The `AotCompileResult`.

    Raises:
        MeshSelectorError: The selector matches none of the config's mesh rules.
    """
    # pylint: disable=import-outside-toplevel
    import shutil

    import jax

    from axlearn.common.input_fake import replace_inputs_with_fake
    from axlearn.common.mesh_resolution import resolve_mesh

    sc = topology_system_characteristics(topology)
    devices = get_devices_for_topology(sc.device_type, topology_num_slices)
    cfg = trainer_config.clone()
    if mesh_resolution is None:
        if mesh_selector is None:
            mesh_selector = mesh_selector_for(sc.instance_type, topology_num_slices)
        cfg, mesh_resolution = resolve_mesh(cfg, mesh_selector=mesh_selector)
    cfg = replace_inputs_with_fake(cfg)
    tmp_dir = None
    if not isinstance(cfg.dir, str):
        tmp_dir = tempfile.mkdtemp(prefix="axlearn_aot_")
        cfg.dir = tmp_dir
    target = f"{sc.device_type} x{topology_num_slices}"
    try:
        with Progress(
            f"Building {config_name} on {target} ({mesh_resolution.describe()})", out=progress_out
        ) as build:
            mesh_devices = reshape_devices(devices, mesh_shape=cfg.mesh_shape)
            trainer = cfg.instantiate(parent=None, devices=mesh_devices)
        compiled, error, hlo_text = None, None, None
        start = time.perf_counter()
        state_bytes = _state_bytes_per_chip(
            trainer.trainer_state_specs, trainer.trainer_stateshardings_of_specs
        )
        if state_bytes > sc.hbm_per_chip_bytes:
            # XLA would refuse it too, after a long compile.
            error = (
                f"{STATE_EXCEEDS_HBM}: the trainer state alone needs {state_bytes} bytes per chip "
                f"(more than the {sc.hbm_per_chip_bytes} bytes of HBM); not compiled."
            )
        else:
            with Progress(
                f"Compiling the train step of {config_name} for {target} (XLA, on this machine)",
                out=progress_out,
            ):
                try:
                    compiled = trainer.compile_train_step(compiler_options=compiler_options)
                except jax.errors.JaxRuntimeError as e:
                    if "RESOURCE_EXHAUSTED" not in str(e):
                        raise
                    error = str(e).strip()
        compile_seconds = time.perf_counter() - start
        if compiled is not None and keep_hlo:
            hlo_text = compiled.as_text()
    finally:
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return AotCompileResult(
        compiled=compiled,
        trainer=trainer,
        system=sc,
        num_slices=topology_num_slices,
        mesh_selector=mesh_resolution.mesh_selector,
        mesh_rule=mesh_resolution.rule,
        build_seconds=build.seconds,
        compile_seconds=compile_seconds,
        error=error,
        hlo_text=hlo_text,
    )


def compile_trainer_programs(
    trainer_config: Any,
    *,
    topology: str,
    topology_num_slices: int = 1,
    compiler_options: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Compiles the trainer's programs for a TPU topology.

    Args:
        trainer_config: The experiment's `SpmdTrainer.Config` (not modified).
        topology: E.g. "v5p-128".
        topology_num_slices: Number of slices (several: a hybrid ICI x DCN mesh).
        compiler_options: XLA options for the compile.

    Returns:
        {"train_step": the `jax.stages.Compiled` train step}.

    Raises:
        RuntimeError: If the program does not fit in the chip's HBM (XLA's message).
    """
    result = compile_trainer(
        trainer_config,
        topology=topology,
        topology_num_slices=topology_num_slices,
        compiler_options=compiler_options,
    )
    if result.compiled is None:
        raise RuntimeError(f"The train step does not compile for {topology}: {result.error}")
    return {"train_step": result.compiled}


# ---------------------------------------------------------------------------------------------
# The report.
# ---------------------------------------------------------------------------------------------

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


def _state_bytes_per_chip(specs: Any, shardings: Any) -> int:
    """Bytes of one device's shards of a tree of specs (the largest device)."""
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
    param_bytes = _state_bytes_per_chip(specs.model, shardings.model)
    opt_bytes = _state_bytes_per_chip(specs.learner, shardings.learner)
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


def aot_report(
    trainer_config: Any,
    *,
    topology: str,
    topology_num_slices: int = 1,
    compiler_options: Optional[dict[str, Any]] = None,
    config_name: str = "trainer",
    dump_hlo_dir: Optional[str] = None,
    mesh_resolution: Any = None,
    progress_out: Any = None,
) -> AotReport:
    """Compiles the trainer for a topology and returns its report.

    Args:
        trainer_config: The experiment's `SpmdTrainer.Config` (not modified).
        topology: E.g. "v5litepod-256" or "tpu-v5litepod-256".
        topology_num_slices: Number of slices.
        compiler_options: XLA options for the compile.
        config_name: How the report names the config.
        dump_hlo_dir: If set, the optimized HLO is written to <dir>/train_step.hlo.txt.
        mesh_resolution: The `MeshResolution` of an already resolved config (None: resolve
            with the launch's selector for the topology).
        progress_out: Where progress lines go (default stderr).

    Returns:
        The `AotReport`.
    """
    result = compile_trainer(
        trainer_config,
        topology=topology,
        topology_num_slices=topology_num_slices,
        compiler_options=compiler_options,
        keep_hlo=dump_hlo_dir is not None,
        mesh_resolution=mesh_resolution,
        config_name=config_name,
        progress_out=progress_out,
    )
    if dump_hlo_dir is not None and result.hlo_text is not None:
        os.makedirs(dump_hlo_dir, exist_ok=True)
        with open(os.path.join(dump_hlo_dir, "train_step.hlo.txt"), "w", encoding="utf-8") as f:
            f.write(result.hlo_text)
    return report_from_result(result, config_name=config_name)


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


def run_preflight(
    trainer_config: Any,
    instance_type: str,
    num_slices: int = 1,
    *,
    compiler_options: Optional[dict[str, Any]] = None,
    config_name: str = "trainer",
    mesh_resolution: Any = None,
    progress_out: Any = None,
) -> AotReport:
    """The launch pre-flight: compiles for the target and reports whether the job fits.

    `axlearn gcp launch` calls this before submitting; a report with `fits=False` refuses the
    job with `report.refusal_message()` (chip, HBM, bytes needed, the mesh rule).

    Args:
        trainer_config: The experiment's `SpmdTrainer.Config` (not modified).
        instance_type: The launch instance type ("tpu-v5p-128").
        num_slices: Number of slices.
        compiler_options: XLA options for the compile.
        config_name: How the report names the config.
        mesh_resolution: The `MeshResolution` of an already resolved config (the launch's:
            `launch_trainer.build_trainer_config` with the pods' flags); None: resolve here.
        progress_out: Where progress lines go (default stderr).

    Returns:
        The `AotReport` (`.fits`, `.describe()`, `.to_json()`).
    """
    return aot_report(
        trainer_config,
        topology=instance_type,
        topology_num_slices=num_slices,
        compiler_options=compiler_options,
        config_name=config_name,
        mesh_resolution=mesh_resolution,
        progress_out=progress_out,
    )
