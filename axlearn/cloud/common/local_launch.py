"""`axlearn local launch`: run N processes of one command on 127.0.0.1, as a JobSet's pods.

Each process gets the environment a pod at the same position gets (see
`axlearn.cloud.common.process_env`: DISTRIBUTED_COORDINATOR on 127.0.0.1, NUM_PROCESSES, and
PROCESS_ID from its completion index), so `launch_trainer_main` joins the run exactly as it does
on GKE. Every output line is prefixed with the process index (`[1] ...`). When a process exits
with an error, the others are stopped and the launcher exits with that process's exit code,
naming the process on stderr.

The processes die with the launcher: SIGTERM or SIGINT of the launcher stops them as a failure
does (SIGTERM, then SIGKILL after a grace period), and on Linux each child asks the kernel for a
parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`, `die_with_launcher`), so even a
SIGKILLed launcher leaves no process behind holding the trainer dir's `run.lock`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Optional, TextIO

from axlearn.cloud.common.process_env import distributed_env, resolve_env


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_environments(
    num_processes: int, *, port: int, base_env: Optional[Mapping[str, str]] = None
) -> list[dict[str, str]]:
    """Returns the environment of each local process.

    Args:
        num_processes: How many processes.
        port: The coordinator's port on 127.0.0.1.
        base_env: The inherited environment (default: `os.environ`).

    Returns:
        One dict per process: `base_env` plus the distributed contract at its position.

    Raises:
        ValueError: If `num_processes` < 1.
    """
    contract = distributed_env(coordinator=f"127.0.0.1:{port}", num_processes=num_processes)
    base = dict(os.environ if base_env is None else base_env)
    return [{**base, **resolve_env(contract, completion_index=i)} for i in range(num_processes)]


# Runs a command so that it gets SIGKILL when the launcher dies (Linux prctl(2)
# PR_SET_PDEATHSIG = 1, kept across exec): argv = [launcher pid, command...]. If the launcher
# died before the call, it exits at once instead of running the command.
_DIE_WITH_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(137)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def die_with_launcher(command: Sequence[str]) -> list[str]:
    """Returns `command` wrapped so that its process is killed when this process dies.

    On Linux the command runs under a short Python shim that asks the kernel for SIGKILL on
    this (the launcher's) death and then execs the command (same pid, same environment);
    elsewhere the command is returned as is.

    Args:
        command: The command and its arguments.

    Returns:
        The command to start.
    """
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-c", _DIE_WITH_LAUNCHER, str(os.getpid()), *command]


class _Stopped(Exception):
    """The launcher received SIGTERM or SIGINT."""


def _raise_stopped(signum, frame) -> None:
    del frame
    raise _Stopped(signal.Signals(signum).name)


def _pump(index: int, stream, out: TextIO, lock: threading.Lock) -> None:
    for line in iter(stream.readline, ""):
        with lock:
            out.write(f"[{index}] {line}" if line.endswith("\n") else f"[{index}] {line}\n")
            out.flush()
    stream.close()


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
    """Sends SIGTERM to each running process's group, then SIGKILL after `grace_s`."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def exit_code_of(returncode: int) -> int:
    """Maps a `Popen.returncode` to a shell exit code (a signal N becomes 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def launch_local(
    command: Sequence[str],
    *,
    num_processes: int,
    port: Optional[int] = None,
    base_env: Optional[Mapping[str, str]] = None,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
    grace_s: float = 30.0,
    poll_s: float = 0.2,
) -> int:
    """Runs `num_processes` copies of `command` on this machine until all finish or one fails.

    Args:
        command: The command and its arguments.
        num_processes: How many processes (>= 1).
        port: The coordinator's port (default: a free one).
        base_env: The environment the processes inherit (default: `os.environ`).
        out: Where the prefixed output goes (default: stdout).
        err: Where the launcher's own messages go (default: stderr).
        grace_s: Seconds a stopped process gets between SIGTERM and SIGKILL.
        poll_s: Seconds between checks of the processes.

    Returns:
        0 when every process succeeded; otherwise the exit code of the first process that
        failed (named on `err`).

    Raises:
        ValueError: If `command` is empty or `num_processes` < 1.
    """
    if not command:
        raise ValueError("No command given: put it after `--`, e.g. -- python -m ...")
    if num_processes < 1:
        raise ValueError(f"--num_processes must be >= 1, got {num_processes}.")
    out = out or sys.stdout
    err = err or sys.stderr
    port = port or free_port()
    envs = process_environments(num_processes, port=port, base_env=base_env)
    lock = threading.Lock()
    procs, pumps = [], []
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[signum] = signal.signal(signum, _raise_stopped)
    try:
        for i, env in enumerate(envs):
            p = subprocess.Popen(
                die_with_launcher(command),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # Own process group: stopping it stops its children.
            )
            procs.append(p)
            t = threading.Thread(target=_pump, args=(i, p.stdout, out, lock), daemon=True)
            t.start()
            pumps.append(t)
        failed: Optional[int] = None
        while failed is None and any(p.poll() is None for p in procs):
            for i, p in enumerate(procs):
                if p.poll() not in (None, 0):
                    failed = i
                    break
            else:
                time.sleep(poll_s)
        if failed is None:
            failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
    except _Stopped as e:
        _stop(procs, grace_s)
        err.write(f"axlearn local launch: {e}: stopped the {len(procs)} process(es).\n")
        err.flush()
        return 128 + (signal.SIGTERM if str(e) == "SIGTERM" else signal.SIGINT)
    except BaseException:
        _stop(procs, grace_s)
        raise
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
    if failed is not None:
        others = [p for p in procs if p.poll() is None]
        _stop(procs, grace_s)
    for t in pumps:
        t.join(timeout=5)
    if failed is None:
        return 0
    code = exit_code_of(procs[failed].returncode)
    with lock:
        err.write(
            f"axlearn local launch: process {failed} of {num_processes} exited with code {code}"
            + (f"; stopped the other {len(others)} running process(es)" if others else "")
            + ".\n"
        )
        err.flush()
    return code
