"""Tests axlearn/common/device_peak.py."""

import os
import socket
import subprocess
import sys

import jax
import pytest

from axlearn.common import device_peak

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    "kind,name",
    [
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5e", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v5p", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H200", "NVIDIA H200"),
        ("cpu", None),
        ("TPU v3", None),
    ],
)
def test_canonical_device_name(kind, name):
    assert device_peak.canonical_device_name(kind) == name


def test_lookup_values_and_notes():
    p = device_peak.lookup_peak_flops("TPU v5 lite", platform="tpu", dtype="jax.numpy.bfloat16")
    assert (p.flops_per_s, p.source, p.dtype) == (197e12, "table", "bfloat16")
    p = device_peak.lookup_peak_flops("NVIDIA H100 80GB HBM3", platform="gpu", dtype="float32")
    assert p.flops_per_s == 494.7e12 and "TF32" in p.note
    p = device_peak.lookup_peak_flops("NVIDIA A100-SXM4-40GB", platform="gpu", dtype="float16")
    assert p.flops_per_s == 312e12
    p = device_peak.lookup_peak_flops("TPU v4", platform="tpu", dtype="float32")
    assert p.flops_per_s == 275e12 and "bfloat16 pass" in p.note
    unknown = device_peak.lookup_peak_flops("Mystery chip", platform="gpu", dtype="bfloat16")
    assert unknown.flops_per_s is None and unknown.source == "unknown"
    assert "unknown" in unknown.describe()
    with pytest.raises(ValueError, match="int8"):
        device_peak.lookup_peak_flops("TPU v4", platform="tpu", dtype="int8")


def test_measure_matmul_flops_fake_clock():
    # Three timed calls of 0.5 s, 0.25 s, 0.4 s: the fastest counts.
    times = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.4])
    got = device_peak.measure_matmul_flops(
        jax.local_devices()[:2], dim=32, repeats=3, matmuls_per_call=2, clock=lambda: next(times)
    )
    assert got == pytest.approx(2 * 32**3 * 2 / 0.25)


def test_device_peak_flops_cpu_is_measured():
    peak = device_peak.device_peak_flops(dtype="float32", probe_dim=128, probe_repeats=2)
    assert peak.source == "measured" and peak.platform == "cpu"
    assert peak.flops_per_s > 1e6  # Any real CPU does more than a MFLOP/s.
    assert "measured" in peak.describe() and "8 CPU device(s)" in peak.note
    assert peak.to_dict()["flops_per_s"] == peak.flops_per_s


_TWO_PROCESS_PROBE = """
import sys, jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
from axlearn.common import device_peak
import numpy as np
# As the trainer calls it: all global devices, inside the global mesh's context (jax.set_mesh).
# Only the local devices are probed.
with jax.set_mesh(jax.sharding.Mesh(np.array(jax.devices()), ("data",))):
    peak = device_peak.device_peak_flops(jax.devices(), probe_dim=64, probe_repeats=1)
assert peak.flops_per_s > 0, peak
print("PROBED", len(jax.devices()), peak.note)
"""


def test_device_peak_flops_two_processes(tmp_path):
    """Each process of a multi-process run probes its own devices (no cross-process transfer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2"
    )
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TWO_PROCESS_PROBE, f"127.0.0.1:{port}", str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
        # 4 global devices, 2 of them local: the probe ran on the 2 local ones.
        assert "PROBED 4" in out and "on 2 CPU device(s)" in out, out[-3000:]
