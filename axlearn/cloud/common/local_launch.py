"""`axlearn local launch`: run N processes of one command on 127.0.0.1, as a JobSet's pods.

Each process gets the environment a pod at the same position gets (see
`axlearn.cloud.common.process_env`: DISTRIBUTED_COORDINATOR on 127.0.0.1, NUM_PROCESSES, and
PROCESS_ID from its completion index), so `launch_trainer_main` joins the run exactly as it does
on GKE. Every output line is prefixed with the process index (`[1] ...`). When a process exits
with an error, the others are stopped and the launcher exits with that process's exit code,
naming the process on stderr.

With `max_restarts` (`--max_restarts=N`), a failed attempt is followed by a new one: every
process is stopped and started again, resuming from the last committed checkpoint, as a
JobSet's `failurePolicy.maxRestarts` restarts every pod on GKE. One line per failed attempt
names the process and how it ended (exit code or signal; a hang exits with
`exit_codes.HANG_EXIT_CODE`); after N restarts the launcher exits with the last failure's code
and the list of causes. With `events_dir`, each attempt's start, end and cause are appended to
`<events_dir>/launcher.jsonl`, where `axlearn goodput` reads them.

The processes die with the launcher: SIGTERM or SIGINT of the launcher stops them as a failure
does (SIGTERM, then SIGKILL after a grace period), and on Linux each child asks the kernel for a
parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`, `die_with_launcher`), so even a
SIGKILLed launcher leaves no process behind holding the trainer dir's `run.lock`.
"""

from __future__ import annotations

import dataclasses
import json
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
from axlearn.common.exit_codes import HANG_EXIT_CODE
from axlearn.common.measurement_local import ATTEMPT_ENV, LAUNCHER_EVENTS_FILE


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
                os.killpg(p.pid, signal.SIGCONT)  # A stopped (SIGSTOP) process gets it too.
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


def describe_exit(returncode: int) -> str:
    """Says how a process ended, from its `Popen.returncode`.

    Args:
        returncode: The return code (negative: killed by that signal).

    Returns:
        E.g. "was killed by SIGKILL (exit code 137)", "exited with code 75 (a hang: ...)".
    """
    code = exit_code_of(returncode)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {code})"
    if code == HANG_EXIT_CODE:
        return (
            f"exited with code {code} (a hang: no step for crash_on_hang_timeout_seconds, "
            "the trainer's watchdog)"
        )
    return f"exited with code {code}"


@dataclasses.dataclass
class AttemptResult:
    """How one attempt (all processes started once) ended.

    Attributes:
        code: 0, or the exit code of the first process that failed.
        failed: The index of that process (None: every process succeeded).
        cause: "process I of N <how it ended>" for a failure, else None.
        stopped: How many other processes were still running and were stopped.
        failed_at: Epoch seconds when the launcher saw the failure (before stopping the others).
    """

    code: int
    failed: Optional[int] = None
    cause: Optional[str] = None
    stopped: int = 0
    failed_at: Optional[float] = None


class _AttemptLog:
    """Appends the launcher's attempt events to `<events_dir>/launcher.jsonl` (whole lines)."""

    def __init__(self, events_dir: Optional[str]):
        self._path = os.path.join(events_dir, LAUNCHER_EVENTS_FILE) if events_dir else None

    def write(self, event: str, attempt: int, **fields) -> None:
        if self._path is None:
            return
        line = dict(event=event, time=time.time(), attempt=attempt, **fields)
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode("utf-8"))
        finally:
            os.close(fd)


