"""Tests of axlearn/common/compiler_options.py: libtpu accepts every default option."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from axlearn.common import aot_compilation, compiler_options


def _lowered(topology: str, num_slices: int):
    devices = aot_compilation.get_devices_for_topology(topology, num_slices)
    mesh = Mesh(np.asarray(devices).reshape(-1), ("x",))
    x = jax.ShapeDtypeStruct(
        (len(devices) * 8, 128), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("x"))
    )
    return jax.jit(lambda a: (a @ a.T).sum()).lower(x)


@pytest.mark.parametrize(
    "instance_type,num_slices",
    [("tpu-v4-16", 1), ("tpu-v5litepod-16", 1), ("tpu-v5p-16", 2), ("tpu-v6e-16", 1)],
)
def test_default_options_compile(instance_type, num_slices):
    options = compiler_options.default_xla_options(
        instance_type=instance_type, num_slices=num_slices
    )
    megacore = instance_type.startswith(("tpu-v4", "tpu-v5p"))
    assert ("xla_tpu_enable_megacore_fusion" in options) == megacore
    assert ("xla_tpu_scoped_vmem_limit_kib" in options) == (not megacore)
    assert ("xla_latency_hiding_scheduler_rerun" in options) == (num_slices > 1)
    lowered = _lowered(instance_type, num_slices)
    assert lowered.compile(options) is not None
    # The check is real: libtpu rejects an option it does not know.
    with pytest.raises(Exception, match="No such compile option"):
        lowered.compile({"xla_tpu_no_such_option_for_the_test": True})


def test_infer_tpu_version_and_flags():
    assert compiler_options.infer_tpu_version("tpu-v5litepod-256") == "v5e"
    assert compiler_options.infer_tpu_version("v5p-128") == "v5p"
    with pytest.raises(ValueError, match="Unknown instance type"):
        compiler_options.infer_tpu_version("tpu-v9-8")
    with pytest.raises(NotImplementedError):
        compiler_options.default_xla_options(instance_type="tpu-v5p-8", backend="gpu")
    flags = compiler_options.xla_flags_from_options({"b_opt": False, "a_opt": 98304})
    assert flags == "--a_opt=98304 --b_opt=false"


def test_gpu_flag_sets_are_known_to_this_xla():
    """Every flag of every GPU set parses in this jaxlib's XLA (an unknown flag is fatal)."""
    import os  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    all_flags = " ".join(
        compiler_options.gpu_xla_flags(name) for name in compiler_options.GPU_XLA_FLAG_SETS
    )
    code = "import jax; print(float(jax.numpy.ones(3).sum()))"
    for flags, ok in ((all_flags, True), ("--xla_gpu_no_such_flag=true", False)):
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert (run.returncode == 0 and run.stdout.strip() == "3.0") == ok, run.stderr[-2000:]


def test_gpu_xla_flags_merge_and_errors():
    assert compiler_options.gpu_xla_flags("none") == ""
    assert compiler_options.gpu_xla_flags("none", overrides="--a=1 --b") == "--a=1 --b=true"
    merged = compiler_options.gpu_xla_flags(
        "latency_hiding", overrides="--xla_gpu_enable_latency_hiding_scheduler=false --c=2"
    )
    assert merged == "--xla_gpu_enable_latency_hiding_scheduler=false --c=2"
    assert compiler_options.DEFAULT_GPU_XLA_FLAG_SET in compiler_options.GPU_XLA_FLAG_SETS
    with pytest.raises(ValueError, match="choose one of none, latency_hiding, llm_recipe"):
        compiler_options.gpu_xla_flags("turbo")
    with pytest.raises(ValueError, match=r"XLA flag 'xla_foo=1' must look like --name=value"):
        compiler_options.gpu_xla_flags("none", overrides="xla_foo=1")


