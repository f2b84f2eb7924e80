"""JobSet start/list/stop through the official `kubernetes` client (the [gcp] extra).

The client is built from a kubeconfig (`gcloud container clusters get-credentials` writes one;
`--kubeconfig`/`--context` or `KUBECONFIG` pick another). JobSets are custom objects
(`jobset.x-k8s.io/v1alpha2`, plural `jobsets`). API server errors become one `JobApiError` line:
409 (already exists), 403 (forbidden), 404 (not found), anything else with its status.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from axlearn.cloud.gcp.jobset import GROUP, MANAGED_BY_LABEL, PLURAL, VERSION

GCP_EXTRA_HINT = "this command needs the [gcp] extra: pip install 'axlearn[gcp]'"


class JobApiError(RuntimeError):
    """A Kubernetes API call failed; the message is one line for the user."""


def _kubernetes():
    try:
        import kubernetes  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise JobApiError(f"The `kubernetes` package is missing; {GCP_EXTRA_HINT}") from e
    return kubernetes


def custom_objects_api(kubeconfig: Optional[str] = None, context: Optional[str] = None):
    """Returns a `CustomObjectsApi` for the kubeconfig's cluster.

    Args:
        kubeconfig: The kubeconfig file (None: `KUBECONFIG` or `~/.kube/config`).
        context: The kubeconfig context (None: its current context).

    Returns:
        `kubernetes.client.CustomObjectsApi`.

    Raises:
        JobApiError: No usable kubeconfig.
    """
    kubernetes = _kubernetes()
    try:
        api_client = kubernetes.config.new_client_from_config(
            config_file=kubeconfig, context=context
        )
    except (kubernetes.config.ConfigException, OSError) as e:
        raise JobApiError(
            f"No usable kubeconfig ({e}); run `gcloud container clusters get-credentials "
            "CLUSTER --location=LOCATION` or pass --kubeconfig."
        ) from e
    return kubernetes.client.CustomObjectsApi(api_client)


def _message(e) -> str:
    try:
        return json.loads(e.body).get("message") or e.reason
    except (TypeError, ValueError, AttributeError):
        return str(e.reason)


def _call(what: str, name: Optional[str], namespace: str, fn, *args, **kwargs) -> Any:
    kubernetes = _kubernetes()
    try:
        return fn(*args, **kwargs)
    except kubernetes.client.exceptions.ApiException as e:
        if e.status == 409:
            raise JobApiError(
                f"JobSet {name!r} already exists in namespace {namespace!r}; stop it "
                f"(axlearn gcp launch stop --name={name}) or choose another --name."
            ) from None
        if e.status == 403:
            raise JobApiError(
                f"Forbidden to {what} in namespace {namespace!r}: {_message(e)}"
            ) from None
        if e.status == 404:
            target = f"JobSet {name!r}" if name else "The JobSet API (is JobSet installed?)"
            raise JobApiError(f"{target} not found in namespace {namespace!r}.") from None
        raise JobApiError(
            f"Kubernetes API error {e.status} {e.reason} ({what}): {_message(e)}"
        ) from None
    except Exception as e:  # Connection errors (urllib3) and the like.
        if isinstance(e, JobApiError):
            raise
        raise JobApiError(f"Cannot {what}: {type(e).__name__}: {e}".splitlines()[0]) from None


def start(api, jobset: dict) -> dict:
    """Creates the JobSet; returns the created object."""
    ns, name = jobset["metadata"]["namespace"], jobset["metadata"]["name"]
    return _call(
        "create JobSets",
        name,
        ns,
        api.create_namespaced_custom_object,
        GROUP,
        VERSION,
        ns,
        PLURAL,
        jobset,
    )


def list_jobs(api, namespace: str) -> list[dict]:
    """Returns the axlearn JobSets of a namespace (label app.kubernetes.io/managed-by=axlearn)."""
    result = _call(
        "list JobSets",
        None,
        namespace,
        api.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        label_selector=f"{MANAGED_BY_LABEL}=axlearn",
    )
    return list(result.get("items", []))


def stop(api, name: str, namespace: str) -> None:
    """Deletes a JobSet and (foreground propagation) its Jobs and pods."""
    kubernetes = _kubernetes()
    _call(
        "delete JobSets",
        name,
        namespace,
        api.delete_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        body=kubernetes.client.V1DeleteOptions(propagation_policy="Foreground"),
    )


def job_status(jobset: dict) -> str:
    """Returns a JobSet's state: the latest true condition's type, else Running or Pending."""
    status = jobset.get("status") or {}
    true = [c for c in status.get("conditions", []) if c.get("status") == "True"]
    if true:
        return true[-1].get("type", "Unknown")
    active = sum(j.get("active", 0) for j in status.get("replicatedJobsStatus", []))
    return "Running" if active else "Pending"


def format_jobs(jobs: list[dict]) -> str:
    """Returns `axlearn gcp launch list`'s table."""
    if not jobs:
        return "No axlearn JobSets."
    rows = [("NAME", "USER", "STATUS", "RESTARTS", "CREATED")]
    for j in jobs:
        meta = j.get("metadata", {})
        rows.append(
            (
                meta.get("name", "?"),
                meta.get("labels", {}).get("axlearn/user", "?"),
                job_status(j),
                str((j.get("status") or {}).get("restarts", 0)),
                meta.get("creationTimestamp", "?"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
