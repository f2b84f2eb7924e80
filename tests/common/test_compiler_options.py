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
