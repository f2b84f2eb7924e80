"""Tests axlearn/cloud/gcp/bundler.py: the build plans of docker, artifactregistry, cloudbuild."""

from __future__ import annotations

import subprocess

import pytest

from axlearn.cloud.common.bundler import BundlerError
from axlearn.cloud.gcp import bundler

CONFIG = {
    "_name": "p:z",
    "project": "p",
    "ttl_bucket": "ttl",
    "docker_repo": "us-docker.pkg.dev/p/repo",
}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    git("add", "Dockerfile")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.chdir(tmp_path)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    return tmp_path, commit


def test_docker_and_artifactregistry_plans(repo):
    _, commit = repo
    image = "us-docker.pkg.dev/p/repo/axlearn:job1"
    build = [
        "docker", "build", "--platform", "linux/amd64", "-f", "Dockerfile", "--target", "tpu",
        "-t", image, "--build-arg", f"GIT_COMMIT={commit}", "--build-arg", "X=1", ".",
    ]  # fmt: skip
    plan = bundler.build_plan(
        "docker", name="job1", spec_items=["build_arg.X=1"], config=CONFIG, default_target="tpu"
    )
    assert plan.image == image and plan.git_commit == commit
    assert plan.commands == [build, ["docker", "push", image]]
    plan = bundler.build_plan(
        "artifactregistry", name="job1", spec_items=["build_arg.X=1"], config=CONFIG,
        default_target="tpu",
    )  # fmt: skip
    assert plan.commands[0] == [
        "gcloud",
        "auth",
        "configure-docker",
        "us-docker.pkg.dev",
        "--quiet",
    ]
    assert plan.commands[1:] == [build, ["docker", "push", image]]
    assert "docker push " + image in plan.describe()


def test_cloudbuild_request(repo):
    _, commit = repo
    plan = bundler.build_plan(
        "cloudbuild", name="job2", spec_items=["target=gpu", "image=train"], config=CONFIG
    )
    image = "us-docker.pkg.dev/p/repo/train:job2"
    assert plan.request["images"] == [image]
    (step,) = plan.request["steps"]
    assert step["name"] == "gcr.io/cloud-builders/docker"
    assert step["args"][step["args"].index("--target") + 1] == "gpu"
    assert f"GIT_COMMIT={commit}" in step["args"]
    assert plan.commands == [
        ["gcloud", "builds", "submit", ".", "--config=cloudbuild.json", "--project=p",
         "--gcs-source-staging-dir=gs://ttl/axlearn/cloudbuild"],
    ]  # fmt: skip
    assert '"images": [' in plan.describe()


def test_errors(repo):
    path, _ = repo
    with pytest.raises(BundlerError, match="--bundler_type='podman' is not one of"):
        bundler.build_plan("podman", name="j", spec_items=[], config=CONFIG)
    with pytest.raises(BundlerError, match="key 'tag' does not exist"):
        bundler.build_plan("docker", name="j", spec_items=["tag=x"], config=CONFIG)
    with pytest.raises(BundlerError, match="needs a docker repository: set docker_repo"):
        bundler.build_plan("docker", name="j", spec_items=[], config={"_name": "p:z"})
    with pytest.raises(BundlerError, match="dockerfile='Nope': no such file"):
        bundler.build_plan("docker", name="j", spec_items=["dockerfile=Nope"], config=CONFIG)
    (path / "new.py").write_text("x = 1\n")
    with pytest.raises(BundlerError, match=r"uncommitted change\(s\) \(new.py\)"):
        bundler.build_plan("docker", name="j", spec_items=[], config=CONFIG)
    plan = bundler.build_plan("docker", name="j", spec_items=["allow_dirty=true"], config=CONFIG)
    assert plan.image.endswith(":j")
