"""XLA compiler options per TPU generation (real hardware and AOT), and GPU XLA flag sets.

On a TPU slice these options are usually passed to libtpu as flags in the `LIBTPU_INIT_ARGS`
environment variable (`xla_flags_from_options` formats them); for an ahead-of-time compile they go
to `Lowered.compile(compiler_options)` (`aot_compilation.compile_trainer(...,
compiler_options=default_xla_options(...))`). Every option here is accepted by the libtpu of our
jax line (tests/common/test_compiler_options.py compiles with them for each generation).

Defaults (`default_xla_options`):
- All TPUs: the latency-hiding scheduler and async collectives (all-gather, collective-permute,
  collective fusion, including fusing all-gathers and multi-step fusion) so that FSDP's gathers
  and reduce-scatters overlap compute; data-parallel all-reduce optimisation (also for different
  sized ops); `xla_tpu_spmd_rng_bit_generator_unsafe` (cheaper sharded random bits, e.g. dropout;
  the numbers differ from the unsharded generator's).
- v4 and v5p (megacore: two TensorCores per device): megacore fusion, without all-gathers
  (`xla_tpu_megacore_fusion_allow_ags=false`).
- v5e and v6e: the scoped VMEM limit raised to 96 MiB (`xla_tpu_scoped_vmem_limit_kib=98304`),
  which lets larger matmul tiles fuse.
- Multi-slice (`num_slices > 1`): the scheduler reruns with less overlap if the first schedule
  does not fit (`xla_latency_hiding_scheduler_rerun=2`), since DCN collectives hold buffers longer;
  the data-center-network (DCN) options of `_DCN_OPTIONS`: a megascale barrier for collectives
  across slices, and non-blocking DCN all-reduces sunk into as few stages as possible (tensors up
  to 64 MiB). Their booleans are written as libtpu flag strings ("true").

`XLA_OPTIONS_OVERRIDE` (environment variable, "name=value,name2=value2") overrides or adds
options of `default_xla_options`; values are kept as the strings given and validated like the
defaults (numbers, "true"/"false", durations such as "300s"/"60m", absolute paths).

Also: `infer_xla_performance_flags` (SparseCore collective offloading for the mesh shapes where it
was measured to help) and `infer_xsc_compiler_options` (the XLA silent-data-corruption checker).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Union

from axlearn.common.system_characteristics import instance_type_to_system_characteristics

OptionValue = Union[str, bool, int]

_COMMON_TPU_OPTIONS: dict[str, OptionValue] = {
    "xla_tpu_enable_latency_hiding_scheduler": True,
    "xla_enable_async_all_gather": True,
    "xla_enable_async_collective_permute": True,
    "xla_tpu_enable_async_collective_fusion": True,
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": True,
    "xla_tpu_enable_async_collective_fusion_multiple_steps": True,
    "xla_tpu_overlap_compute_collective_tc": True,
    "xla_tpu_enable_data_parallel_all_reduce_opt": True,
    "xla_tpu_data_parallel_opt_different_sized_ops": True,
    "xla_tpu_spmd_rng_bit_generator_unsafe": True,
}

_MEGACORE_OPTIONS: dict[str, OptionValue] = {
    "xla_tpu_enable_megacore_fusion": True,
    "xla_tpu_megacore_fusion_allow_ags": False,
}

_LITE_OPTIONS: dict[str, OptionValue] = {
    "xla_tpu_scoped_vmem_limit_kib": 98304,
}

_MULTI_SLICE_OPTIONS: dict[str, OptionValue] = {
    "xla_latency_hiding_scheduler_rerun": 2,
}

# Multi-slice options for collectives over the data-center network and the megascale runtime.
_DCN_OPTIONS: dict[str, OptionValue] = {
    "xla_tpu_enable_megascale_barrier": "true",
    "xla_tpu_enable_sunk_dcn_allreduce_done_with_host_reduction": "true",
    "xla_tpu_host_dcn_reduce_max_sinking_limit": 64 * 1024 * 1024,
}
# (The megascale runtime's flags, e.g. megascale_graph_hang_threshold, are not compile options:
# libtpu rejects them in `Lowered.compile`; set them in LIBTPU_INIT_ARGS or XLA_OPTIONS_OVERRIDE.)

# The environment variable with option overrides ("name=value,name2=value2").
XLA_OPTIONS_OVERRIDE_ENV = "XLA_OPTIONS_OVERRIDE"


# XLA flag sets for GPU training, applied by `axlearn gcp launch` to GPU instance types through the
# pods' XLA_FLAGS (`gpu_xla_flags`). None of them was measured on a GPU by this project: each flag
# is taken from a public JAX GPU recipe (cited beside it); `benchmarks/gpu_sweep.py --flag_sets`
# measures them against "none" on a GPU, which is how a flag earns (or loses) its place.
GPU_XLA_FLAG_SETS: dict[str, dict[str, OptionValue]] = {
    # XLA's own defaults.
    "none": {},
    # The latency-hiding scheduler only: JAX's "GPU performance tips"
    # (https://docs.jax.dev/en/latest/gpu_performance_tips.html) and the flag NVIDIA bakes into
    # its JAX images (https://docs.nvidia.com/jax-toolbox/environment-variables).
    "latency_hiding": {
        "xla_gpu_enable_latency_hiding_scheduler": True,
    },
    # The LLM recipe of NVIDIA's JAX-Toolbox "Tips for High-Performance LLMs with JAX and XLA"
    # (https://docs.nvidia.com/jax-toolbox/performance-profiling/gpu-performance, also
    # rosetta/docs/GPU_performance.md in github.com/NVIDIA/JAX-Toolbox): overlap collectives with
    # compute (latency-hiding scheduler, a high-priority stream for async collectives), FSDP
    # optimizations of scanned layers (while-loop double buffering, pipelined all-gather /
    # reduce-scatter / all-reduce), and combining small collectives (thresholds as in its
    # examples: 1 GiB all-reduce, 128 MiB all-gather, 64 MiB reduce-scatter for 8 GPUs a node).
    "llm_recipe": {
        "xla_gpu_enable_latency_hiding_scheduler": True,
        "xla_gpu_enable_highest_priority_async_stream": True,
        "xla_gpu_enable_while_loop_double_buffering": True,
        "xla_gpu_enable_pipelined_all_gather": True,
        "xla_gpu_enable_pipelined_reduce_scatter": True,
        "xla_gpu_enable_pipelined_all_reduce": True,
        "xla_gpu_all_reduce_combine_threshold_bytes": 1073741824,
        "xla_gpu_all_gather_combine_threshold_bytes": 134217728,
        "xla_gpu_reduce_scatter_combine_threshold_bytes": 67108864,
    },
}
# The set `axlearn gcp launch` applies to GPU instance types unless told otherwise.
DEFAULT_GPU_XLA_FLAG_SET = "llm_recipe"


def parse_xla_flags(flags: str) -> dict[str, str]:
    """Parses "--name=value --other=1" (XLA_FLAGS syntax) into {name: value} (order kept).

    Args:
        flags: Space-separated flags; a flag without "=" means "true".

    Returns:
        {name without "--": value as written}.

    Raises:
        ValueError: If an item does not start with "--".
    """
    parsed: dict[str, str] = {}
    for item in flags.split():
        if not item.startswith("--"):
            raise ValueError(
                f"XLA flag {item!r} must look like --name=value (in {flags!r}); fix or drop it."
            )
        name, _, value = item[2:].partition("=")
        parsed[name] = value if "=" in item else "true"
    return parsed


def gpu_xla_flags(flag_set: str = DEFAULT_GPU_XLA_FLAG_SET, *, overrides: str = "") -> str:
    """The XLA_FLAGS value of a GPU flag set, with `overrides` taking precedence per flag.

    Args:
        flag_set: A key of `GPU_XLA_FLAG_SETS`.
        overrides: Extra flags in XLA_FLAGS syntax ("--name=value ..."); a flag also in the set
            replaces the set's value, others are added.

    Returns:
        Space-separated flags: the set's in sorted order, then the added ones in given order.

    Raises:
        ValueError: Unknown flag set (the message lists the sets) or a malformed override.
    """
    if flag_set not in GPU_XLA_FLAG_SETS:
        raise ValueError(
            f"XLA flag set {flag_set!r} is unknown; choose one of {', '.join(GPU_XLA_FLAG_SETS)}."
        )
    formatted = {
        name: _format_value(value) for name, value in sorted(GPU_XLA_FLAG_SETS[flag_set].items())
    }
    formatted.update(parse_xla_flags(overrides))
    return " ".join(f"--{name}={value}" for name, value in formatted.items())


def infer_tpu_version(instance_type: str) -> str:
    """Returns the TPU generation of an instance type ("tpu-v5litepod-256" -> "v5e").

    Args:
        instance_type: A launch instance type, or a table key ("v5p-128"); "v5e-16" is taken as
            "v5litepod-16", and a trailing slice count ("v6e-8-1") is ignored.

    Returns:
        "v4", "v5e", "v5p" or "v6e".

    Raises:
        ValueError: Unknown or non-TPU instance type.
    """
    if not instance_type.startswith(("tpu-", "gpu-")):
        instance_type = f"tpu-{instance_type}"
    if instance_type.startswith("tpu-"):
        parts = instance_type[len("tpu-") :].split("-")
        if len(parts) == 3 and parts[2].isdigit():
            parts = parts[:2]  # "v6e-8-1": a slice count after the accelerator type.
        if parts[0] == "v5e":
            parts[0] = "v5litepod"  # The launch name of v5e slices.
        instance_type = "tpu-" + "-".join(parts)
    sc = instance_type_to_system_characteristics(instance_type)
    if sc.platform != "tpu":
        raise ValueError(f"{instance_type} is not a TPU instance type.")
    return sc.device_type.split("-")[0].replace("litepod", "e")


def default_xla_options(
    *, instance_type: str, num_slices: int = 1, backend: str = "tpu"
) -> dict[str, OptionValue]:
    """Returns the default XLA compiler options for a TPU instance type (see the module doc).

    Args:
        instance_type: E.g. "tpu-v5p-128" (or "v5p-128").
        num_slices: Number of slices.
        backend: Only "tpu" has options here.

    Returns:
        Option name -> value, with the overrides of `XLA_OPTIONS_OVERRIDE` applied.

    Raises:
        NotImplementedError: For a backend other than "tpu".
        ValueError: If `XLA_OPTIONS_OVERRIDE` is malformed or gives an invalid value.
    """
    if backend != "tpu":
        raise NotImplementedError(f"No default XLA options for backend {backend!r} (only tpu).")
    version = infer_tpu_version(instance_type)
    options = dict(_COMMON_TPU_OPTIONS)
    if version in ("v4", "v5p"):
        options.update(_MEGACORE_OPTIONS)
    else:
        options.update(_LITE_OPTIONS)
    if num_slices > 1:
        options.update(_MULTI_SLICE_OPTIONS)
        options.update(_DCN_OPTIONS)
    options.update(parse_xla_options_override(os.environ.get(XLA_OPTIONS_OVERRIDE_ENV, "")))
    for name, value in options.items():
        _validate_option(name, value)
    return options


def parse_xla_options_override(value: str) -> dict[str, str]:
    """Parses an `XLA_OPTIONS_OVERRIDE` value: "name=value, name2=value2" -> {name: value}.

    Args:
        value: Comma-separated name=value pairs (spaces around names and values are dropped;
            empty items are skipped; a value may contain "=").

    Returns:
        {name: value} in the given order (later pairs win).

    Raises:
        ValueError: If an item has no "=" or an empty name.
    """
    parsed: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        name, sep, option = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(
                f"{XLA_OPTIONS_OVERRIDE_ENV}: {item.strip()!r} must look like name=value "
                f"(in {value!r})."
            )
        parsed[name.strip()] = option.strip()
    return parsed


def _validate_option(name: str, value: OptionValue) -> None:
    """Raises ValueError unless `value` is a bool, an int or a valid option string."""
    if isinstance(value, (bool, int)):
        return
    if isinstance(value, str):
        if (
            value.isdigit()
            or value in ("true", "false", "NATIVE_EMISSION")
            or re.fullmatch(r"\d+[ms]", value)
            or value.startswith("/")
        ):
            return
        raise ValueError(
            f"XLA option {name}={value!r}: a string value must be a number, true/false, a "
            "duration such as 300s or 60m, or an absolute path."
        )
    raise ValueError(f"XLA option {name}: invalid type {type(value).__name__} ({value!r}).")


def xla_flags_from_options(options: dict[str, OptionValue]) -> str:
    """Formats options as libtpu flags for `LIBTPU_INIT_ARGS` ("--name=true --other=98304").

    Args:
        options: From `default_xla_options`.

    Returns:
        The flags, space-separated, in sorted order.
    """
    return " ".join(f"--{name}={_format_value(value)}" for name, value in sorted(options.items()))


def _format_value(value: OptionValue) -> str:
    """An option value as XLA flags write it (booleans as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def infer_xsc_compiler_options(
    *, halt_on_detection: bool = True, repeat_count: int = 1, device_kind: str
) -> dict[str, Union[bool, int]]:
    """Compiler options that run a program under the XLA silent-data-corruption (SDC) checker.

    Each call of the program is repeated `repeat_count` times and the results compared; on
    two-core (megacore) chips the repeats alternate cores, on one-core chips (v5e, v6e) the LLO
    sequences are duplicated instead. The interconnect (ICI) checker is configured but not run at
    program start (it slows large compiles a lot).

    Args:
        halt_on_detection: Whether a detected mismatch halts the program with an error.
        repeat_count: How many times each call is repeated and checked.
        device_kind: `jax.devices()[0].device_kind`, e.g. "TPU v6 lite" or "TPU v5".

    Returns:
        Option name -> value, for `Lowered.compile(compiler_options)`.
    """
    single_core = device_kind in ("TPU v5e", "TPU v5 lite", "TPU v6e", "TPU v6 lite")
    return dict(
        # The SDC checker on every call.
        xla_tpu_enable_sdc_checker=True,
        xla_tpu_sdc_check_repeat_count=repeat_count,
        xla_tpu_sdc_check_halt_on_detection=halt_on_detection,
        # One-core chips: compare duplicated LLO sequences.
        xla_tpu_sdc_replicate_llo=single_core,
        # Two-core chips: alternate the cores between repeats.
        xla_tpu_sdc_checker_alternate_megacore_cores=True,
        # The ICI checker (send/recv between neighbours at distance <= 1), off at start.
        xla_tpu_ici_sdc_test_run_on_program_start=False,
        xla_tpu_ici_sdc_test_max_distance=1,
        xla_tpu_ici_sdc_test_pipeline_depth=4,
        xla_tpu_ici_sdc_test_buffer_size_chunks=32,
        xla_tpu_ici_sdc_test_packet_size_chunks=4,
        xla_tpu_ici_sdc_test_iterations=10,
        # No LLO log recording (bandwidth/latency stats).
        xla_tpu_enable_log_recorder=False,
    )


# (mesh axes of size > 1 -> size, device kind, whether the mesh is the slice's native shape):
# the meshes where offloading collectives to the SparseCores helped. On other meshes (e.g. pure
# FSDP) it can be slower, so it is not enabled by default.
_SPARSE_CORE_OFFLOAD_MESHES: tuple[tuple[dict[str, int], str, bool], ...] = (
    (dict(fsdp=32, model=8), "TPU v6 lite", False),
    (dict(fsdp=64, model=4), "TPU v6 lite", False),
    (dict(fsdp=32, track=8), "TPU v6 lite", False),
    (dict(fsdp=64, track=4), "TPU v6 lite", False),
    (dict(fsdp=16, model=8), "TPU v6 lite", True),
    (dict(fsdp=16, track=8), "TPU v6 lite", True),
    (dict(data=64, fsdp=8), "TPU v5", True),
    (dict(fsdp=128, track=16), "TPU v5", True),
    (dict(fsdp=256, track=8), "TPU v5", True),
)


def infer_xla_performance_flags(
    *, mesh_shape: Sequence[int], mesh_axis_names: Sequence[str], device_kind: str
) -> dict[str, str]:
    """XLA flags tuned for a mesh: SparseCore collective offloading where it is known to help.

    The mesh is compared by its axes of size > 1 (e.g. [64, 4] over ("fsdp", "model") is
    {fsdp: 64, model: 4}) with `_SPARSE_CORE_OFFLOAD_MESHES`. On a match, all-gathers and
    reduce-scatters (and, except on v6e, all-reduces) are offloaded to the SparseCores, which
    needs the continuation fusions of those collectives off; on a non-native mesh shape the
    scheduler is told all-gathers take twice as long (half the bandwidth).

    Args:
        mesh_shape: The mesh shape.
        mesh_axis_names: One name per mesh axis.
        device_kind: `jax.devices()[0].device_kind`, e.g. "TPU v6 lite".

    Returns:
        Flag name -> value (strings); {} if the mesh is not in the table.

    Raises:
        ValueError: If mesh_shape and mesh_axis_names differ in length.
    """
    if len(mesh_shape) != len(mesh_axis_names):
        raise ValueError(
            f"infer_xla_performance_flags: mesh_shape {list(mesh_shape)} and mesh_axis_names "
            f"{list(mesh_axis_names)} differ in length."
        )
    mesh = {name: size for name, size in zip(mesh_axis_names, mesh_shape) if size != 1}
    for known_mesh, kind, native in _SPARSE_CORE_OFFLOAD_MESHES:
        if mesh != known_mesh or device_kind != kind:
            continue
        flags = {
            f"xla_tpu_enable_async_collective_fusion_fuse_{op}": "false"
            for op in ("all_gather", "all_reduce", "reduce_scatter")
        }
        for op in ("all_gather", "2d_all_gather", "reduce_scatter"):
            flags[f"xla_tpu_enable_sparse_core_collective_offload_{op}"] = "true"
        for op in ("all_gather", "reduce_scatter", "all_reduce"):
            flags[f"xla_tpu_enable_{op}_offload_tracing"] = "true"
        if device_kind != "TPU v6 lite":
            # All-reduce offloading changed the numerics on v6e; only elsewhere.
            flags["xla_tpu_enable_sparse_core_collective_offload_all_reduce"] = "true"
        if not native:
            flags["xla_tpu_sparse_core_all_gather_latency_multiplier"] = "2"
        return flags
    return {}
