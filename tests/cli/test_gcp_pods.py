"""The pods of a dry-run JobSet, run here: what `axlearn gcp launch` would start is what trains.

`axlearn gcp launch --dry_run` prints the JobSet. This test reads each pod out of it exactly as
Kubernetes would materialize it and runs the pods as local processes on CPU for a few steps:

- one pod per (Job index j < replicas, completion index c < parallelism) of each replicated job;
- its container `command`, argument by argument, and its `env`: literal values as given,
  `fieldRef`s to the `jobset.sigs.k8s.io/job-index` / `batch.kubernetes.io/job-completion-index`
  annotations resolved to j / c (the downward API);
- the JobSet's pod DNS names (`<name>-job-<j>-<c>.<name>`, served by the headless service that
  `enableDNSHostnames` creates) replaced by 127.0.0.1 wherever they appear.

What the machine a pod lands on gives, and this CPU does not, is supplied and stated here:

- the interpreter: the image's `python` is this test's `sys.executable`, with this checkout on
  PYTHONPATH (the image installs the package);
- the accelerators: each pod's chips (8 GPUs per a3-highgpu node; 4 chips per v5p-8 host) are
  that many CPU devices (`--xla_force_host_platform_device_count`, JAX_PLATFORMS=cpu), and
  `--jax_backend=gpu|tpu` is run as `--jax_backend=cpu` (the only argument changed). Where the
  manifest sets XLA_FLAGS (the GPU flag set the launcher applies), the device-count flag is
  appended to the manifest's flags, which stay as they are;
- TPU only: a TPU pod learns its process id, the process count and the coordinator from the
  TPU runtime (which CPU lacks), so the test sets DISTRIBUTED_COORDINATOR=127.0.0.1:<free port>,
  NUM_PROCESSES = slices x hosts and PROCESS_ID = j x hosts + c, which is what JAX's TPU cluster
  detection computes (slice-major process ids, slice 0's first host coordinating). The
  MEGASCALE_* variables stay exactly as the manifest has them.

Every other variable and argument (`--mesh_selector`, `--module`, `--config`, the user's flags)
is the manifest's. The losses of the pods equal those of one process running the same command
on all the devices at once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from axlearn.cli import main as cli_main
from axlearn.cloud.common.local_launch import free_port
from tests.cli.test_gcp import CONFIG, REPO_ROOT
from tests.common import trainer_test_utils as tu

STEPS = 3
JOB_INDEX = "metadata.annotations['jobset.sigs.k8s.io/job-index']"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def materialize_pods(jobset: dict) -> list[dict]:
    """Returns each pod of a JobSet as Kubernetes would start it: {name, command, env}.

    Args:
        jobset: The JobSet manifest.

    Returns:
        One dict per pod, in (replicated job, job index, completion index) order, with the
        pod's host name, its container command and its resolved environment.
    """
    name = jobset["metadata"]["name"]
    pods = []
    for rjob in jobset["spec"]["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        assert job_spec["completionMode"] == "Indexed"
        assert job_spec["parallelism"] == job_spec["completions"]
        (container,) = job_spec["template"]["spec"]["containers"]
        for j in range(rjob["replicas"]):
            for c in range(job_spec["completions"]):
                env = {}
                for var in container.get("env", []):
                    if "value" in var:
                        env[var["name"]] = var["value"]
                    else:
                        path = var["valueFrom"]["fieldRef"]["fieldPath"]
                        env[var["name"]] = {JOB_INDEX: str(j), COMPLETION_INDEX: str(c)}[path]
                pods.append(
                    dict(
                        host=f"{name}-{rjob['name']}-{j}-{c}",
                        job_index=j,
                        completion_index=c,
                        hosts_per_job=job_spec["completions"],
                        command=list(container["command"]),
                        env=env,
                    )
                )
    return pods


def _localize(text: str, jobset_name: str) -> str:
    """The JobSet's pod DNS names -> 127.0.0.1."""
    return re.sub(rf"{jobset_name}-[a-z0-9-]+-\d+-\d+\.{jobset_name}", "127.0.0.1", text)


def _base_env(devices: int) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISTRIBUTED_COORDINATOR", "NUM_PROCESSES", "PROCESS_ID", "XLA_FLAGS")
        and not k.startswith("MEGASCALE_")
    }
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _on_cpu(command: list[str]) -> list[str]:
    """The pod's command with the image's python and the CPU backend (see the module doc)."""
    assert command[0] == "python"
    out = [sys.executable] + command[1:]
    backends = [a for a in out if a.startswith("--jax_backend=")]
    assert backends in (["--jax_backend=gpu"], ["--jax_backend=tpu"]), backends
    return [("--jax_backend=cpu" if a in backends else a) for a in out]


