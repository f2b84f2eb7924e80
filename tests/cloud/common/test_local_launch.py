"""Tests axlearn/cloud/common/local_launch.py: N processes with the pods' environment."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from axlearn.cloud.common import local_launch
from axlearn.cloud.common.process_env import distributed_env, resolve_env
from axlearn.common.run_lock import RunLock, RunLockError

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

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


# A child that holds a trainer dir's run.lock (as launch_trainer_main's process 0 does), writes
# its pid and waits.
HOLD_LOCK = (
    "import os, sys, time\n"
    "from axlearn.common.run_lock import RunLock\n"
    "d, i = sys.argv[1], os.environ['PROCESS_ID']\n"
    "if i == '0':\n"
    "    RunLock(d).acquire()\n"
    "open(os.path.join(d, 'pid' + i), 'w').write(str(os.getpid()))\n"
    "print('ready', flush=True)\n"
    "time.sleep(300)\n"
)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_children_die_with_the_launcher(tmp_path, sig):
    """Killing `axlearn local launch` (even with SIGKILL) leaves no child and frees run.lock."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "axlearn.cli.main", "local", "launch", "--num_processes=2", "--"]
        + [sys.executable, "-c", HOLD_LOCK, str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pid_files = [tmp_path / "pid0", tmp_path / "pid1"]
        deadline = time.monotonic() + 120
        while not all(p.exists() and p.read_text() for p in pid_files):
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in pid_files]
        assert all(_alive(pid) for pid in pids)
        with pytest.raises(RunLockError):  # Held by process 0.
            RunLock(str(tmp_path)).acquire()
        launcher.send_signal(sig)
        # SIGKILL: the launcher dies at once; SIGTERM: it stops the children and exits 143.
        assert launcher.wait(timeout=60) == (-sig if sig == signal.SIGKILL else 128 + sig)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids), "a child outlived the launcher"
        lock = RunLock(str(tmp_path))
        lock.acquire()  # Released by the kernel when its holder died.
        lock.release()
    finally:
        if launcher.poll() is None:
            launcher.kill()
