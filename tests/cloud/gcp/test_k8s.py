"""Tests axlearn/cloud/gcp/k8s.py: start/list/stop through the real `kubernetes` client.

A small HTTP server on 127.0.0.1 plays the API server: it records each request (verb, path,
query, body) and answers as Kubernetes does (201 with the object, 200 with a list or a Status,
409 AlreadyExists, 403 Forbidden, 404 NotFound). The client is built from a kubeconfig file that
points at it, the way a user's `gcloud container clusters get-credentials` kubeconfig is read.
The CLI tests run `axlearn gcp launch ...` end to end against the same server.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from axlearn.cli import main as cli_main
from axlearn.cloud.gcp import jobset as js
from axlearn.cloud.gcp import k8s

JOBSETS_PATH = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class FakeApiServer:
    """Records requests; answers from `self.responses[(verb, path)] = (code, body)`."""

    def __init__(self):
        self.requests: list[dict] = []
        self.responses: dict[tuple[str, str], tuple[int, dict]] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self):
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                server.requests.append(
                    {
                        "verb": self.command,
                        "path": url.path,
                        "query": dict(urllib.parse.parse_qsl(url.query)),
                        "body": body,
                        "auth": self.headers.get("Authorization"),
                    }
                )
                code, answer = server.responses.get(
                    (self.command, url.path), (404, _status(404, "NotFound", "not found"))
                )
                if callable(answer):
                    answer = answer(body)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _handle

            def log_message(self, *args):  # Quiet.
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeApiServer()
    yield s
    s.close()


@pytest.fixture
def kubeconfig(tmp_path, server):
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
                "users": [{"name": "me", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    return str(path)


def _jobset(name="my-job", namespace="default") -> dict:
    return js.build_jobset(
        js.JobSpec(
            name=name,
            instance_type="tpu-v5p-16",
            num_replicas=2,
            image="img:1",
            command=["python", "-c", "pass"],
            namespace=namespace,
            user="alice",
        )
    )


def test_start_posts_the_jobset(server, kubeconfig):
    path = JOBSETS_PATH.format(ns="team")
    server.responses[("POST", path)] = (201, lambda body: body)
    api = k8s.custom_objects_api(kubeconfig)
    manifest = _jobset(namespace="team")
    created = k8s.start(api, manifest)
    (req,) = server.requests
    assert req["verb"] == "POST" and req["path"] == path
    assert req["body"] == manifest
    assert req["auth"] == "Bearer secret-token"
    assert created["metadata"]["name"] == "my-job"


def test_start_conflict_and_forbidden_are_one_line(server, kubeconfig):
    path = JOBSETS_PATH.format(ns="default")
    api = k8s.custom_objects_api(kubeconfig)
    msg = 'jobsets.jobset.x-k8s.io "my-job" already exists'
    server.responses[("POST", path)] = (409, _status(409, "AlreadyExists", msg))
    with pytest.raises(k8s.JobApiError) as e:
        k8s.start(api, _jobset())
    assert str(e.value) == (
        "JobSet 'my-job' already exists in namespace 'default'; stop it "
        "(axlearn gcp launch stop --name=my-job) or choose another --name."
    )
    msg = 'jobsets.jobset.x-k8s.io is forbidden: User "alice" cannot create resource "jobsets"'
    server.responses[("POST", path)] = (403, _status(403, "Forbidden", msg))
    with pytest.raises(k8s.JobApiError) as e:
        k8s.start(api, _jobset())
    assert str(e.value) == f"Forbidden to create JobSets in namespace 'default': {msg}"
    assert "\n" not in str(e.value)


def test_list_and_stop(server, kubeconfig):
    path = JOBSETS_PATH.format(ns="default")
    running = _jobset("a-job")
    running["metadata"]["creationTimestamp"] = "2026-01-02T03:04:05Z"
    running["status"] = {"replicatedJobsStatus": [{"name": "job", "active": 2}], "restarts": 1}
    done = _jobset("b-job")
    done["status"] = {"conditions": [{"type": "Completed", "status": "True"}]}
    server.responses[("GET", path)] = (
        200,
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSetList", "items": [running, done]},
    )
    server.responses[("DELETE", path + "/a-job")] = (200, running)
    api = k8s.custom_objects_api(kubeconfig)
    jobs = k8s.list_jobs(api, "default")
    assert [j["metadata"]["name"] for j in jobs] == ["a-job", "b-job"]
    assert server.requests[0]["verb"] == "GET"
    assert server.requests[0]["query"] == {"labelSelector": "app.kubernetes.io/managed-by=axlearn"}
    table = k8s.format_jobs(jobs).splitlines()
    assert table[0].split() == ["NAME", "USER", "STATUS", "RESTARTS", "CREATED"]
    assert table[1].split() == ["a-job", "alice", "Running", "1", "2026-01-02T03:04:05Z"]
    assert table[2].split()[:3] == ["b-job", "alice", "Completed"]

    k8s.stop(api, "a-job", "default")
    req = server.requests[-1]
    assert req["verb"] == "DELETE" and req["path"] == path + "/a-job"
    assert req["body"]["propagationPolicy"] == "Foreground"
    with pytest.raises(k8s.JobApiError, match="^JobSet 'nope' not found in namespace 'default'.$"):
        k8s.stop(api, "nope", "default")


def test_missing_kubeconfig(tmp_path):
    with pytest.raises(k8s.JobApiError, match="get-credentials"):
        k8s.custom_objects_api(str(tmp_path / "missing"))


# The CLI end to end: `axlearn gcp launch start|list|stop` against the fake server.

CONFIG = """
[gcp."my-project:us-east5-a"]
project = "my-project"
zone = "us-east5-a"
permanent_bucket = "perm"
docker_repo = "us-docker.pkg.dev/my-project/axlearn"
labels = "v5p"
"""


@pytest.fixture
def active_config(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".axlearn.config").write_text(CONFIG + '\n[gcp]\n_active = "my-project:us-east5-a"\n')
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)


def test_cli_start_list_stop(server, kubeconfig, active_config, capsys):
    path = JOBSETS_PATH.format(ns="default")
    server.responses[("POST", path)] = (201, lambda body: body)
    flags = [f"--kubeconfig={kubeconfig}"]
    rc = cli_main.main(
        ["gcp", "launch", "--name=cli-job", "--instance_type=tpu-v5p-128", "--num_replicas=2"]
        + ["--image=img:7", "--skip_preflight", *flags, "--"]
        + ["python", "-m", "axlearn.common.launch_trainer_main", "--module=text.gpt.honeycrisp"]
        + ["--config=honeycrisp-3B"]
    )
    assert rc == 0, capsys.readouterr().err
    body = server.requests[-1]["body"]
    assert body["metadata"]["name"] == "cli-job"
    command = js.pod_template(body)["spec"]["containers"][0]["command"]
    assert command[-3:] == [
        "--mesh_selector=tpu-v5p-128-2",
        "--jax_backend=tpu",
        "--trainer_dir=gs://perm/axlearn/jobs/cli-job",
    ]
    assert "Submitted JobSet cli-job" in capsys.readouterr().out

    server.responses[("POST", path)] = (
        409,
        _status(409, "AlreadyExists", 'jobsets.jobset.x-k8s.io "cli-job" already exists'),
    )
    rc = cli_main.main(
        ["gcp", "launch", "start", "--name=cli-job", "--instance_type=tpu-v5p-128"]
        + ["--image=img:7", *flags, "--", "true"]
    )
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "already exists in namespace 'default'" in err

    server.responses[("GET", path)] = (200, {"kind": "JobSetList", "items": [body]})
    assert cli_main.main(["gcp", "launch", "list", *flags]) == 0
    assert "cli-job" in capsys.readouterr().out
    server.responses[("DELETE", path + "/cli-job")] = (200, body)
    assert cli_main.main(["gcp", "launch", "stop", "--name=cli-job", *flags]) == 0
    assert server.requests[-1]["verb"] == "DELETE"
    server.responses[("DELETE", path + "/cli-job")] = (
        403,
        _status(403, "Forbidden", "cannot delete"),
    )
    assert cli_main.main(["gcp", "launch", "stop", "--name=cli-job", *flags]) == 1
    assert capsys.readouterr().err == (
        "axlearn gcp: error: Forbidden to delete JobSets in namespace 'default': cannot delete\n"
    )
