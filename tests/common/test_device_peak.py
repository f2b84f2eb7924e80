"""Tests axlearn/common/device_peak.py."""

import jax
import pytest

from axlearn.common import device_peak


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
