"""Tests axlearn/cloud/gcp/jobset.py: the JobSet manifests of TPU slices and GPU nodes.

Every manifest is checked three ways: its JobSet part against the JobSet v1alpha2 JSON schema
in tests/testdata/, its Job and pod templates with kubernetes-validate (strict), and its pod
template through the `kubernetes` client's model classes (deserialize, serialize: same dict).
"""

from __future__ import annotations

import json
import os

import jsonschema
import kubernetes
import kubernetes_validate
import pytest

from axlearn.cloud.common import process_env
from axlearn.cloud.gcp import jobset as js

SCHEMA_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    "testdata",
    "jobset_v1alpha2.schema.json",
)
K8S_VERSION = "1.31"

# (instance type, replicas, expected jobs, pods per job, chips per pod, topology)
CASES = [
    ("tpu-v5litepod-16", 1, 1, 4, 4, "4x4"),
    ("tpu-v5p-8", 2, 2, 1, 4, "2x2x1"),
    ("tpu-v4-32", 4, 4, 4, 4, "2x2x4"),
    ("tpu-v5p-128", 2, 2, 16, 4, "4x4x4"),
    ("tpu-v6e-256", 1, 1, 64, 4, "16x16"),
    ("gpu-a3-highgpu-8g", 2, 1, 2, 8, None),
]


def _spec(instance_type: str, replicas: int, **kw) -> js.JobSpec:
    return js.JobSpec(
        name="my-job",
        instance_type=instance_type,
        num_replicas=replicas,
        image="us-docker.pkg.dev/p/axlearn/axlearn:my-job",
        command=["python", "-m", "axlearn.common.launch_trainer_main", "--module=m"],
        user="alice@example.com",
        max_tries=2,
        max_restarts=3,
        **kw,
    )


def _round_trip(obj: dict, klass: str) -> dict:
    client = kubernetes.client.ApiClient()
    model = client.deserialize(json.dumps(obj), klass, "application/json")
    return client.sanitize_for_serialization(model)


@pytest.mark.parametrize("instance_type,replicas,jobs,pods,chips,topology", CASES)
def test_manifest_validates_and_round_trips(instance_type, replicas, jobs, pods, chips, topology):
    manifest = js.build_jobset(_spec(instance_type, replicas))
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        jsonschema.validate(manifest, json.load(f))
    rjob = manifest["spec"]["replicatedJobs"][0]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, **rjob["template"]}
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    template = js.pod_template(manifest)
    kubernetes_validate.validate(
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "x"},
            "template": template,
        },
        K8S_VERSION,
        strict=True,
    )
    assert _round_trip(template, "V1PodTemplateSpec") == template
    assert _round_trip(rjob["template"], "V1JobTemplateSpec") == rjob["template"]

    # Layout and resources, from the instance-type table.
    assert rjob["replicas"] == jobs
    assert rjob["template"]["spec"]["parallelism"] == pods
    assert rjob["template"]["spec"]["completions"] == pods
    assert rjob["template"]["spec"]["completionMode"] == "Indexed"
    assert rjob["template"]["spec"]["backoffLimit"] == 2
    assert manifest["spec"]["failurePolicy"] == {"maxRestarts": 3}
    assert manifest["spec"]["network"] == {"enableDNSHostnames": True, "subdomain": "my-job"}
    (container,) = template["spec"]["containers"]
    resource = "nvidia.com/gpu" if topology is None else "google.com/tpu"
    assert container["resources"]["limits"] == {resource: str(chips)}
    assert container["command"][:3] == ["python", "-m", "axlearn.common.launch_trainer_main"]
    labels = manifest["metadata"]["labels"]
    assert labels[js.JOB_NAME_LABEL] == "my-job" and labels[js.USER_LABEL] == "alice_example.com"
    assert template["metadata"]["labels"] == labels
    selector = template["spec"]["nodeSelector"]
    if topology is not None:
        assert selector["cloud.google.com/gke-tpu-topology"] == topology
        assert manifest["metadata"]["annotations"] == {
            js.EXCLUSIVE_TOPOLOGY_ANNOTATION: "cloud.google.com/gke-nodepool"
        }
    else:
        assert selector["cloud.google.com/gke-accelerator"] == "nvidia-h100-80gb"


def _env(manifest: dict) -> dict:
    return {e["name"]: e for e in js.pod_template(manifest)["spec"]["containers"][0]["env"]}


def test_tpu_env():
    single = _env(js.build_jobset(_spec("tpu-v5p-128", 1)))
    assert not any(k.startswith("MEGASCALE") for k in single)
    assert process_env.PROCESS_ID_ENV not in single  # TPU discovers its peers itself.
    env = _env(js.build_jobset(_spec("tpu-v5p-128", 4)))
    assert env["MEGASCALE_NUM_SLICES"]["value"] == "4"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == "my-job-job-0-0.my-job:8080"
    assert env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/job-index']"
    )


def test_gpu_env_is_the_local_launch_contract():
    """The pods' env and `axlearn local launch`'s env come from one contract."""
    spec = _spec("gpu-a3-highgpu-8g", 3)
    env = _env(js.build_jobset(spec))
    assert env["DISTRIBUTED_COORDINATOR"]["value"] == "my-job-job-0-0.my-job:8476"
    assert env["NUM_PROCESSES"]["value"] == "3"
    assert env["PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    # Resolving the pod env at pod index 2 gives what the local launcher gives process 2.
    pod = {}
    for name, entry in env.items():
        if "value" in entry:
            pod[name] = entry["value"]
        else:
            assert entry["valueFrom"]["fieldRef"]["fieldPath"].endswith("job-completion-index']")
            pod[name] = "2"
    contract = js.contract_env(spec, js.instance_type_to_system_characteristics(spec.instance_type))
    assert process_env.resolve_env(contract, completion_index=2) == pod


def test_priority_and_service_account():
    template = js.pod_template(
        js.build_jobset(_spec("tpu-v4-8", 1, priority_class="high", service_account="trainer"))
    )
    assert template["spec"]["priorityClassName"] == "high"
    assert template["spec"]["serviceAccountName"] == "trainer"


@pytest.mark.parametrize(
    "name,match",
    [
        ("My-Job", "not a valid Kubernetes name"),
        ("job_1", "not a valid Kubernetes name"),
        ("1job", "not a valid Kubernetes name"),
        ("job-", "not a valid Kubernetes name"),
        ("", "not a valid Kubernetes name"),
        ("a" * 60, "too long"),
    ],
)
def test_bad_names(name, match):
    with pytest.raises(ValueError, match=match):
        js.build_jobset(dataclass_replace(_spec("tpu-v5p-8", 1), name=name))


def test_name_length_accounts_for_pod_host_names():
    # "<name>-job-1-15" must fit in 63 characters: 2 slices x 16 hosts leaves 54 for the name.
    js.validate_name("a" * 54, num_slices=2, hosts_per_slice=16)
    with pytest.raises(ValueError, match="use at most 54 characters"):
        js.validate_name("a" * 55, num_slices=2, hosts_per_slice=16)


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_replicas must be >= 1, got 0"):
        js.build_jobset(_spec("tpu-v5p-8", 0))
    with pytest.raises(ValueError, match="Unknown instance type 'tpu-v5p-7'.*tpu-v5p-8"):
        js.build_jobset(_spec("tpu-v5p-7", 1))
    with pytest.raises(ValueError, match="max_tries"):
        js.build_jobset(dataclass_replace(_spec("tpu-v5p-8", 1), max_tries=-1))


def dataclass_replace(spec, **kw):
    import dataclasses

    return dataclasses.replace(spec, **kw)
