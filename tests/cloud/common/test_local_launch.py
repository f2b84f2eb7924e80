"""Tests axlearn/cloud/common/local_launch.py: N processes with the pods' environment."""

from __future__ import annotations

import io
import json
import sys
import time

import pytest

from axlearn.cloud.common import local_launch
from axlearn.cloud.common.process_env import distributed_env, resolve_env

PRINT_ENV = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('DISTRIBUTED_COORDINATOR', 'NUM_PROCESSES', 'PROCESS_ID', 'KEEP')}))"
)


def test_each_process_gets_the_pod_contract_and_prefixed_output():
    out, err = io.StringIO(), io.StringIO()
    rc = local_launch.launch_local(
        [sys.executable, "-c", PRINT_ENV],
        num_processes=3,
        port=12345,
        base_env={"KEEP": "yes", "PATH": "/usr/bin:/bin"},
        out=out,
        err=err,
    )
    assert rc == 0 and err.getvalue() == ""
    seen = {}
    for line in out.getvalue().splitlines():
        prefix, _, payload = line.partition(" ")
        seen[int(prefix.strip("[]"))] = json.loads(payload)
    contract = distributed_env(coordinator="127.0.0.1:12345", num_processes=3)
    for i in range(3):
        # Exactly what the JobSet's pod with completion index i resolves to.
        assert seen[i] == {**resolve_env(contract, completion_index=i), "KEEP": "yes"}


def test_a_failing_process_stops_the_others():
    script = (
        "import os, sys, time\n"
        "if os.environ['PROCESS_ID'] == '1':\n"
        "    print('bye'); sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    rc = local_launch.launch_local(
        [sys.executable, "-c", script], num_processes=3, out=out, err=err, grace_s=5
    )
    assert time.monotonic() - start < 30  # The sleepers were stopped, not waited for.
    assert rc == 3
    assert "[1] bye" in out.getvalue()
    assert err.getvalue() == (
        "axlearn local launch: process 1 of 3 exited with code 3; "
        "stopped the other 2 running process(es).\n"
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="No command given"):
        local_launch.launch_local([], num_processes=1)
    with pytest.raises(ValueError, match="--num_processes must be >= 1, got 0"):
        local_launch.launch_local(["true"], num_processes=0)
