"""The unattended-recovery acceptance run: `axlearn local launch --max_restarts=3` of the main job.

Two processes train `gpt-tiny` (the README's main job, shortened to STEPS steps, a checkpoint
every SAVE_EVERY steps). A watcher reads process 1's event file and, at chosen steps, SIGKILLs
process 1 in attempts 1 and 2 and stops it (SIGSTOP) in attempt 3, so that process 0 waits in
the step's collective until its watchdog exits with the hang code. The job must finish without a
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
# attempt -> (action, step at which process 1 gets it).
FAULTS = {1: ("kill", 9), 2: ("kill", 15), 3: ("stop", 21)}


def _command(trainer_dir: str, *, max_restarts: int) -> list[str]:
    return [
        sys.executable, "-m", "axlearn.cli.main", "local", "launch", "--num_processes=2",
        f"--max_restarts={max_restarts}", "--",
        sys.executable, "-m", "axlearn.common.launch_trainer_main",
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
    """Watches process 1's events; applies FAULTS; remembers the last step seen at each."""

    def __init__(self, trainer_dir: str):
        super().__init__(daemon=True)
        self._path = os.path.join(trainer_dir, "events", "process_1.jsonl")
        self.done = threading.Event()
        self.fault_steps: dict[int, int] = {}

    def run(self) -> None:
        offset = 0
        buffer = b""
        while not self.done.is_set():
            time.sleep(0.02)
            if not os.path.exists(self._path):
                continue
            with open(self._path, "rb") as f:
                f.seek(offset)
                data = f.read()
            offset += len(data)
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                attempt = event.get("attempt")
                if event["event"] != "START_STEP" or attempt not in FAULTS:
                    continue
                action, step = FAULTS[attempt]
                if attempt in self.fault_steps or event["step"] < step:
                    continue
                self.fault_steps[attempt] = event["step"]
                sig = signal.SIGKILL if action == "kill" else signal.SIGSTOP
                try:
                    os.kill(event["pid"], sig)
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
    assert "exited with code 75 (a hang" in failures[2]

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
