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
`<events_dir>/launcher.jsonl` when it ends, where `axlearn goodput` reads them (an attempt
refused for a deterministic error, e.g. by a live run's lock, is not recorded there).

A process that exits with one of `exit_codes.DETERMINISTIC_EXIT_CODES` (a usage, config, input
or checkpoint data error, or a trainer dir held by another run: `launch_trainer_main` exits so
after its one line) is not restarted: the error would be the same on every attempt, so the
launcher exits at once with that code and one line saying so.

The processes' whole trees die with the launcher. On Linux each process runs under a small
supervisor (`die_with_launcher`) in its own process group: it becomes a child subreaper
(`prctl(PR_SET_CHILD_SUBREAPER)`), so the command's descendants are reparented to it rather than
to init when their parent dies, asks the kernel for a signal when the launcher dies
(`PR_SET_PDEATHSIG`), and when the launcher dies (even by SIGKILL) or the command exits, kills
every process left below it, including grandchildren that started their own session. The
supervisor has two such levels, so a SIGKILL of the supervisor itself (either level) also ends
the command and all its descendants instead of leaving them as orphans writing into the run.
SIGTERM or SIGINT of the launcher stops the processes as a failure does: SIGTERM to each
process group, then SIGKILL after the grace period; a second SIGTERM or SIGINT during the grace
period does not shorten it (a trainer saving its step on the first one is not killed
mid-save). Nothing is left holding the trainer dir's `run.lock`.
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
from typing import Callable, Optional, TextIO

from axlearn.cloud.common.process_env import distributed_env, resolve_env
from axlearn.common import file_access
from axlearn.common.exit_codes import (
    DETERMINISTIC_EXIT_CODES,
    EXIT_CODE_MEANINGS,
    HANG_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
)
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


# The supervisor of one launched process (Linux): argv = [launcher pid, command...]. Two levels,
# each a child subreaper (prctl PR_SET_CHILD_SUBREAPER = 36) that asks for SIGHUP when its parent
# dies (PR_SET_PDEATHSIG = 1): the outer one's parent is the launcher, the inner one's is the
# outer one, and the inner one runs the command as its child (which gets SIGKILL if the inner one
# dies). Each ignores the SIGTERM/SIGINT the launcher sends to the process group (the command gets
# them), and when its child exits or its parent dies kills every process left below it (its
# children, and orphans reparented to it, until none is left), then exits as its child did (the
# same code, or the same signal). A parent-death signal is not inherited across fork, so with one
# level a SIGKILL of that supervisor left the command's own children running as orphans of init;
# with two, whichever level is SIGKILLed, the other one is left to kill the tree: the inner one
# gets SIGHUP when the outer dies, and the command's orphans are reparented to the outer one when
# the inner dies.
_SUPERVISOR = r"""
import ctypes, os, resource, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
launcher, command = int(sys.argv[1]), sys.argv[2:]
def children():
    me = os.getpid()
    found = set()
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
    except OSError:
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.add(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return found
def kill_tree():
    while True:
        for pid in children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)
def parent_died(signum, frame):
    kill_tree()
    os._exit(137)
def watch(parent):
    libc.prctl(36, 1, 0, 0, 0)
    libc.prctl(1, signal.SIGHUP, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(137)
def supervise(child):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, parent_died)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    _, status = os.waitpid(child, 0)
    kill_tree()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))
signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
signal.pthread_sigmask(signal.SIG_BLOCK, signals)
watch(launcher)
outer = os.getpid()
inner = os.fork()
if inner == 0:
    watch(outer)
    inner = os.getpid()
    child = os.fork()
    if child == 0:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != inner:
            os._exit(137)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        try:
            os.execvp(command[0], command)
        except OSError as e:
            print(f"axlearn local launch: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
            os._exit(127)
    supervise(child)
supervise(inner)
"""


def die_with_launcher(command: Sequence[str]) -> list[str]:
    """Returns `command` wrapped so that its whole process tree dies with this process.

    On Linux the command runs under a small Python supervisor (see the module docstring): a
    child subreaper that kills every process below it when the command exits or when this (the
    launcher's) process dies, even by SIGKILL, and then exits as the command did. Elsewhere the
    command is returned as is.

    Args:
        command: The command and its arguments.

    Returns:
        The command to start.
    """
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-c", _SUPERVISOR, str(os.getpid()), *command]


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


class _KeepGrace:
    """While the processes are being stopped, a further SIGTERM/SIGINT of the launcher only says
    that it waits: the grace period is kept (a trainer saving on the first one is not killed)."""

    def __init__(self, grace_s: float, say: Optional[Callable[[str], None]]):
        self._grace_s = grace_s
        self._say = say
        self._previous: dict[int, object] = {}
        self._deadline = 0.0
        self.received: Optional[str] = None  # The first SIGTERM/SIGINT received meanwhile.

    def _again(self, signum, frame) -> None:
        del frame
        self.received = self.received or signal.Signals(signum).name
        if self._say is not None:
            left = max(0.0, self._deadline - time.monotonic())
            self._say(
                f"{signal.Signals(signum).name} again: still stopping; the processes keep the "
                f"rest of their {self._grace_s:g} s grace period ({left:.0f} s left) before "
                "SIGKILL."
            )

    def __enter__(self) -> _KeepGrace:
        self._deadline = time.monotonic() + self._grace_s
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._again)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _stop(
    procs: Sequence[subprocess.Popen],
    grace_s: float,
    say: Optional[Callable[[str], None]] = None,
) -> None:
    """Sends SIGTERM to each running process's group, then SIGKILL after `grace_s`."""
    with _KeepGrace(grace_s, say) as keep:
        _stop_now(procs, grace_s)
    if keep.received is not None:
        raise _Stopped(keep.received)  # The launcher was told to stop while it stopped them.


