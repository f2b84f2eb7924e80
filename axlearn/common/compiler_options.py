"""XLA compiler options per TPU generation, for real hardware and for AOT compilation.

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

from axlearn.cloud.gcp.system_characteristics import instance_type_to_system_characteristics

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

    def fmt(value: OptionValue) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return " ".join(f"--{name}={fmt(value)}" for name, value in sorted(options.items()))