def _dry_run(home, capsys, instance_type: str, replicas: int, trainer_dir: str) -> dict:
    (home / ".axlearn.config").write_text(CONFIG)
    assert cli_main.main(["gcp", "config", "activate", "--label=v5p"]) == 0
    capsys.readouterr()
    argv = [
        "gcp", "launch", "--dry_run", "--skip_preflight", f"--instance_type={instance_type}",
        f"--num_replicas={replicas}", "--name=pods", "--image=img:1", "--",
        "python", "-m", "axlearn.common.launch_trainer_main", "--module=text.gpt.tiny",
        "--config=gpt-tiny", f"--trainer_dir={trainer_dir}", "--data_dir=FAKE",
        f"--config_override=max_step={STEPS}",
    ]  # fmt: skip
    assert cli_main.main(argv) == 0, capsys.readouterr().err
    return yaml.safe_load(capsys.readouterr().out.partition("\n---\n")[2])


def _run_pods(pods: list[dict], *, jobset_name: str, devices: int, tpu: bool, log_dir) -> None:
    procs = []
    port = free_port()
    for i, pod in enumerate(pods):
        env = _base_env(devices)
        cpu_flags = env["XLA_FLAGS"]
        env.update({k: _localize(v, jobset_name) for k, v in pod["env"].items()})
        if "XLA_FLAGS" in pod["env"]:  # The manifest's flags, plus this CPU's device count.
            env["XLA_FLAGS"] = f"{pod['env']['XLA_FLAGS']} {cpu_flags}"
        if tpu:  # What the TPU runtime would give the pod (see the module doc).
            env["DISTRIBUTED_COORDINATOR"] = f"127.0.0.1:{port}"
            env["NUM_PROCESSES"] = str(len(pods))
            env["PROCESS_ID"] = str(
                pod["job_index"] * pod["hosts_per_job"] + pod["completion_index"]
            )
        command = [_localize(a, jobset_name) for a in _on_cpu(pod["command"])]
        log = open(log_dir / f"pod{i}.log", "w", encoding="utf-8")  # pylint: disable=R1732
        procs.append(
            (subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=REPO_ROOT), log)
        )
    codes = []
    for p, log in procs:
        try:
            codes.append(p.wait(timeout=900))
        finally:
            log.close()
            if p.poll() is None:
                p.kill()
    logs = "\n".join((log_dir / f"pod{i}.log").read_text()[-3000:] for i in range(len(pods)))
    assert codes == [0] * len(pods), logs


def _one_process(command: list[str], devices: int, trainer_dir: str, log_dir) -> list[float]:
    command = [a for a in _on_cpu(command) if not a.startswith("--trainer_dir=")]
    proc = subprocess.run(
        command + [f"--trainer_dir={trainer_dir}"],
        env=_base_env(devices),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [r["loss"] for r in tu.read_metrics(trainer_dir)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "instance_type,replicas,pods_expected,devices_per_pod,tpu",
    [
        ("gpu-a3-highgpu-8g", 2, 2, 8, False),  # 2 GPU nodes: one Job of 2 pods.
        ("tpu-v5p-8", 2, 2, 4, True),  # 2 slices (multi-slice): 2 Jobs of 1 host each.
    ],
)
def test_dry_run_pods_train_like_one_process(
    tmp_path, monkeypatch, capsys, instance_type, replicas, pods_expected, devices_per_pod, tpu
):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    pods_dir = str(tmp_path / "pods")
    jobset = _dry_run(home, capsys, instance_type, replicas, pods_dir)
    pods = materialize_pods(jobset)
    assert len(pods) == pods_expected
    command = pods[0]["command"]
    assert all(p["command"] == command for p in pods)  # Every pod runs the same command.
    if tpu:
        assert pods[1]["env"]["MEGASCALE_SLICE_ID"] == "1"
        assert pods[1]["env"]["MEGASCALE_COORDINATOR_ADDRESS"] == "pods-job-0-0.pods:8080"
    else:
        assert [p["env"]["PROCESS_ID"] for p in pods] == ["0", "1"]
        assert pods[1]["env"]["DISTRIBUTED_COORDINATOR"] == "pods-job-0-0.pods:8476"
    (tmp_path / "logs").mkdir()
    _run_pods(pods, jobset_name="pods", devices=devices_per_pod, tpu=tpu, log_dir=tmp_path / "logs")
    pod_losses = [r["loss"] for r in tu.read_metrics(pods_dir)]
    with open(os.path.join(pods_dir, "launch_trainer_flags"), encoding="utf-8") as f:
        flags = json.load(f)
    selector = next(a.split("=", 1)[1] for a in command if a.startswith("--mesh_selector="))
    assert flags["mesh_selector"] == selector and flags["num_processes"] == pods_expected
    one_losses = _one_process(
        command, devices_per_pod * pods_expected, str(tmp_path / "one"), tmp_path / "logs"
    )
    assert len(pod_losses) == len(one_losses) == STEPS
    np.testing.assert_allclose(pod_losses, one_losses, rtol=1e-6)
