"""GCP bundlers: `docker`, `artifactregistry` and `cloudbuild` (`--bundler_type`).

- `docker`: `docker build` with the local docker CLI, then `docker push` to `--bundler_spec=repo`
  (default: the config's docker_repo).
- `artifactregistry`: the same, the image tagged in the config's Artifact Registry docker_repo
  (required), after `gcloud auth configure-docker` for the registry host.
- `cloudbuild`: the build runs on Cloud Build: a build request (one docker build step, the image
  pushed by Cloud Build) submitted with `gcloud builds submit`.

Every image is tagged with the job name and built with `--build-arg GIT_COMMIT=<commit>` so the
run summary names the commit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

from axlearn.cloud.common.bundler import (
    REQUEST_FILE,
    BuildPlan,
    BundlerError,
    check_clean,
    git_state,
    parse_bundler_spec,
)

BUNDLER_TYPES = ("docker", "artifactregistry", "cloudbuild")


def _docker_build(spec, image: str, commit: str) -> list[str]:
    cmd = ["docker", "build", "--platform", spec.platform, "-f", spec.dockerfile]
    if spec.target:
        cmd += ["--target", spec.target]
    cmd += ["-t", image, "--build-arg", f"GIT_COMMIT={commit}"]
    for name, value in sorted(spec.build_args.items()):
        cmd += ["--build-arg", f"{name}={value}"]
    return cmd + [spec.context]


def build_plan(
    bundler_type: str,
    *,
    name: str,
    spec_items: Sequence[str],
    config: dict,
    default_target: Optional[str] = None,
) -> BuildPlan:
    """Returns the build plan of a bundler for a job.

    Args:
        bundler_type: One of `BUNDLER_TYPES`.
        name: The job name (the image tag).
        spec_items: `--bundler_spec` values.
        config: The active GCP config (docker_repo, default_dockerfile, project, ttl_bucket).
        default_target: The Dockerfile target when the spec has none (the platform: tpu, gpu).

    Returns:
        The `BuildPlan`.

    Raises:
        BundlerError: Unknown bundler type or spec key, no docker repository, or a dirty tree
            without allow_dirty.
    """
    if bundler_type not in BUNDLER_TYPES:
        raise BundlerError(
            f"--bundler_type={bundler_type!r} is not one of {', '.join(BUNDLER_TYPES)}."
        )
    spec = parse_bundler_spec(
        spec_items,
        dockerfile=config.get("default_dockerfile"),
        repo=config.get("docker_repo"),
        target=default_target,
    )
    if (
        bundler_type == "artifactregistry"
        and spec_items
        and any(i.startswith("repo=") for i in spec_items)
    ):
        raise BundlerError(
            "--bundler_type=artifactregistry pushes to the config's docker_repo; "
            "use --bundler_type=docker to push elsewhere (--bundler_spec=repo=...)."
        )
    if not spec.repo:
        raise BundlerError(
            f"--bundler_type={bundler_type} needs a docker repository: set docker_repo in the "
            f'config [gcp."{config.get("_name", "PROJECT:ZONE")}"] or pass '
            "--bundler_spec=repo=REPO."
        )
    if not os.path.isfile(os.path.join(spec.context, spec.dockerfile)):
        raise BundlerError(
            f"--bundler_spec=dockerfile={spec.dockerfile!r}: no such file in the build context "
            f"{os.path.abspath(spec.context)}."
        )
    state = git_state(spec.context)
    check_clean(state, spec)
    image = f"{spec.repo.rstrip('/')}/{spec.image}:{name}"
    build = _docker_build(spec, image, state.commit)
    if bundler_type == "docker":
        return BuildPlan("docker", image, [build, ["docker", "push", image]], None, state.commit)
    if bundler_type == "artifactregistry":
        host = spec.repo.split("/", 1)[0]
        commands = [["gcloud", "auth", "configure-docker", host, "--quiet"], build]
        commands.append(["docker", "push", image])
        return BuildPlan("artifactregistry", image, commands, None, state.commit)
    # cloudbuild: the same docker build, run by Cloud Build; Cloud Build pushes `images`.
    request = {
        "steps": [{"name": "gcr.io/cloud-builders/docker", "args": build[1:-1] + ["."]}],
        "images": [image],
        "timeout": "3600s",
        "tags": ["axlearn", name],
    }
    submit = ["gcloud", "builds", "submit", spec.context, f"--config={REQUEST_FILE}"]
    if config.get("project"):
        submit.append(f"--project={config['project']}")
    if config.get("ttl_bucket"):
        submit.append(f"--gcs-source-staging-dir=gs://{config['ttl_bucket']}/axlearn/cloudbuild")
    return BuildPlan("cloudbuild", image, [submit], request, state.commit)
