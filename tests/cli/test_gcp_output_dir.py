"""Tests `axlearn gcp launch --output_dir` (the getting-started tutorial's launch flag)."""

from __future__ import annotations

import pytest
import yaml

from axlearn.cli import main as cli_main
from axlearn.cloud.gcp import jobset as js
from axlearn.cloud.gcp import launch
from tests.cloud.gcp.test_k8s import (  # noqa: F401 (pytest fixtures)
    JOBSETS_PATH,
    active_config,
    kubeconfig,
    server,
)

OUTPUT_DIR = "gs://my-bucket/me/experiments/resnet50-2026-01-01"
# The tutorial's launch, as a user types it (with --skip_preflight to keep the test fast).
TUTORIAL_LAUNCH = [
    "gcp", "launch", "start", "--runner_name=gke_tpu_single", "--name=me-test",
    "--instance_type=tpu-v4-8", "--image=img:1", "--skip_preflight",
    f"--output_dir={OUTPUT_DIR}", "--",
    "python3", "-m", "axlearn.common.launch_trainer_main",
    "--module=vision.resnet.imagenet_trainer", "--config=ResNet-50",
    f"--trainer_dir={OUTPUT_DIR}", "--data_dir=gs://my-bucket/tensorflow_datasets",
    "--jax_backend=tpu",
]  # fmt: skip


def _env(jobset: dict) -> dict[str, str]:
    container = js.pod_template(jobset)["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_dry_run_shows_the_output_dir_and_gives_it_to_the_pods(active_config, capsys):  # noqa: F811
    assert cli_main.main(TUTORIAL_LAUNCH[:3] + ["--dry_run"] + TUTORIAL_LAUNCH[3:]) == 0
    out = capsys.readouterr().out
    header, _, body = out.partition("\n---\n")
    assert f"# Output dir: {OUTPUT_DIR} (env AXLEARN_OUTPUT_DIR)" in header
    assert "# Experiment vision.resnet.imagenet_trainer:ResNet-50" in header
    manifest = yaml.safe_load(body)
    assert _env(manifest)["AXLEARN_OUTPUT_DIR"] == OUTPUT_DIR
    command = js.pod_template(manifest)["spec"]["containers"][0]["command"]
    # The command's own --trainer_dir is kept (once).
    assert [a for a in command if a.startswith("--trainer_dir")] == [f"--trainer_dir={OUTPUT_DIR}"]


def test_output_dir_is_the_default_trainer_dir():
    options = launch.LaunchOptions(
        name="x",
        instance_type="tpu-v4-8",
        image="img:1",
        output_dir=OUTPUT_DIR + "/",
        command=["python", "-m", "axlearn.common.launch_trainer_main", "--module=m", "--config=c"],
    )
    prepared = launch.prepare_launch(options, {"_name": "p:z", "permanent_bucket": "perm"})
    assert prepared.trainer_dir == OUTPUT_DIR  # Not gs://perm/axlearn/jobs/x.
    assert prepared.command[-1] == f"--trainer_dir={OUTPUT_DIR}"


@pytest.mark.parametrize("bad", ["/tmp/out", "out", "gs://", ""])
def test_local_output_dir_is_refused(active_config, capsys, bad):  # noqa: F811
    argv = [
        a if not a.startswith("--output_dir") else f"--output_dir={bad}" for a in TUTORIAL_LAUNCH
    ]
    assert cli_main.main(argv[:3] + ["--dry_run"] + argv[3:]) == 1
    err = capsys.readouterr().err
    assert f"--output_dir={bad!r} must be a remote path the pods can write" in err
    assert err.count("\n") == 1


def test_start_submits_the_output_dir(server, kubeconfig, active_config, capsys):  # noqa: F811
    path = JOBSETS_PATH.format(ns="default")
    server.responses[("POST", path)] = (201, lambda body: body)
    argv = TUTORIAL_LAUNCH[:3] + [f"--kubeconfig={kubeconfig}"] + TUTORIAL_LAUNCH[3:]
    assert cli_main.main(argv) == 0, capsys.readouterr().err
    body = server.requests[-1]["body"]
    assert body["metadata"]["name"] == "me-test"
    assert _env(body)["AXLEARN_OUTPUT_DIR"] == OUTPUT_DIR
    assert "Submitted JobSet me-test" in capsys.readouterr().out
