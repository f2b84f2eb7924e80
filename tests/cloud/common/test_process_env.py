"""Tests axlearn/cloud/common/process_env.py: the launcher -> process environment contract."""

from __future__ import annotations

import pytest

from axlearn.cloud.common import process_env as pe


def test_distributed_env_resolves_per_position():
    env = pe.distributed_env(coordinator="host-0.svc:8476", num_processes=4)
    assert [v.name for v in env] == ["DISTRIBUTED_COORDINATOR", "NUM_PROCESSES", "PROCESS_ID"]
    assert pe.resolve_env(env, completion_index=3) == {
        "DISTRIBUTED_COORDINATOR": "host-0.svc:8476",
        "NUM_PROCESSES": "4",
        "PROCESS_ID": "3",
    }


def test_megascale_env_slice_id_is_job_index():
    env = pe.megascale_env(coordinator_host="j-job-0-0.j", num_slices=2)
    resolved = pe.resolve_env(env, completion_index=5, job_index=1)
    assert resolved == {
        "MEGASCALE_COORDINATOR_ADDRESS": "j-job-0-0.j:8080",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "8080",
    }


def test_flag_defaults_from_environment():
    assert pe.distributed_flag_defaults({}) == {
        "distributed_coordinator": None,
        "num_processes": None,
        "process_id": None,
    }
    got = pe.distributed_flag_defaults(
        {"DISTRIBUTED_COORDINATOR": "127.0.0.1:1234", "NUM_PROCESSES": "2", "PROCESS_ID": "1"}
    )
    assert got == {"distributed_coordinator": "127.0.0.1:1234", "num_processes": 2, "process_id": 1}
    with pytest.raises(ValueError, match="PROCESS_ID='one' is not an integer"):
        pe.distributed_flag_defaults({"PROCESS_ID": "one"})


def test_bad_contract_inputs():
    with pytest.raises(ValueError, match="num_processes must be >= 1, got 0"):
        pe.distributed_env(coordinator="h:1", num_processes=0)
    with pytest.raises(ValueError, match="host:port"):
        pe.distributed_env(coordinator="h", num_processes=1)
    with pytest.raises(ValueError, match="unknown source"):
        pe.EnvVar("X", source="pod_ip")
