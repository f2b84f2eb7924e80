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
