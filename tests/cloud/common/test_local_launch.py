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


# Attempt 1: process 1 kills itself with SIGKILL; attempt 2: process 0 exits with the hang code;
# attempt 3: all succeed.
FLAKY = (
    "import os, signal, sys\n"
    "attempt, pid = os.environ['AXLEARN_ATTEMPT'], os.environ['PROCESS_ID']\n"
    "print('attempt', attempt)\n"
    "if attempt == '1' and pid == '1':\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "if attempt == '2' and pid == '0':\n"
    "    sys.exit(75)\n"
    "if int(attempt) < 3:\n"
    "    import time; time.sleep(60)\n"
)


def test_restarts_after_failures(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    events = str(tmp_path / "events")
    start = time.monotonic()
    rc = local_launch.launch_local(
        [sys.executable, "-c", FLAKY],
        num_processes=2,
        out=out,
        err=err,
        grace_s=5,
        max_restarts=3,
        events_dir=events,
    )
    assert rc == 0
    assert time.monotonic() - start < 40  # The sleepers were stopped, not waited for.
    assert "[0] attempt 3" in out.getvalue() and "[1] attempt 3" in out.getvalue()
    lines = err.getvalue().splitlines()
    assert lines[0] == (
        "axlearn local launch: process 1 of 2 was killed by SIGKILL (exit code 137); stopped "
        "the other 1 running process(es)."
    )
    assert "restarting every process (restart 1 of --max_restarts=3)" in lines[1]
    assert lines[2] == "axlearn local launch: attempt 2: starting the 2 process(es) again."
    assert lines[3].startswith("axlearn local launch: process 0 of 2 exited with code 75 (a hang")
    with open(os.path.join(events, "launcher.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert [(r["event"], r["attempt"], r.get("status")) for r in records] == [
        ("ATTEMPT_START", 1, None),
        ("ATTEMPT_END", 1, "failed"),
        ("ATTEMPT_START", 2, None),
        ("ATTEMPT_END", 2, "failed"),
        ("ATTEMPT_START", 3, None),
        ("ATTEMPT_END", 3, "ok"),
    ]
    assert records[1]["cause"] == "process 1 of 2 was killed by SIGKILL (exit code 137)"
    assert records[3]["exit_code"] == 75 and records[3]["process"] == 0
    # When the launcher saw the failure, before it stopped the other process.
    assert records[0]["time"] <= records[1]["failed_at"] <= records[1]["time"]


def test_too_many_restarts_lists_the_causes():
    out, err = io.StringIO(), io.StringIO()
    rc = local_launch.launch_local(
        [sys.executable, "-c", "import sys; sys.exit(4)"],
        num_processes=1,
        out=out,
        err=err,
        max_restarts=2,
    )
    assert rc == 4
    assert err.getvalue().splitlines()[-1] == (
        "axlearn local launch: giving up after 3 attempts (--max_restarts=2). Causes: "
        "attempt 1: process 0 of 1 exited with code 4; attempt 2: process 0 of 1 exited with "
        "code 4; attempt 3: process 0 of 1 exited with code 4."
    )
    with pytest.raises(ValueError, match="--max_restarts must be >= 0, got -1"):
        local_launch.launch_local(["true"], num_processes=1, max_restarts=-1)
