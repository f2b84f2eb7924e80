"""Tests axlearn/cloud/gcp/launch.py: preparing a launch and its dry-run text."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from axlearn.cloud.gcp import launch
from axlearn.cloud.gcp.config import ConfigError

CONFIG = {
    "_name": "p:z",
    "project": "p",
    "zone": "z",
    "permanent_bucket": "perm",
    "docker_repo": "us-docker.pkg.dev/p/repo",
}
COMMAND = [
    "python", "-m", "axlearn.common.launch_trainer_main",
    "--module=text.gpt.honeycrisp", "--config=honeycrisp-3B",
]  # fmt: skip


@pytest.fixture
def repo(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    git("add", "Dockerfile")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.chdir(tmp_path)


def _options(**kw) -> launch.LaunchOptions:
    base = dict(name="x", instance_type="tpu-v5p-128", command=COMMAND, num_replicas=2, user="u")
    return launch.LaunchOptions(**{**base, **kw})


def test_dry_run_prints_plan_and_the_manifest(repo):
    prepared = launch.prepare_launch(_options(), CONFIG)
    text = launch.describe_launch(prepared)
    header, _, body = text.partition("\n---\n")
    assert yaml.safe_load(body) == prepared.jobset
    assert "runner gke_tpu_single" in header
    assert (
        "2 slice(s) x 16 host(s) x 4 chip(s) (TPU v5p, 95.0 GB HBM per chip, topology 4x4x4)"
        in header
    )
    assert "128 chips in all" in header
    assert "# Trainer dir: gs://perm/axlearn/jobs/x" in header
    assert "docker build --platform linux/amd64 -f Dockerfile --target tpu" in header
    assert prepared.command == COMMAND + [
        "--mesh_selector=tpu-v5p-128-2",
        "--jax_backend=tpu",
        "--trainer_dir=gs://perm/axlearn/jobs/x",
    ]
    container = prepared.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert container["spec"]["containers"][0]["image"] == "us-docker.pkg.dev/p/repo/axlearn:x"


def test_given_image_skips_bundling_and_gpu_layout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Not a git repo, no Dockerfile: nothing is bundled.
    prepared = launch.prepare_launch(
        _options(
            instance_type="gpu-a3-highgpu-8g", image="img:1", command=COMMAND + ["--trainer_dir=/d"]
        ),
        {"_name": "p:z"},
    )
    assert prepared.plan is None and prepared.trainer_dir is None
    assert prepared.runner.name == "gke_gpu_a3_high_single"
    assert "--jax_backend=gpu" in prepared.command
    assert "Image (given, not built): img:1" in launch.describe_launch(prepared)


@pytest.mark.parametrize(
    "kw,error,match",
    [
        (dict(instance_type="tpu-v5p-100"), ValueError, "Unknown instance type 'tpu-v5p-100'"),
        (dict(num_replicas=0), ValueError, "--num_replicas must be >= 1, got 0"),
        (dict(name="Bad_Name"), ValueError, "--name='Bad_Name' is not a valid Kubernetes name"),
        (dict(name="n" * 60), ValueError, "is too long"),
        (dict(command=[]), ValueError, "No command given"),
        (dict(bundler_spec=["color=red"]), ValueError, "key 'color' does not exist"),
    ],
)
def test_bad_input(repo, kw, error, match):
    with pytest.raises(error, match=match):
        launch.prepare_launch(_options(**kw), CONFIG)


def test_trainer_dir_needs_a_bucket(repo):
    config = {k: v for k, v in CONFIG.items() if k != "permanent_bucket"}
    with pytest.raises(ConfigError, match="has no 'permanent_bucket'"):
        launch.prepare_launch(_options(), config)


def _pod_env(prepared) -> dict:
    pod = prepared.jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def test_gpu_pods_get_the_xla_flag_set(tmp_path, monkeypatch):
    """GPU instance types: XLA_FLAGS from compiler_options.GPU_XLA_FLAG_SETS, overridable."""
    from axlearn.common.compiler_options import GPU_XLA_FLAG_SETS

    monkeypatch.chdir(tmp_path)
    gpu = dict(
        instance_type="gpu-a3-highgpu-8g", image="img:1", command=COMMAND + ["--trainer_dir=/d"]
    )
    flags = _pod_env(launch.prepare_launch(_options(**gpu), {"_name": "p:z"}))["XLA_FLAGS"]
    recipe = GPU_XLA_FLAG_SETS["llm_recipe"]
    assert flags.split() == [
        f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(recipe.items())
    ]
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags.split()
    env = _pod_env(
        launch.prepare_launch(
            _options(
                **gpu,
                xla_flag_set="latency_hiding",
                xla_flags="--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/h",
            ),
            {"_name": "p:z"},
        )
    )
    assert env["XLA_FLAGS"] == (
        "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/h"
    )
    env = _pod_env(launch.prepare_launch(_options(**gpu, xla_flag_set="none"), {"_name": "p:z"}))
    assert "XLA_FLAGS" not in env
    with pytest.raises(ValueError, match="XLA flag set 'fast' is unknown; choose one of none, "):
        launch.prepare_launch(_options(**gpu, xla_flag_set="fast"), {"_name": "p:z"})


def test_tpu_pods_get_no_xla_flags(repo):
    assert "XLA_FLAGS" not in _pod_env(launch.prepare_launch(_options(), CONFIG))
