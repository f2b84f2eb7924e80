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
  does not fit (`xla_latency_hiding_scheduler_rerun=2`), since DCN collectives hold buffers longer.
"""

from __future__ import annotations

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
        instance_type: A launch instance type, or a table key ("v5p-128").

    Returns:
        "v4", "v5e", "v5p" or "v6e".

    Raises:
        ValueError: Unknown or non-TPU instance type.
    """
    if not instance_type.startswith(("tpu-", "gpu-")):
        instance_type = f"tpu-{instance_type}"
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
        Option name -> value.

    Raises:
        NotImplementedError: For a backend other than "tpu".
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
    return options


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
