"""The unattended-recovery acceptance run: `axlearn local launch --max_restarts=3` of the main job.

Two processes train `gpt-tiny` (the README's main job, shortened to STEPS steps, a checkpoint
every SAVE_EVERY steps). A watcher reads the processes' event files and, at chosen steps,
SIGKILLs process 1 in attempts 1 and 2, and in attempt 3 sends SIGUSR1 to both processes, whose
handler (installed by the test's wrapper of `launch_trainer_main`) sleeps: the loops hang while
every other thread (the watchdog, JAX's heartbeats) keeps running, until the watchdog exits with
the hang code. (A SIGSTOPped process would be declared dead by JAX's coordination service, and
one process hanging alone would fail its peer's collective after Gloo's timeout: neither tests
the watchdog.) The job must finish without a
person, its final parameters must be bit-identical to an uninterrupted 2-process run's, and
`axlearn goodput` must report the 3 failed attempts with their causes and re-done steps equal to
(kill step - last committed step), within one step, with parts adding up to the wall time.

Set AXLEARN_RECOVERY_KEEP=DIR to keep both trainer dirs and the logs under DIR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from axlearn.common.checkpointer.layout import read_index_file

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 24
SAVE_EVERY = 4
HANG_TIMEOUT_S = 150  # More than an attempt's start-up (compile) on a busy 2-core machine.
# attempt -> (action, step of process 1 at which it is applied).
FAULTS = {1: ("kill", 9), 2: ("kill", 15), 3: ("hang", 21)}
# Runs launch_trainer_main with a SIGUSR1 handler that hangs the main thread (the injected hang).
HANG_ON_SIGUSR1 = (
    "import runpy, signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda *_: time.sleep(10**6))\n"
    "sys.argv = ['launch_trainer_main'] + sys.argv[1:]\n"
    "runpy.run_module('axlearn.common.launch_trainer_main', run_name='__main__')\n"
)


def _command(trainer_dir: str, *, max_restarts: int) -> list[str]:
    return [
        sys.executable, "-m", "axlearn.cli.main", "local", "launch", "--num_processes=2",
        f"--max_restarts={max_restarts}", "--",
        sys.executable, "-c", HANG_ON_SIGUSR1,
        "--module=text.gpt.tiny", "--config=gpt-tiny", f"--trainer_dir={trainer_dir}",
        "--jax_backend=cpu", f"--config_override=max_step={STEPS}",
        f"--config_override=checkpointer.save_policy.n={SAVE_EVERY}",
        f"--config_override=crash_on_hang_timeout_seconds={HANG_TIMEOUT_S}",
    ]  # fmt: skip


def _env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISTRIBUTED_COORDINATOR", "NUM_PROCESSES", "PROCESS_ID")
    }
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    return env


class _Injector(threading.Thread):
    """Watches the processes' events; applies FAULTS; remembers process 1's step at each."""

    def __init__(self, trainer_dir: str):
        super().__init__(daemon=True)
        self._dir = os.path.join(trainer_dir, "events")
        self.done = threading.Event()
        self.fault_steps: dict[int, int] = {}
        self._pids: dict[tuple[int, int], int] = {}  # (attempt, process) -> pid.

    def run(self) -> None:
        offsets, buffers = [0, 0], [b"", b""]
        while not self.done.is_set():
            time.sleep(0.02)
            for process in (0, 1):
                path = os.path.join(self._dir, f"process_{process}.jsonl")
                if not os.path.exists(path):
                    continue
                with open(path, "rb") as f:
                    f.seek(offsets[process])
                    data = f.read()
                offsets[process] += len(data)
                *lines, buffers[process] = (buffers[process] + data).split(b"\n")
                for line in lines:
                    if line.strip():
                        self._on_event(process, json.loads(line))

    def _on_event(self, process: int, event: dict) -> None:
        attempt = event.get("attempt")
        self._pids[(attempt, process)] = event["pid"]
        if process != 1 or event["event"] != "START_STEP" or attempt not in FAULTS:
            return
        action, step = FAULTS[attempt]
        if attempt in self.fault_steps or event["step"] < step:
            return
        self.fault_steps[attempt] = event["step"]
        if action == "kill":
            targets = [(event["pid"], signal.SIGKILL)]
        else:
            targets = [(self._pids[(attempt, p)], signal.SIGUSR1) for p in (0, 1)]
        for pid, sig in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _model_leaves(trainer_dir: str) -> dict[str, bytes]:
    """{leaf path: its checksums and chunk file bytes} of the final checkpoint's model params."""
    step_dir = os.path.join(trainer_dir, "checkpoints", f"step_{STEPS:08d}")
    index = read_index_file(step_dir)
    out = {}
    for leaf in index["leaves"]:
        if leaf["kind"] != "array" or not leaf["path"].startswith("model"):
            continue
        chunks = []
        root = os.path.join(step_dir, leaf["file"])
        paths = [root] if os.path.isfile(root) else []
        for dirpath, _, files in sorted(os.walk(root)):
            paths += [os.path.join(dirpath, name) for name in sorted(files)]
        assert paths, f"no chunk files for {leaf['path']} under {root}"
        for path in paths:
            with open(path, "rb") as f:
                chunks.append(os.path.relpath(path, step_dir).encode() + b"=" + f.read())
        out[leaf["path"]] = json.dumps(leaf["checksum"], sort_keys=True).encode() + b"".join(chunks)
    return out