def _run_attempt(
    command: Sequence[str],
    envs: Sequence[Mapping[str, str]],
    *,
    out: TextIO,
    lock: threading.Lock,
    grace_s: float,
    poll_s: float,
) -> AttemptResult:
    """Starts one process per environment; waits until all finish or one fails."""
    procs, pumps = [], []
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
    except BaseException:
        _stop(procs, grace_s)
        raise
    others = 0
    failed_at = time.time()
    if failed is not None:
        others = sum(1 for p in procs if p.poll() is None)
        _stop(procs, grace_s)
    for t in pumps:
        t.join(timeout=5)
    if failed is None:
        return AttemptResult(code=0)
    returncode = procs[failed].returncode
    return AttemptResult(
        code=exit_code_of(returncode),
        failed=failed,
        cause=f"process {failed} of {len(envs)} {describe_exit(returncode)}",
        stopped=others,
        failed_at=failed_at,
    )


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
    max_restarts: int = 0,
    events_dir: Optional[str] = None,
) -> int:
    """Runs `num_processes` copies of `command` on this machine until all finish or one fails.

    After a failure, with `max_restarts` > 0, every process is stopped and all are started again
    (a new attempt; they resume from the last committed checkpoint), as a JobSet's
    `failurePolicy.maxRestarts` does on GKE. Each attempt's processes get AXLEARN_ATTEMPT (1, 2,
    ...) in their environment, and a fresh coordinator port unless `port` is given.

    Args:
        command: The command and its arguments.
        num_processes: How many processes (>= 1).
        port: The coordinator's port (default: a free one per attempt).
        base_env: The environment the processes inherit (default: `os.environ`).
        out: Where the prefixed output goes (default: stdout).
        err: Where the launcher's own messages go (default: stderr): one line per failed
            attempt naming the process and how it ended; after too many restarts, the causes.
        grace_s: Seconds a stopped process gets between SIGTERM and SIGKILL.
        poll_s: Seconds between checks of the processes.
        max_restarts: How many times to restart after a failure (0: never).
        events_dir: If set, each attempt's start, end and cause are appended to
            `<events_dir>/launcher.jsonl` (read by `axlearn goodput`).

    Returns:
        0 when every process of an attempt succeeded; otherwise the exit code of the first
        process that failed in the last attempt.

    Raises:
        ValueError: If `command` is empty, `num_processes` < 1 or `max_restarts` < 0.
    """
    if not command:
        raise ValueError("No command given: put it after `--`, e.g. -- python -m ...")
    if num_processes < 1:
        raise ValueError(f"--num_processes must be >= 1, got {num_processes}.")
    if max_restarts < 0:
        raise ValueError(f"--max_restarts must be >= 0, got {max_restarts}.")
    out = out or sys.stdout
    err = err or sys.stderr
    lock = threading.Lock()
    log = _AttemptLog(events_dir)
    causes: list[str] = []
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[signum] = signal.signal(signum, _raise_stopped)

    def say(message: str) -> None:
        with lock:
            err.write(f"axlearn local launch: {message}\n")
            err.flush()

    attempt = 0
    try:
        while True:
            attempt += 1
            envs = process_environments(num_processes, port=port or free_port(), base_env=base_env)
            for env in envs:
                env[ATTEMPT_ENV] = str(attempt)
            if attempt > 1:
                say(f"attempt {attempt}: starting the {num_processes} process(es) again.")
            log.write("ATTEMPT_START", attempt, num_processes=num_processes)
            try:
                result = _run_attempt(
                    command, envs, out=out, lock=lock, grace_s=grace_s, poll_s=poll_s
                )
            except _Stopped as e:
                log.write("ATTEMPT_END", attempt, status="stopped", cause=f"launcher got {e}")
                say(f"{e}: stopped the {num_processes} process(es).")
                return 128 + (signal.SIGTERM if str(e) == "SIGTERM" else signal.SIGINT)
            if result.failed is None:
                log.write("ATTEMPT_END", attempt, status="ok")
                return 0
            log.write(
                "ATTEMPT_END",
                attempt,
                status="failed",
                cause=result.cause,
                exit_code=result.code,
                process=result.failed,
                failed_at=result.failed_at,
            )
            causes.append(f"attempt {attempt}: {result.cause}")
            stopped = (
                f"; stopped the other {result.stopped} running process(es)"
                if result.stopped
                else ""
            )
            say(f"{result.cause}{stopped}.")
            if len(causes) > max_restarts:
                if max_restarts:
                    say(
                        f"giving up after {attempt} attempts (--max_restarts={max_restarts}). "
                        f"Causes: {'; '.join(causes)}."
                    )
                return result.code
            say(
                f"attempt {attempt} failed; restarting every process (restart {len(causes)} of "
                f"--max_restarts={max_restarts}); they resume from the last committed "
                "checkpoint."
            )
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
