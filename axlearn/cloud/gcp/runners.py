"""GKE runners: which JobSet layout runs an instance type (`--runner_name`).

| Runner | Instance types | Layout |
| --- | --- | --- |
| `gke_tpu_single` | `tpu-*` | one Job per slice (`--num_replicas` slices), one pod per host |
| `gke_gpu_a3_high_single` | `gpu-a3-highgpu-8g` (H100) | one Job, one pod per node |
| `gke_gpu_a3_mega_single` | `gpu-a3-megagpu-8g` (H100 Mega) | one Job, one pod per node |
| `gke_gpu_a3_ultra_single` | `gpu-a3-ultragpu-8g` (H200) | one Job, one pod per node |
| `gke_gpu_a4_high_single` | `gpu-a4-highgpu-8g` (B200) | one Job, one pod per node |

The runner is picked from the instance type; `--runner_name` names one explicitly, and a runner
that cannot run the instance type is an error.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from axlearn.cloud.gcp.system_characteristics import (
    SystemCharacteristics,
    instance_type_to_system_characteristics,
)


@dataclasses.dataclass(frozen=True)
class Runner:
    """A GKE runner.

    Attributes:
        name: The runner name.
        platform: "tpu" or "gpu".
        machine_type: The GPU machine type it runs (None: every TPU type).
    """

    name: str
    platform: str
    machine_type: Optional[str] = None

    def supports(self, sc: SystemCharacteristics) -> bool:
        """Returns whether this runner can run `sc`."""
        if sc.platform != self.platform:
            return False
        return self.machine_type is None or self.machine_type == sc.gce_machine_type


RUNNERS: dict[str, Runner] = {
    r.name: r
    for r in (
        Runner("gke_tpu_single", "tpu"),
        Runner("gke_gpu_a3_high_single", "gpu", "a3-highgpu-8g"),
        Runner("gke_gpu_a3_mega_single", "gpu", "a3-megagpu-8g"),
        Runner("gke_gpu_a3_ultra_single", "gpu", "a3-ultragpu-8g"),
        Runner("gke_gpu_a4_high_single", "gpu", "a4-highgpu-8g"),
    )
}


def select_runner(instance_type: str, runner_name: Optional[str] = None) -> Runner:
    """Returns the runner of an instance type.

    Args:
        instance_type: A launch instance type ("tpu-v5p-128").
        runner_name: An explicit runner (None: picked from the instance type).

    Returns:
        The `Runner`.

    Raises:
        ValueError: Unknown instance type or runner, or a runner that cannot run the type.
    """
    sc = instance_type_to_system_characteristics(instance_type)
    if runner_name is None:
        for runner in RUNNERS.values():
            if runner.supports(sc):
                return runner
        raise ValueError(f"No runner can run --instance_type={instance_type}.")
    if runner_name not in RUNNERS:
        raise ValueError(
            f"Unknown --runner_name={runner_name!r}; known: {', '.join(sorted(RUNNERS))}."
        )
    runner = RUNNERS[runner_name]
    if not runner.supports(sc):
        fit = [r.name for r in RUNNERS.values() if r.supports(sc)]
        raise ValueError(
            f"--runner_name={runner_name} cannot run --instance_type={instance_type}; "
            f"use {', '.join(fit)}."
        )
    return runner