def _run(command: list[str], log_path: str, timeout: float) -> subprocess.CompletedProcess:
    with open(log_path, "w", encoding="utf-8") as log:
        return subprocess.run(
            command, env=_env(), cwd=REPO_ROOT, stdout=log, stderr=subprocess.PIPE, text=True,
            timeout=timeout,
        )  # fmt: skip


@pytest.mark.slow
def test_recovers_from_two_kills_and_a_hang(tmp_path):
    base = os.environ.get("AXLEARN_RECOVERY_KEEP") or str(tmp_path)
    faulty, clean = os.path.join(base, "faulty"), os.path.join(base, "clean")
    injector = _Injector(faulty)
    injector.start()
    try:
        launched = _run(
            _command(faulty, max_restarts=3), os.path.join(base, "faulty.log"), timeout=2400
        )
    finally:
        injector.done.set()
    with open(os.path.join(base, "faulty.stderr"), "w", encoding="utf-8") as f:
        f.write(launched.stderr)
    assert launched.returncode == 0, launched.stderr[-4000:]
    assert sorted(injector.fault_steps) == [1, 2, 3], injector.fault_steps
    failures = [line for line in launched.stderr.splitlines() if " of 2 " in line]
    assert len(failures) == 3, launched.stderr
    assert "process 1 of 2 was killed by SIGKILL (exit code 137)" in failures[0]
    assert "process 1 of 2 was killed by SIGKILL (exit code 137)" in failures[1]
    assert "exited with code 75 (a hang: no step for crash_on_hang_timeout_seconds" in failures[2]

    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "axlearn.cli.main", "goodput", faulty, "--json"],
            env=_env(), cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    assert report["num_failed_attempts"] == 3 and report["num_attempts"] == 4
    assert report["parts_sum_s"] == pytest.approx(report["wall_s"], rel=0.01)
    for attempt in report["attempts"][:3]:
        fault_step = injector.fault_steps[attempt["number"]]
        committed = attempt["committed_step"]
        assert committed % SAVE_EVERY == 0 and committed <= fault_step
        assert abs(attempt["redone_steps"] - (fault_step - committed)) <= 1, (attempt, fault_step)
        assert attempt["cause"].startswith("process ")
    assert report["attempts"][3]["status"] == "ok"
    assert report["attempts"][3]["last_step"] == STEPS

    clean_run = _run(_command(clean, max_restarts=0), os.path.join(base, "clean.log"), 1200)
    assert clean_run.returncode == 0, clean_run.stderr[-4000:]
    faulty_leaves, clean_leaves = _model_leaves(faulty), _model_leaves(clean)
    assert faulty_leaves and sorted(faulty_leaves) == sorted(clean_leaves)
    differing = [k for k in clean_leaves if faulty_leaves[k] != clean_leaves[k]]
    assert not differing, differing