def _stop_now(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
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
            _kill_tree(p)


def _kill_tree(p: subprocess.Popen) -> None:
    """Kills a process's whole tree: its supervisor's sweep first (SIGHUP, as when the launcher
    dies: it reaches descendants in other sessions), then SIGKILL to its process group."""
    try:
        os.kill(p.pid, signal.SIGHUP)
        p.wait(timeout=5)
        return
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
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
    if code == HANG_EXIT_CODE == PREEMPTED_EXIT_CODE:
        return (
            f"exited with code {code} (a hang: no step for crash_on_hang_timeout_seconds, "
            "the trainer's watchdog; or a preemption: saved its step on SIGTERM)"
        )
    if code in DETERMINISTIC_EXIT_CODES:
        return f"exited with code {code} ({EXIT_CODE_MEANINGS[code]})"
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
    """Appends the launcher's attempt events to `<events_dir>/launcher.jsonl` (whole lines).

    Through the file layer from the directory above the events dir (the trainer dir): neither a
    linked `events/` nor a link planted as `launcher.jsonl` is written through. A refused write
    is one line on stderr, and the log is off for the rest of the launch.
    """

    def __init__(self, events_dir: Optional[str], say: Callable[[str], None]):
        self._root = self._name = None
        if events_dir:
            directory = os.path.normpath(events_dir)
            self._root = os.path.dirname(directory) or "."
            self._name = os.path.basename(directory)
        self._say = say

    def write(self, event: str, attempt: int, **fields) -> None:
        if self._root is None:
            return
        line = dict(event=event, time=time.time(), attempt=attempt)
        line.update(fields)
        try:
            os.makedirs(self._root, exist_ok=True)
            file_access.makedirs(self._root, self._name)
            file_access.append_line(
                self._root,
                f"{self._name}/{LAUNCHER_EVENTS_FILE}",
                json.dumps(line, sort_keys=True).encode("utf-8"),
            )
        except OSError as e:
            self._say(f"the attempt log is not written (and is off from now on): {e}")
            self._root = None


def _run_attempt(
    command: Sequence[str],
    envs: Sequence[Mapping[str, str]],
    *,
    out: TextIO,
    lock: threading.Lock,
    grace_s: float,
    poll_s: float,
    say: Optional[Callable[[str], None]] = None,
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
        _stop(procs, grace_s, say)
        raise
    others = 0
    failed_at = time.time()
    if failed is not None:
        others = sum(1 for p in procs if p.poll() is None)
        _stop(procs, grace_s, say)
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
    causes: list[str] = []
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[signum] = signal.signal(signum, _raise_stopped)

    def say(message: str) -> None:
        with lock:
            err.write(f"axlearn local launch: {message}\n")
            err.flush()

    log = _AttemptLog(events_dir, say)

    attempt = 0
    try:
        while True:
            attempt += 1
            envs = process_environments(num_processes, port=port or free_port(), base_env=base_env)
            for env in envs:
                env[ATTEMPT_ENV] = str(attempt)
            if attempt > 1:
                say(f"attempt {attempt}: starting the {num_processes} process(es) again.")
            started_at = time.time()

            def record(end: dict, attempt=attempt, started_at=started_at) -> None:
                # Both lines once the attempt has ended: an attempt refused for a deterministic
                # error (a second run on a live trainer dir, a bad config) writes nothing into
                # the run's attempt log.
                log.write("ATTEMPT_START", attempt, time=started_at, num_processes=num_processes)
                log.write("ATTEMPT_END", attempt, **end)

            try:
                result = _run_attempt(
                    command, envs, out=out, lock=lock, grace_s=grace_s, poll_s=poll_s, say=say
                )
            except _Stopped as e:
                record(dict(status="stopped", cause=f"launcher got {e}"))
                say(f"{e}: stopped the {num_processes} process(es).")
                return 128 + (signal.SIGTERM if str(e) == "SIGTERM" else signal.SIGINT)
            if result.failed is None:
                record(dict(status="ok"))
                return 0
            if result.code not in DETERMINISTIC_EXIT_CODES:
                record(
                    dict(
                        status="failed",
                        cause=result.cause,
                        exit_code=result.code,
                        process=result.failed,
                        failed_at=result.failed_at,
                    )
                )
            causes.append(f"attempt {attempt}: {result.cause}")
            stopped = (
                f"; stopped the other {result.stopped} running process(es)"
                if result.stopped
                else ""
            )
            say(f"{result.cause}{stopped}.")
            if result.code in DETERMINISTIC_EXIT_CODES:
                if max_restarts:
                    say(
                        f"not restarting: {EXIT_CODE_MEANINGS[result.code]} is the same on "
                        f"every attempt (exit code {result.code}); fix it (the process's last "
                        "line above says what) and rerun."
                    )
                return result.code
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
