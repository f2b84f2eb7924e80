"""Tests axlearn/cloud/gcp/runners.py: runner choice from the instance type."""

import pytest

from axlearn.cloud.gcp.runners import select_runner


@pytest.mark.parametrize(
    "instance_type,runner",
    [
        ("tpu-v5p-128", "gke_tpu_single"),
        ("tpu-v6e-256", "gke_tpu_single"),
        ("gpu-a3-highgpu-8g", "gke_gpu_a3_high_single"),
        ("gpu-a3-megagpu-8g", "gke_gpu_a3_mega_single"),
        ("gpu-a3-ultragpu-8g", "gke_gpu_a3_ultra_single"),
        ("gpu-a4-highgpu-8g", "gke_gpu_a4_high_single"),
    ],
)
def test_picked_from_instance_type(instance_type, runner):
    assert select_runner(instance_type).name == runner
    assert select_runner(instance_type, runner).name == runner


def test_override_errors():
    with pytest.raises(ValueError, match="Unknown --runner_name='gke_x'"):
        select_runner("tpu-v5p-8", "gke_x")
    with pytest.raises(
        ValueError, match="cannot run --instance_type=tpu-v5p-8; use gke_tpu_single"
    ):
        select_runner("tpu-v5p-8", "gke_gpu_a3_high_single")
