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
(`axlearn.common.system_characteristics`, re-exported here): `v4-8`, `v5p-128`,
`v5litepod-256`, `v6e-256`; `tpu-v5p-128` (a launch instance type) and `v5e-256` are accepted too.
Inputs are not read: input configs are replaced by `input_fake.FakeLmInput` with the same batch
shape (`--data_dir=FAKE`), and the batch shapes come from the input's `element_spec()`.
See docs/aot.md.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import tempfile
import time
from typing import Any, Optional

import numpy as np

from axlearn.common.aot_results import (  # noqa: F401 (public re-exports)
    STATE_EXCEEDS_HBM,
    AotCompileResult,
    AotReport,
    bytes_needed_from_oom,
    default_report_path,
    report_from_result,
    state_bytes_per_chip,
    write_report,
)
from axlearn.common.system_characteristics import (  # noqa: F401 (public re-exports)
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
        state_bytes = state_bytes_per_chip(
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
