"""The one table of accelerator instance types: topology, hosts, chips, HBM and peak FLOP/s.

`axlearn gcp launch` (node selectors, hosts per slice, resources), AOT compilation (the topology to
compile for, the HBM a job must fit in) and MFU reporting (`axlearn.common.device_peak`) all read
this table, so a number is stated once.

Keys of `USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS` are spelled as AXLearn spells them:
TPU slices by accelerator type (`v4-8`, `v5litepod-256`, `v5p-128`, `v6e-256`, `7x-128`; the
number after the dash is TensorCores for v4/v5p/7x and chips for v5e/v6e, as Cloud TPU names
them) and GPU nodes by their GCE machine type (`a3-highgpu-8g`). A launch instance type is the
key with the platform in front: `tpu-v5p-128`, `gpu-a3-highgpu-8g` (see
`instance_type_to_system_characteristics`).

Sources: Cloud TPU system architecture pages (v4, v5e, v5p, v6e, 7x (Ironwood): chips per host,
HBM per chip, peak bf16 FLOP/s, topologies), GKE TPU node selector values
(`cloud.google.com/gke-tpu-accelerator` and `cloud.google.com/gke-tpu-topology`), GCE
accelerator-optimized machine types (A3/A4) and the NVIDIA data sheets (dense, no sparsity) for
H100 SXM, H200 and B200.

This module imports nothing outside the standard library, so any command can read it. It sits at
the bottom of the package (`axlearn.common` never imports `axlearn.cloud`); its old path
`axlearn.cloud.gcp.system_characteristics` re-exports every public name.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Optional

# AXLearn's accelerator-type codes.
AcceleratorType = {"TPU": 1, "GPU": 2, "CPU": 3}

_GIB = 1 << 30
_GB = 1000**3


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """One accelerator chip generation.

    Attributes:
        name: Canonical device name, as the MFU peak table keys it (e.g. "TPU v5p").
        hbm_bytes: High-bandwidth memory per chip, in bytes.
        peak_flops: Dense peak matmul FLOP/s per chip by dtype ("bfloat16", "float32").
        device_kind_pattern: Regex searched in `jax.Device.device_kind` to recognize the chip.
    """

    name: str
    hbm_bytes: int
    peak_flops: dict[str, float]
    device_kind_pattern: str


# Chip generations. float32 entries are what XLA runs a float32 matmul at with JAX's default
# precision: one bfloat16 pass on TPU (the bf16 peak), TF32 tensor cores on NVIDIA GPUs.
CHIP_SPECS: dict[str, ChipSpec] = {
    spec.name: spec
    for spec in (
        ChipSpec("TPU v4", 32 * _GIB, {"bfloat16": 275e12, "float32": 275e12}, r"TPU v4"),
        ChipSpec(
            "TPU v5e", 16 * _GIB, {"bfloat16": 197e12, "float32": 197e12}, r"TPU v5 ?lite|TPU v5e"
        ),
        ChipSpec("TPU v5p", 95 * _GB, {"bfloat16": 459e12, "float32": 459e12}, r"TPU v5p|TPU v5$"),
        ChipSpec(
            "TPU v6e", 32 * _GB, {"bfloat16": 918e12, "float32": 918e12}, r"TPU v6 ?lite|TPU v6e"
        ),
        # Ironwood: two TensorCores per chip; 192 GB HBM, 2307 dense bf16 TFLOP/s per chip.
        ChipSpec("TPU 7x", 192 * _GB, {"bfloat16": 2307e12, "float32": 2307e12}, r"TPU ?7x"),
        ChipSpec("NVIDIA A100", 80 * _GB, {"bfloat16": 312e12, "float32": 156e12}, r"A100"),
        ChipSpec(
            "NVIDIA H100 PCIe", 80 * _GB, {"bfloat16": 756.5e12, "float32": 378e12}, r"H100.*PCIe"
        ),
        ChipSpec(
            "NVIDIA H100 SXM",
            80 * _GB,
            {"bfloat16": 989.4e12, "float32": 494.7e12},
            r"H100.*(SXM|HBM3)|H100$",
        ),
        ChipSpec("NVIDIA H200", 141 * _GB, {"bfloat16": 989.4e12, "float32": 494.7e12}, r"H200"),
        ChipSpec("NVIDIA B200", 180 * _GB, {"bfloat16": 2250e12, "float32": 1100e12}, r"B200"),
    )
}


@dataclasses.dataclass(frozen=True)
class SystemCharacteristics:
    """One slice (TPU) or node (GPU) type.

    Attributes:
        topology: Physical chip topology of the slice ("4x4x4", "16x16"); "N/A" for GPUs.
        vms_per_slice: Hosts (VMs, pods) per slice; for GPUs, 1 (one node per replica).
        gke_accelerator: GKE node selector value (`cloud.google.com/gke-tpu-accelerator` for TPUs,
            `cloud.google.com/gke-accelerator` for GPUs).
        gce_machine_type: GCE machine type of one host ("ct5p-hightpu-4t", "a3-highgpu-8g").
        chips_per_vm: Accelerator chips per host (the `google.com/tpu` / `nvidia.com/gpu` limit).
        accelerator_type: `AcceleratorType["TPU"]` or `AcceleratorType["GPU"]`.
        device_type: The table key ("v5p-128", "a3-highgpu-8g").
        chip: Canonical chip name, a key of `CHIP_SPECS`.
        chips_per_host_bounds: Host's chip block, for
            `jax.experimental.topologies.get_topology_desc` (TPU only).
        devices_per_chip: JAX devices per chip (2 for TPU 7x, whose two TensorCores are separate
            devices; 1 otherwise).
    """

    topology: str
    vms_per_slice: int
    gke_accelerator: str
    gce_machine_type: str
    chips_per_vm: int
    accelerator_type: int
    device_type: str
    chip: str
    chips_per_host_bounds: tuple[int, ...] = ()
    devices_per_chip: int = 1

    @property
    def platform(self) -> str:
        """Returns "tpu" or "gpu"."""
        return "tpu" if self.accelerator_type == AcceleratorType["TPU"] else "gpu"

    @property
    def devices_per_slice(self) -> int:
        """Returns the number of JAX devices in one slice (TPU) or node (GPU)."""
        return self.chips_per_slice * self.devices_per_chip

    @property
    def chips_per_slice(self) -> int:
        """Returns the number of chips in one slice (TPU) or node (GPU)."""
        return self.vms_per_slice * self.chips_per_vm

    @property
    def hbm_per_chip_bytes(self) -> int:
        """Returns HBM per chip in bytes."""
        return CHIP_SPECS[self.chip].hbm_bytes

    def peak_flops_per_chip(self, dtype: str = "bfloat16") -> float:
        """Returns the dense peak matmul FLOP/s of one chip.

        Args:
            dtype: "bfloat16" or "float32".

        Returns:
            FLOP/s per chip.
        """
        return CHIP_SPECS[self.chip].peak_flops[dtype]

    @property
    def instance_type(self) -> str:
        """Returns the launch instance type ("tpu-v5p-128", "gpu-a3-highgpu-8g")."""
        return f"{self.platform}-{self.device_type}"

    @property
    def chip_config_name(self) -> str:
        """Returns the `get_topology_desc` chip config: "megacore" for v4/v5p, else "default".

        v4 and v5p chips have two TensorCores that JAX drives as one device (megacore); without
        this, a topology description has two devices per chip (TensorCores), unlike the slice.
        """
        if self.platform != "tpu":
            raise ValueError(f"{self.device_type} is not a TPU slice; it has no chip config.")
        return "megacore" if self.chip in ("TPU v4", "TPU v5p") else "default"

    @property
    def topology_name(self) -> str:
        """Returns the name `get_topology_desc` takes ("v5p:4x4x4"); TPU only."""
        if self.platform != "tpu":
            raise ValueError(f"{self.device_type} is not a TPU slice; it has no TPU topology.")
        generation = self.device_type.split("-")[0].replace("litepod", "e")
        return f"{generation}:{self.topology}"


def _tpu_entries(
    *,
    prefix: str,
    chip: str,
    gke_accelerator: str,
    units_per_chip: int,
    topologies: dict[int, str],
    machine_type: str,
    single_host: Optional[dict[int, tuple[str, str, tuple[int, ...]]]] = None,
    devices_per_chip: int = 1,
) -> dict[str, SystemCharacteristics]:
    """Builds the entries of one TPU generation.

    Args:
        prefix: Accelerator-type prefix ("v5p").
        chip: Key of `CHIP_SPECS`.
        gke_accelerator: GKE TPU accelerator node-selector value.
        units_per_chip: How many of the type's number make one chip (2 for TensorCore-counted
            v4/v5p, 1 for chip-counted v5e/v6e).
        topologies: Chips in the slice -> topology, for multi-host slices with 4 chips per host
            (and the 1-host 4-chip slice).
        machine_type: GCE machine type of a 4-chip host.
        single_host: Chips -> (topology, machine type, chips-per-host bounds) for slices of one
            host whose chip count is not 4.
        devices_per_chip: JAX devices per chip.

    Returns:
        Table entries keyed by device type.
    """
    entries = {}
    for chips, topology in topologies.items():
        device_type = f"{prefix}-{chips * units_per_chip}"
        entries[device_type] = SystemCharacteristics(
            topology=topology,
            vms_per_slice=max(1, chips // 4),
            gke_accelerator=gke_accelerator,
            gce_machine_type=machine_type,
            chips_per_vm=min(4, chips),
            accelerator_type=AcceleratorType["TPU"],
            device_type=device_type,
            chip=chip,
            chips_per_host_bounds=(2, 2, 1),
            devices_per_chip=devices_per_chip,
        )
    for chips, (topology, machine, bounds) in (single_host or {}).items():
        device_type = f"{prefix}-{chips * units_per_chip}"
        entries[device_type] = SystemCharacteristics(
            topology=topology,
            vms_per_slice=1,
            gke_accelerator=gke_accelerator,
            gce_machine_type=machine,
            chips_per_vm=chips,
            accelerator_type=AcceleratorType["TPU"],
            device_type=device_type,
            chip=chip,
            chips_per_host_bounds=bounds,
        )
    return entries


def _gpu_entry(machine_type: str, gke_accelerator: str, chip: str) -> SystemCharacteristics:
    return SystemCharacteristics(
        topology="N/A",
        vms_per_slice=1,
        gke_accelerator=gke_accelerator,
        gce_machine_type=machine_type,
        chips_per_vm=8,
        accelerator_type=AcceleratorType["GPU"],
        device_type=machine_type,
        chip=chip,
    )


# Multi-host slices of the 2D-torus generations (v5e, v6e): chips -> topology.
_TWO_D_TOPOLOGIES = {
    4: "2x2",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}

USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS: dict[str, SystemCharacteristics] = {
    **_tpu_entries(
        prefix="v4",
        chip="TPU v4",
        gke_accelerator="tpu-v4-podslice",
        units_per_chip=2,
        machine_type="ct4p-hightpu-4t",
        topologies={
            4: "2x2x1",
            8: "2x2x2",
            16: "2x2x4",
            32: "2x4x4",
            64: "4x4x4",
            128: "4x4x8",
            256: "4x8x8",
            512: "8x8x8",
            768: "8x8x12",
            1024: "8x8x16",
            2048: "8x16x16",
            4096: "16x16x16",
        },
    ),
    **_tpu_entries(
        prefix="v5litepod",
        chip="TPU v5e",
        gke_accelerator="tpu-v5-lite-podslice",
        units_per_chip=1,
        machine_type="ct5lp-hightpu-4t",
        topologies=_TWO_D_TOPOLOGIES,
        single_host={
            1: ("1x1", "ct5lp-hightpu-1t", (1, 1, 1)),
            8: ("2x4", "ct5lp-hightpu-8t", (2, 4, 1)),
        },
    ),
    **_tpu_entries(
        prefix="v5p",
        chip="TPU v5p",
        gke_accelerator="tpu-v5p-slice",
        units_per_chip=2,
        machine_type="ct5p-hightpu-4t",
        topologies={
            4: "2x2x1",
            8: "2x2x2",
            16: "2x2x4",
            32: "2x4x4",
            64: "4x4x4",
            128: "4x4x8",
            256: "4x8x8",
            512: "8x8x8",
            1024: "8x8x16",
            2048: "8x16x16",
            3072: "12x16x16",
            4096: "16x16x16",
            6144: "16x16x24",
        },
    ),
    **_tpu_entries(
        prefix="v6e",
        chip="TPU v6e",
        gke_accelerator="tpu-v6e-slice",
        units_per_chip=1,
        machine_type="ct6e-standard-4t",
        topologies=_TWO_D_TOPOLOGIES,
        single_host={
            1: ("1x1", "ct6e-standard-1t", (1, 1, 1)),
            8: ("2x4", "ct6e-standard-8t", (2, 4, 1)),
        },
    ),
    # TPU 7x (Ironwood), counted in TensorCores like v4/v5p ("7x-128": 64 chips, 16 hosts, 128
    # JAX devices), as AXLearn's `tpu-7x-128`/`tpu-7x-256` mesh rules name it.
    **_tpu_entries(
        prefix="7x",
        chip="TPU 7x",
        gke_accelerator="tpu7x",
        units_per_chip=2,
        machine_type="tpu7x-standard-4t",
        devices_per_chip=2,
        topologies={
            4: "2x2x1",
            8: "2x2x2",
            16: "2x2x4",
            32: "2x4x4",
            64: "4x4x4",
            128: "4x4x8",
            256: "4x8x8",
            512: "8x8x8",
            1024: "8x8x16",
            2048: "8x16x16",
            4096: "16x16x16",
        },
    ),
    "a3-highgpu-8g": _gpu_entry("a3-highgpu-8g", "nvidia-h100-80gb", "NVIDIA H100 SXM"),
    "a3-megagpu-8g": _gpu_entry("a3-megagpu-8g", "nvidia-h100-mega-80gb", "NVIDIA H100 SXM"),
    "a3-ultragpu-8g": _gpu_entry("a3-ultragpu-8g", "nvidia-h200-141gb", "NVIDIA H200"),
    "a4-highgpu-8g": _gpu_entry("a4-highgpu-8g", "nvidia-b200", "NVIDIA B200"),
}


def _unknown(kind: str, name: str, choices: list[str]) -> ValueError:
    close = difflib.get_close_matches(name, choices, n=5, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return ValueError(f"Unknown {kind} {name!r}.{hint} Known: {', '.join(sorted(choices))}.")


def get_system_characteristics(device_type: str) -> SystemCharacteristics:
    """Returns the table entry of a TPU accelerator type or GPU machine type.

    Args:
        device_type: A table key, e.g. "v5p-128", "v5litepod-256", "a3-highgpu-8g".

    Returns:
        The `SystemCharacteristics`.

    Raises:
        ValueError: Unknown type; the message lists the closest known names.
    """
    table = USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS
    if device_type not in table:
        raise _unknown("topology", device_type, list(table))
    return table[device_type]


def instance_type_to_system_characteristics(instance_type: str) -> SystemCharacteristics:
    """Returns the table entry of a launch instance type.

    Args:
        instance_type: "tpu-<accelerator type>" (e.g. "tpu-v5p-128") or "gpu-<machine type>"
            (e.g. "gpu-a3-highgpu-8g").

    Returns:
        The `SystemCharacteristics`.

    Raises:
        ValueError: Unknown instance type; the message lists the closest known names.
    """
    names = {sc.instance_type: sc for sc in USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS.values()}
    if instance_type not in names:
        raise _unknown("instance type", instance_type, list(names))
    return names[instance_type]


def instance_types() -> list[str]:
    """Returns every launch instance type, in table order."""
    return [sc.instance_type for sc in USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS.values()]


def mesh_selector_for(instance_type: str, num_replicas: int = 1) -> str:
    """Returns the `--mesh_selector` value a launch passes, following AXLearn's convention.

    The experiment's `mesh_rules` are regexes matched against it (AXLearn's fuji rules:
    "tpu-v5p-.*", "tpu-v5litepod-256-4", "gpu-(p5.48xlarge|p4de.24xlarge|a3-highgpu-8g)-256"):

    - TPU, one slice: the instance type ("tpu-v5p-128"); several slices: the instance type and
      the slice count ("tpu-v5p-128-2").
    - GPU: the instance type and the total GPU count ("gpu-a3-highgpu-8g-16" for 2 nodes of 8).

    Args:
        instance_type: A launch instance type.
        num_replicas: TPU slices or GPU nodes.

    Returns:
        The mesh selector.

    Raises:
        ValueError: Unknown instance type, or num_replicas < 1.
    """
    sc = instance_type_to_system_characteristics(instance_type)
    if num_replicas < 1:
        raise ValueError(f"--num_replicas must be >= 1, got {num_replicas}.")
    if sc.platform == "gpu":
        return f"{instance_type}-{sc.chips_per_vm * num_replicas}"
    return instance_type if num_replicas == 1 else f"{instance_type}-{num_replicas}"


def total_chips(sc: SystemCharacteristics, num_slices: int = 1) -> int:
    """Returns the chips of `num_slices` slices (or GPU nodes).

    Args:
        sc: The slice's characteristics.
        num_slices: Number of slices (replicas).

    Returns:
        Total chip count.
    """
    if num_slices < 1:
        raise ValueError(f"num_slices must be >= 1, got {num_slices}.")
    return sc.chips_per_slice * num_slices


def _check_table() -> None:
    """Asserts the table's internal consistency (chip count equals the topology's volume)."""
    for key, sc in USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS.items():
        assert key == sc.device_type, key
        assert sc.chip in CHIP_SPECS, key
        if sc.platform == "tpu":
            volume = math.prod(int(d) for d in sc.topology.split("x"))
            assert volume == sc.chips_per_slice, (key, volume, sc.chips_per_slice)


_check_table()
