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
    except (FileNotFoundError, ProcessLookupError):
        # The process was reaped before the open (ENOENT) or between the open and the read (ESRCH).
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


# Starts two grandchildren (one in its own session, one in the command's process group), writes
# their pids and its own, then sleeps (or exits at once with EXIT_AT_ONCE).
GRANDCHILDREN = (
    "import os, subprocess, sys, time\n"
    "d = sys.argv[1]\n"
    "sleep = [sys.executable, '-c', 'import time; time.sleep(300)']\n"
    "a = subprocess.Popen(sleep, start_new_session=True)\n"
    "b = subprocess.Popen(sleep)\n"
    "open(os.path.join(d, 'pids.tmp'), 'w').write(f'{os.getpid()} {a.pid} {b.pid}')\n"
    "os.rename(os.path.join(d, 'pids.tmp'), os.path.join(d, 'pids'))\n"
    "if os.environ.get('EXIT_AT_ONCE'):\n"
    "    sys.exit(0)\n"
    "time.sleep(300)\n"
)


def _wait_for(path, proc=None, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc is None or proc.poll() is None, "the launcher exited early"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return [int(x) for x in path.read_text().split()]


def _all_gone(pids, timeout=10) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(pid) for pid in pids)


def test_launcher_grandchild_does_not_outlive_a_sigkilled_launcher(tmp_path):
    """Launcher: the parent-death signal reached the direct child only, so a grandchild (even
    one in its own session) outlived a SIGKILLed launcher. The supervisor now kills the tree."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "axlearn.cli.main", "local", "launch", "--"]
        + [sys.executable, "-c", GRANDCHILDREN, str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids = []
    try:
        pids = _wait_for(tmp_path / "pids", launcher)
        assert all(_alive(pid) for pid in pids)
        launcher.kill()
        assert launcher.wait(timeout=30) == -signal.SIGKILL
        assert _all_gone(pids), "a grandchild outlived the SIGKILLed launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


# The launcher, with the supervisors' pids written to `sup` (outer, inner) before the command runs.
LAUNCH_ONE = (
    "import sys\n"
    "from axlearn.cloud.common.local_launch import launch_local\n"
    "sys.exit(launch_local(sys.argv[1:], num_processes=1))\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux supervisor")
@pytest.mark.parametrize("level", ["outer", "inner"])
def test_a_sigkilled_supervisor_leaves_no_orphan(tmp_path, level):
    """SIGKILL of a process's supervisor (either of its two levels), the launcher alive: the
    command and its grandchildren (one in its own session) end; none is left writing as an
    orphan of init. With one level, the command died (parent-death signal) but its children,
    which do not inherit that signal, outlived it."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH_ONE, sys.executable, "-c", GRANDCHILDREN, str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = []
    try:
        pids = _wait_for(tmp_path / "pids", launcher)
        inner = _parent_of(pids[0])
        outer = _parent_of(inner)
        assert _parent_of(outer) == launcher.pid and outer != inner
        os.kill(outer if level == "outer" else inner, signal.SIGKILL)
        assert launcher.wait(timeout=30) == 128 + signal.SIGKILL, launcher.stderr.read()
        assert "was killed by SIGKILL (exit code 137)" in launcher.stderr.read()
        assert _all_gone(pids + [inner, outer]), "a process outlived its SIGKILLed supervisor"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_tree_ends_when_the_command_exits(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    env = dict(os.environ, EXIT_AT_ONCE="1")
    rc = local_launch.launch_local(
        [sys.executable, "-c", GRANDCHILDREN, str(tmp_path)],
        num_processes=1,
        base_env=env,
        out=out,
        err=err,
    )
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    try:
        assert rc == 0, err.getvalue()
        assert _all_gone(pids, timeout=5), "a grandchild outlived its launched process"
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# On SIGTERM: "saves" for 3 s (writing `saved` at the end) and exits 75, as the trainer does.
SLOW_SAVE = (
    "import os, signal, sys, time\n"
    "d = sys.argv[1]\n"
    "def on_term(*_):\n"
    "    time.sleep(3)\n"
    "    open(os.path.join(d, 'saved'), 'w').write('ok')\n"
    "    os._exit(75)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "open(os.path.join(d, 'pids'), 'w').write(str(os.getpid()))\n"
    "time.sleep(300)\n"
)
LAUNCH_WITH_GRACE = (
    "import sys\n"
    "from axlearn.cloud.common.local_launch import launch_local\n"
    "sys.exit(launch_local(sys.argv[2:], num_processes=1, grace_s=float(sys.argv[1])))\n"
)


def test_launcher_second_sigterm_keeps_the_grace_period(tmp_path):
    """Launcher: a second SIGTERM within the grace period killed the child mid-save."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCH_WITH_GRACE, "20", sys.executable, "-c", SLOW_SAVE]
        + [str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(tmp_path / "pids", launcher)
        launcher.send_signal(signal.SIGTERM)
        for _ in range(3):  # Impatient: SIGTERM again, and Ctrl-C.
            time.sleep(0.4)
            launcher.send_signal(signal.SIGTERM)
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
        assert (tmp_path / "saved").exists(), err  # The save finished: not killed mid-save.
        assert launcher.returncode == 128 + signal.SIGTERM, err
        assert "SIGTERM again: still stopping; the processes keep the rest of their 20 s grace" in (
            err
        )
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_launcher_attempt_log_is_never_appended_through_a_link(tmp_path):
    """Insecure: the attempt log was appended through a link (a user's .bashrc got JSON)."""
    bashrc = tmp_path / "bashrc"
    bashrc.write_bytes(b"export PATH=$PATH\n")
    before = (bashrc.read_bytes(), bashrc.stat().st_mtime_ns)
    for linked in ("file", "dir"):
        run = tmp_path / f"run_{linked}"
        if linked == "file":
            (run / "events").mkdir(parents=True)
            (run / "events" / "launcher.jsonl").symlink_to(bashrc)
        else:
            run.mkdir()
            (run / "events").symlink_to(tmp_path)
        err = io.StringIO()
        rc = local_launch.launch_local(
            ["true"], num_processes=1, err=err, out=io.StringIO(), events_dir=str(run / "events")
        )
        assert rc == 0
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and "the attempt log is not written" in lines[0], lines
        assert "link" in lines[0] and "export" not in lines[0]
    assert (bashrc.read_bytes(), bashrc.stat().st_mtime_ns) == before
    assert not (tmp_path / "launcher.jsonl").exists()


@pytest.mark.parametrize("code", [64, 65, 73, 78])
def test_deterministic_errors_are_not_retried(tmp_path, code):
    err = io.StringIO()
    start = time.monotonic()
    rc = local_launch.launch_local(
        [
            sys.executable,
            "-c",
            f"import sys; print('config error', file=sys.stderr); sys.exit({code})",
        ],
        num_processes=1,
        out=io.StringIO(),
        err=err,
        max_restarts=3,
        events_dir=str(tmp_path / "events"),
    )
    assert rc == code
    assert time.monotonic() - start < 10
    lines = err.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"axlearn local launch: process 0 of 1 exited with code {code} (")
    assert lines[1].startswith("axlearn local launch: not restarting: ")
    assert "the same on every attempt" in lines[1]
    # Refused (e.g. by a live run's lock, exit 73): nothing in that run's attempt log.
    assert not (tmp_path / "events" / "launcher.jsonl").exists()


def _descendants(pid: int) -> set[int]:
    """`pid`'s descendants now (from /proc's children lists)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children", encoding="ascii") as f:
                    kids = {int(x) for x in f.read().split()} - found
                    found |= kids
                    todo.extend(kids)
        except OSError:
            pass
    return found


def _trainer_events(trainer_dir) -> list[dict]:
    path = trainer_dir / "events" / "process_0.jsonl"
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")[:-1]  # Whole lines only.
    return [json.loads(line) for line in lines if line.strip()]


def _run_dir_sizes(trainer_dir) -> dict[str, int]:
    return {
        os.path.join(d, name): os.lstat(os.path.join(d, name)).st_size
        for d, _, names in os.walk(trainer_dir)
        for name in names
    }


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux supervisor")
def test_a_sigkilled_supervisor_ends_the_trainer_and_its_input_workers(tmp_path):
    """The real main job (`gpt-tiny-grain` with one Grain worker process): once its input
    worker runs, SIGKILL the trainer's supervisor (its direct parent). The trainer and its Grain
    worker (which does not inherit the trainer's parent-death signal) end; nothing writes into
    the run dir afterwards; run.lock is free. (78 s on a 2-core machine at load 21.)"""
    trainer_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    for key in ("DISTRIBUTED_COORDINATOR", "NUM_PROCESSES", "PROCESS_ID"):
        env.pop(key, None)
    command = [
        sys.executable, "-m", "axlearn.cli.main", "local", "launch", "--",
        sys.executable, "-m", "axlearn.common.launch_trainer_main",
        "--module=text.gpt.tiny", "--config=gpt-tiny-grain", f"--trainer_dir={trainer_dir}",
        "--jax_backend=cpu", "--config_override=max_step=100000",
        "--config_override=input.source.num_workers=1",
    ]  # fmt: skip
    log = open(tmp_path / "log", "w", encoding="utf-8")  # pylint: disable=consider-using-with
    launcher = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    tree = set()
    try:
        # Kill once the input's worker runs (after data loading: the trainer is preparing and
        # compiling, writing run records and events), not after compiling: ~100 s cheaper.
        deadline = time.monotonic() + 240
        trainer, workers = None, set()
        while not workers:
            assert launcher.poll() is None, (tmp_path / "log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no Grain worker process after data loading"
            loaded = [e for e in _trainer_events(trainer_dir) if e["event"] == "END_DATA_LOADING"]
            if loaded:
                trainer = loaded[0]["pid"]
                workers = _descendants(trainer)
            time.sleep(0.2)
        inner = _parent_of(trainer)
        outer = _parent_of(inner)
        assert _parent_of(outer) == launcher.pid
        tree = {trainer, inner, outer} | workers
        os.kill(inner, signal.SIGKILL)
        assert launcher.wait(timeout=60) == 128 + signal.SIGKILL
        assert _all_gone(tree), f"left running: {[p for p in tree if _alive(p)]}"
        sizes = _run_dir_sizes(trainer_dir)
        time.sleep(2)
        assert _run_dir_sizes(trainer_dir) == sizes, "something still writes into the run dir"
        lock = RunLock(str(trainer_dir))
        lock.acquire()
        lock.release()
    finally:
        log.close()
        if launcher.poll() is None:
            launcher.kill()
        for pid in tree:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
