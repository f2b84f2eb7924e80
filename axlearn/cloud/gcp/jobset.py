"""The JobSet (`jobset.x-k8s.io/v1alpha2`) that runs one launch on GKE TPU slices or GPU nodes.

Layout (see `axlearn.cloud.gcp.runners`):

- TPU: one replicated job `job` with `replicas` = slices; each Job is one slice, with
  `parallelism` = `completions` = hosts per slice (Indexed), one pod per host requesting
  `google.com/tpu` = chips per host, on nodes selected by `cloud.google.com/gke-tpu-accelerator`
  and `cloud.google.com/gke-tpu-topology`. JAX discovers the slice's hosts itself; a multi-slice
  job adds the `MEGASCALE_*` variables (coordinator = slice 0's first pod, slice id = job index).
  The exclusive-topology annotation puts each slice on its own node pool.
- GPU: one replicated job with one Job of `--num_replicas` pods (one per node), each requesting
  `nvidia.com/gpu` = 8; `DISTRIBUTED_COORDINATOR` = the first pod's DNS name, `NUM_PROCESSES`,
  `PROCESS_ID` = the pod's completion index (`axlearn.cloud.common.process_env`).

Pods reach each other by DNS: `spec.network.enableDNSHostnames` makes the JobSet controller
create a headless service named after the JobSet, so pod `<jobset>-job-<slice>-<host>` resolves
as `<jobset>-job-<slice>-<host>.<jobset>`.

The builder returns plain dicts (the manifest); it imports nothing outside the standard library.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Optional

from axlearn.cloud.common import process_env
from axlearn.cloud.common.process_env import EnvVar
from axlearn.cloud.gcp.system_characteristics import (
    SystemCharacteristics,
    instance_type_to_system_characteristics,
)

API_VERSION = "jobset.x-k8s.io/v1alpha2"
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
REPLICATED_JOB_NAME = "job"
EXCLUSIVE_TOPOLOGY_ANNOTATION = "alpha.jobset.sigs.k8s.io/exclusive-topology"
JOB_INDEX_ANNOTATION = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
JOB_NAME_LABEL = "axlearn/job-name"
USER_LABEL = "axlearn/user"
# Kubernetes names: a DNS-1035 label (the JobSet name is also the pods' DNS subdomain).
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MAX_LABEL = 63


def validate_name(name: str, *, num_slices: int = 1, hosts_per_slice: int = 1) -> None:
    """Checks that a job name is valid for Kubernetes and for its pods' host names.

    Args:
        name: The `--name`.
        num_slices: Jobs in the replicated job.
        hosts_per_slice: Pods per Job.

    Raises:
        ValueError: Bad characters, or a name so long that the longest pod host name
            (`<name>-job-<slice>-<host>`) would pass 63 characters.
    """
    if not _NAME_RE.match(name or ""):
        raise ValueError(
            f"--name={name!r} is not a valid Kubernetes name: use lower-case letters, digits "
            "and '-', starting with a letter and ending with a letter or digit."
        )
    longest = f"{name}-{REPLICATED_JOB_NAME}-{num_slices - 1}-{hosts_per_slice - 1}"
    if len(longest) > _MAX_LABEL:
        room = _MAX_LABEL - (len(longest) - len(name))
        raise ValueError(
            f"--name={name!r} is too long ({len(name)} characters): its pods' host names such "
            f"as {longest!r} must fit in {_MAX_LABEL}; use at most {room} characters."
        )


def label_value(value: str) -> str:
    """Returns `value` made a valid label value (63 chars of [-_.a-zA-Z0-9], alnum ends)."""
    value = re.sub(r"[^-_.a-zA-Z0-9]", "_", value)[:_MAX_LABEL]
    return value.strip("-_.") or "unknown"


@dataclasses.dataclass
class JobSpec:
    """Everything a JobSet needs.

    Attributes:
        name: The JobSet name (validated by `validate_name`).
        instance_type: The launch instance type ("tpu-v5p-128", "gpu-a3-highgpu-8g").
        num_replicas: TPU slices, or GPU nodes.
        image: The container image.
        command: The container command (argv).
        namespace: The Kubernetes namespace.
        user: The submitting user (label).
        max_tries: Pod failures a Job tolerates (`backoffLimit`).
        max_restarts: Times the whole JobSet is recreated after a failure
            (`failurePolicy.maxRestarts`).
        priority_class: The pods' `priorityClassName` (None: cluster default).
        service_account: The pods' Kubernetes service account (None: namespace default).
        env: Extra container environment variables.
        labels: Extra labels on the JobSet and pods.
    """

    name: str
    instance_type: str
    num_replicas: int
    image: str
    command: Sequence[str]
    namespace: str = "default"
    user: str = "unknown"
    max_tries: int = 0
    max_restarts: int = 0
    priority_class: Optional[str] = None
    service_account: Optional[str] = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


def _env_entry(var: EnvVar) -> dict:
    if var.source == process_env.LITERAL:
        return {"name": var.name, "value": var.value}
    annotation = (
        COMPLETION_INDEX_ANNOTATION
        if var.source == process_env.COMPLETION_INDEX
        else JOB_INDEX_ANNOTATION
    )
    return {
        "name": var.name,
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{annotation}']"}},
    }


def pod_dns_name(name: str, *, job_index: int = 0, pod_index: int = 0) -> str:
    """Returns the DNS name of a pod of the JobSet (within its namespace)."""
    return f"{name}-{REPLICATED_JOB_NAME}-{job_index}-{pod_index}.{name}"


def contract_env(spec: JobSpec, sc: SystemCharacteristics) -> list[EnvVar]:
    """Returns the process-environment contract of the JobSet's pods.

    Args:
        spec: The job.
        sc: Its instance type's characteristics.

    Returns:
        The `EnvVar`s: the distributed contract (GPU) or the Megascale one (multi-slice TPU).
    """
    if sc.platform == "gpu":
        return process_env.distributed_env(
            coordinator=f"{pod_dns_name(spec.name)}:{process_env.DEFAULT_COORDINATOR_PORT}",
            num_processes=spec.num_replicas,
        )
    if spec.num_replicas > 1:
        return process_env.megascale_env(
            coordinator_host=pod_dns_name(spec.name), num_slices=spec.num_replicas
        )
    return []


def build_jobset(spec: JobSpec) -> dict:
    """Returns the JobSet manifest of a job.

    Args:
        spec: The job.

    Returns:
        The JobSet as a dict (apiVersion, kind, metadata, spec).

    Raises:
        ValueError: Unknown instance type, num_replicas < 1, bad name, negative max_tries or
            max_restarts, or an empty command.
    """
    sc = instance_type_to_system_characteristics(spec.instance_type)
    if spec.num_replicas < 1:
        raise ValueError(f"--num_replicas must be >= 1, got {spec.num_replicas}.")
    if spec.max_tries < 0 or spec.max_restarts < 0:
        raise ValueError(
            f"--max_tries ({spec.max_tries}) and --max_restarts ({spec.max_restarts}) must be >= 0."
        )
    if not spec.command:
        raise ValueError("No command given: put it after `--`, e.g. -- python -m ...")
    tpu = sc.platform == "tpu"
    jobs = spec.num_replicas if tpu else 1
    pods_per_job = sc.vms_per_slice if tpu else spec.num_replicas
    validate_name(spec.name, num_slices=jobs, hosts_per_slice=pods_per_job)

    labels = {
        MANAGED_BY_LABEL: "axlearn",
        JOB_NAME_LABEL: spec.name,
        USER_LABEL: label_value(spec.user),
        **spec.labels,
    }
    env = [_env_entry(v) for v in contract_env(spec, sc)]
    env += [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
    resource = "google.com/tpu" if tpu else "nvidia.com/gpu"
    container = {
        "name": spec.name,
        "image": spec.image,
        "imagePullPolicy": "Always",
        "command": list(spec.command),
        "env": env,
        "resources": {
            "limits": {resource: str(sc.chips_per_vm)},
            "requests": {resource: str(sc.chips_per_vm)},
        },
        "volumeMounts": [{"name": "shared-memory", "mountPath": "/dev/shm"}],
    }
    if tpu:
        container["ports"] = [
            {"containerPort": 8471, "name": "tpu-runtime"},
            {"containerPort": process_env.MEGASCALE_PORT, "name": "megascale"},
        ]
        node_selector = {
            "cloud.google.com/gke-tpu-accelerator": sc.gke_accelerator,
            "cloud.google.com/gke-tpu-topology": sc.topology,
        }
    else:
        container["ports"] = [
            {"containerPort": process_env.DEFAULT_COORDINATOR_PORT, "name": "coordinator"}
        ]
        node_selector = {
            "cloud.google.com/gke-accelerator": sc.gke_accelerator,
            "node.kubernetes.io/instance-type": sc.gce_machine_type,
        }
    pod_spec = {
        "restartPolicy": "Never",
        "nodeSelector": node_selector,
        "tolerations": [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
        "volumes": [{"name": "shared-memory", "emptyDir": {"medium": "Memory"}}],
        "terminationGracePeriodSeconds": 60,
    }
    if tpu:
        # Host networking: the TPU runtime and Megascale talk over the hosts' NICs.
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if spec.priority_class:
        pod_spec["priorityClassName"] = spec.priority_class
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    job_template = {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "parallelism": pods_per_job,
            "completions": pods_per_job,
            "completionMode": "Indexed",
            "backoffLimit": spec.max_tries,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }
    annotations = {EXCLUSIVE_TOPOLOGY_ANNOTATION: "cloud.google.com/gke-nodepool"} if tpu else {}
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "failurePolicy": {"maxRestarts": spec.max_restarts},
            "network": {"enableDNSHostnames": True, "subdomain": spec.name},
            "replicatedJobs": [
                {"name": REPLICATED_JOB_NAME, "replicas": jobs, "template": job_template}
            ],
        },
    }


def pod_template(jobset: dict, index: int = 0) -> dict:
    """Returns the pod template (PodTemplateSpec dict) of a replicated job of a JobSet."""
    return jobset["spec"]["replicatedJobs"][index]["template"]["spec"]["template"]