def test_multi_slice_dcn_options_and_env_overrides(monkeypatch):
    monkeypatch.delenv("XLA_OPTIONS_OVERRIDE", raising=False)
    single = compiler_options.default_xla_options(instance_type="tpu-v6e-32", num_slices=1)
    multi = compiler_options.default_xla_options(instance_type="tpu-v6e-32", num_slices=2)
    key = "xla_tpu_enable_sunk_dcn_allreduce_done_with_host_reduction"
    assert key not in single and multi[key] == "true"
    assert multi["xla_tpu_host_dcn_reduce_max_sinking_limit"] == 64 * 2**20
    # Overrides replace or add options (values kept as given strings); empty items are skipped.
    monkeypatch.setenv(
        "XLA_OPTIONS_OVERRIDE", f" {key}=false,, megascale_graph_hang_threshold=300s"
    )
    multi = compiler_options.default_xla_options(instance_type="tpu-v6e-32", num_slices=2)
    assert multi[key] == "false" and multi["megascale_graph_hang_threshold"] == "300s"
    monkeypatch.setenv("XLA_OPTIONS_OVERRIDE", "xla_new_option=/tmp/dump")
    assert compiler_options.default_xla_options(instance_type="tpu-v5p-8")["xla_new_option"] == (
        "/tmp/dump"
    )
    assert compiler_options.parse_xla_options_override("a=b=c") == {"a": "b=c"}
    monkeypatch.setenv("XLA_OPTIONS_OVERRIDE", "xla_foo")
    with pytest.raises(ValueError, match="XLA_OPTIONS_OVERRIDE: 'xla_foo' must look like"):
        compiler_options.default_xla_options(instance_type="tpu-v5p-8")
    monkeypatch.setenv("XLA_OPTIONS_OVERRIDE", "xla_foo=maybe")
    with pytest.raises(ValueError, match="xla_foo='maybe': a string value must be"):
        compiler_options.default_xla_options(instance_type="tpu-v5p-8")


def test_infer_tpu_version_aliases():
    assert compiler_options.infer_tpu_version("v5e-16") == "v5e"  # v5e == v5litepod slices.
    assert compiler_options.infer_tpu_version("v6e-8-1") == "v6e"  # Trailing slice count.
    assert compiler_options.infer_tpu_version("tpu-v5litepod-256-4") == "v5e"


def test_xsc_compiler_options():
    v6e = compiler_options.infer_xsc_compiler_options(
        halt_on_detection=False, repeat_count=3, device_kind="TPU v6 lite"
    )
    assert v6e["xla_tpu_enable_sdc_checker"] is True
    assert v6e["xla_tpu_sdc_check_repeat_count"] == 3
    assert v6e["xla_tpu_sdc_check_halt_on_detection"] is False
    # One-core chips duplicate LLO; two-core (v5p) chips alternate cores instead.
    assert v6e["xla_tpu_sdc_replicate_llo"] is True
    v5p = compiler_options.infer_xsc_compiler_options(device_kind="TPU v5")
    assert v5p["xla_tpu_sdc_replicate_llo"] is False
    assert v5p["xla_tpu_sdc_check_halt_on_detection"] is True
    assert v5p["xla_tpu_ici_sdc_test_run_on_program_start"] is False
    # libtpu accepts every option (it rejects unknown ones, see test_default_options_compile).
    assert _lowered("tpu-v5p-16", 1).compile(v5p) is not None


def test_xla_performance_flags():
    flags = compiler_options.infer_xla_performance_flags
    offload = "xla_tpu_enable_sparse_core_collective_offload_all_gather"
    # Size-1 axes are ignored when matching the table.
    v6e = flags(mesh_shape=[1, 32, 8, 1], mesh_axis_names="data fsdp model expert".split(),
                device_kind="TPU v6 lite")  # fmt: skip
    assert v6e[offload] == "true"
    assert v6e["xla_tpu_enable_async_collective_fusion_fuse_all_gather"] == "false"
    # A non-native mesh on v6e: all-gather latency doubled; no all-reduce offload on v6e.
    assert v6e["xla_tpu_sparse_core_all_gather_latency_multiplier"] == "2"
    assert "xla_tpu_enable_sparse_core_collective_offload_all_reduce" not in v6e
    assert _lowered("tpu-v6e-16", 1).compile(v6e) is not None  # libtpu knows every flag.
    v5p = flags(mesh_shape=[64, 8], mesh_axis_names=("data", "fsdp"), device_kind="TPU v5")
    assert v5p["xla_tpu_enable_sparse_core_collective_offload_all_reduce"] == "true"
    assert "xla_tpu_sparse_core_all_gather_latency_multiplier" not in v5p
    # Pure FSDP, or the right mesh on another chip: nothing.
    assert flags(mesh_shape=[256], mesh_axis_names=("fsdp",), device_kind="TPU v5") == {}
    assert flags(mesh_shape=[64, 8], mesh_axis_names=("data", "fsdp"), device_kind="TPU v4") == {}
    with pytest.raises(ValueError, match="differ in length"):
        flags(mesh_shape=[4, 4], mesh_axis_names=("fsdp",), device_kind="TPU v5")
