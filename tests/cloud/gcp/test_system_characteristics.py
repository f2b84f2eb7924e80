"""Tests axlearn/cloud/gcp/system_characteristics.py: the one instance-type table."""

import math

import pytest

from axlearn.cloud.gcp import system_characteristics as sc_lib
from axlearn.common import device_peak

TABLE = sc_lib.USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS


@pytest.mark.parametrize(
    "key,chips,hosts,topology,hbm_gib",
    [
        # Cloud TPU docs: v4-8 is one host of 4 chips; v4-256 is 128 chips on 32 hosts.
        ("v4-8", 4, 1, "2x2x1", 32),
        ("v4-256", 128, 32, "4x4x8", 32),
        # v5e counts chips: v5litepod-256 is 16x16 chips on 64 hosts of 4.
        ("v5litepod-16", 16, 4, "4x4", 16),
        ("v5litepod-256", 256, 64, "16x16", 16),
        ("v5litepod-8", 8, 1, "2x4", 16),
        # v5p counts TensorCores: v5p-128 is 64 chips (4x4x4) on 16 hosts; 95 GB HBM per chip.
        ("v5p-8", 4, 1, "2x2x1", 95e9 / 2**30),
        ("v5p-128", 64, 16, "4x4x4", 95e9 / 2**30),
        ("v5p-12288", 6144, 1536, "16x16x24", 95e9 / 2**30),
        ("v6e-256", 256, 64, "16x16", 32e9 / 2**30),
        # 7x (Ironwood) counts TensorCores: 7x-128 is 64 chips (4x4x4) on 16 hosts; 192 GB.
        ("7x-128", 64, 16, "4x4x4", 192e9 / 2**30),
        ("7x-256", 128, 32, "4x4x8", 192e9 / 2**30),
    ],
)
def test_tpu_entries(key, chips, hosts, topology, hbm_gib):
    sc = TABLE[key]
    assert sc.chips_per_slice == chips
    assert sc.vms_per_slice == hosts
    assert sc.topology == topology
    assert math.prod(int(d) for d in topology.split("x")) == chips
    assert sc.hbm_per_chip_bytes == pytest.approx(hbm_gib * 2**30)
    assert sc.platform == "tpu"
    assert sc.instance_type == f"tpu-{key}"


def test_instance_type_lookup():
    sc = sc_lib.instance_type_to_system_characteristics("tpu-v5p-128")
    assert sc.device_type == "v5p-128"
    assert sc.gke_accelerator == "tpu-v5p-slice"
    assert sc.topology_name == "v5p:4x4x4"
    assert sc_lib.instance_type_to_system_characteristics("tpu-v5litepod-256").topology_name == (
        "v5e:16x16"
    )
    gpu = sc_lib.instance_type_to_system_characteristics("gpu-a3-ultragpu-8g")
    assert (gpu.platform, gpu.chips_per_vm, gpu.chip) == ("gpu", 8, "NVIDIA H200")
    assert gpu.gke_accelerator == "nvidia-h200-141gb"
    with pytest.raises(ValueError, match="no TPU topology"):
        _ = gpu.topology_name
    assert sc_lib.total_chips(sc, 2) == 128
    with pytest.raises(ValueError, match="num_slices must be >= 1"):
        sc_lib.total_chips(sc, 0)
    assert sc_lib.mesh_selector_for("tpu-v5p-128") == "tpu-v5p-128"


def test_instance_type_families_present():
    types = set(sc_lib.instance_types())
    for name in [
        "tpu-v4-8",
        "tpu-v5litepod-256",
        "tpu-v5p-8",
        "tpu-v5p-12288",
        "tpu-v6e-256",
        "tpu-7x-128",
        "gpu-a3-highgpu-8g",
        "gpu-a3-megagpu-8g",
        "gpu-a3-ultragpu-8g",
        "gpu-a4-highgpu-8g",
    ]:
        assert name in types


def test_unknown_names_list_close_ones():
    with pytest.raises(ValueError, match=r"Unknown instance type 'tpu-v5p-127'.*tpu-v5p-128"):
        sc_lib.instance_type_to_system_characteristics("tpu-v5p-127")
    with pytest.raises(ValueError, match=r"Unknown topology 'v5litepod-250'.*v5litepod-256"):
        sc_lib.get_system_characteristics("v5litepod-250")


def test_peak_table_is_the_chip_table():
    # MFU's peak table is read from the same chip specs launch and AOT use.
    for name, spec in sc_lib.CHIP_SPECS.items():
        assert device_peak.PEAK_FLOPS_PER_DEVICE[name] == spec.peak_flops
    peak = device_peak.lookup_peak_flops("TPU v5 lite", platform="tpu", dtype="bfloat16")
    assert peak.flops_per_s == TABLE["v5litepod-256"].peak_flops_per_chip("bfloat16") == 197e12
    peak = device_peak.lookup_peak_flops("NVIDIA H100 80GB HBM3", platform="gpu", dtype="bfloat16")
    assert peak.flops_per_s == TABLE["a3-highgpu-8g"].peak_flops_per_chip() == 989.4e12


@pytest.mark.parametrize("key", ["v5p-16", "v5litepod-16", "v6e-8", "v5litepod-1", "v4-16"])
def test_topology_desc_matches_table(key):
    """libtpu's topology description of the slice has one device per chip (v4: megacore)."""
    pytest.importorskip("libtpu", reason="libtpu comes with the [tpu] extra")
    from jax.experimental import topologies

    sc = TABLE[key]
    desc = topologies.get_topology_desc(
        platform="tpu",
        topology_name=sc.topology_name,
        chips_per_host_bounds=sc.chips_per_host_bounds,
        num_slices=1,
        chip_config_name=sc.chip_config_name,
    )
    assert len(desc.devices) == sc.chips_per_slice


def test_tpu_7x_has_two_devices_per_chip():
    sc = sc_lib.instance_type_to_system_characteristics("tpu-7x-128")
    assert (sc.gke_accelerator, sc.gce_machine_type, sc.chips_per_vm) == (
        "tpu7x",
        "tpu7x-standard-4t",
        4,
    )
    assert (sc.devices_per_chip, sc.devices_per_slice) == (2, 128)
    assert TABLE["v5p-128"].devices_per_slice == TABLE["v5p-128"].chips_per_slice == 64
    assert TABLE["7x-128"].peak_flops_per_chip("bfloat16") == 2307e12
