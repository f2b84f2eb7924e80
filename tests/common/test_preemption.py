"""Preemption: SIGTERM mid-run leaves a committed checkpoint of the last completed step, the
process exits with PREEMPTED_EXIT_CODE within the configured time, and the next start resumes
from that step (bit-identically to a run that was never preempted).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib

import jax
import numpy as np
import pytest

from axlearn.common.checkpointer import FAULT_ACTION_ENV, FAULT_ENV
from axlearn.common.preemption import (
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    PreemptionHandler,
    TrainingPreempted,
)
from tests.common import resume_test_utils as rtu
from tests.common.test_checkpoint_crash_safety import REPO_ROOT, run_driver

# ----------------------------------------------------------------------------------------------
# PreemptionHandler.
# ----------------------------------------------------------------------------------------------


def test_handler_receives_sigterm_and_restores_the_previous_handler():
    previous = signal.getsignal(signal.SIGTERM)
    exits = []
    with PreemptionHandler(timeout_seconds=60, exit_fn=exits.append) as handler:
        assert handler.active
        assert signal.getsignal(signal.SIGTERM) is not previous
        assert not handler.requested(step=1) and handler.seconds_since_notice() is None
        os.kill(os.getpid(), signal.SIGTERM)
        # The process is still alive; the notice is recorded.
        deadline = time.monotonic() + 5
        while not handler.requested(step=2) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handler.requested(step=2)
        assert 0 <= handler.seconds_since_notice() < 5
        # A second SIGTERM changes nothing.
        os.kill(os.getpid(), signal.SIGTERM)
        err = handler.preempted(step=2, saved_step=2)
    assert signal.getsignal(signal.SIGTERM) is previous
    assert exits == []  # Leaving the block cancels the deadline.
    assert isinstance(err, SystemExit) and err.code == PREEMPTED_EXIT_CODE == 75
    assert err.step == err.saved_step == 2 and "exit code 75" in str(err)


def test_deadline_exits_with_the_preempted_code():
    exits = []
    with PreemptionHandler(timeout_seconds=0.3, exit_fn=exits.append) as handler:
        handler.set_activity("saving step 7")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert handler.requested(step=7) and exits == []
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
    assert exits == [PREEMPTED_EXIT_CODE]


def test_notice_time_is_taken_while_the_main_thread_is_blocked():
    """The deadline counts from the signal, not from when Python code next runs."""
    data = np.random.default_rng(0).integers(0, 255, size=24 << 20, dtype=np.uint8).tobytes()
    with PreemptionHandler(timeout_seconds=600) as handler:
        sender = threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGTERM))
        start = time.monotonic()
        sender.start()
        # A long C call in the main thread: Python-level handlers cannot run during it.
        while time.monotonic() - start < 1.0:
            zlib.compress(data, 9)
        blocked_for = time.monotonic() - start
        age = handler.seconds_since_notice()
        sender.join()
    assert age is not None and age > blocked_for - 0.6, (age, blocked_for)


def test_ctrl_c_is_a_notice_with_code_130_and_a_second_one_exits_at_once(capfd):
    """Issue 55 case 3: SIGINT is handled like SIGTERM (save, exit 130); a second exits now."""
    previous = signal.getsignal(signal.SIGINT)
    exits = []
    with PreemptionHandler(timeout_seconds=60, exit_fn=exits.append) as handler:
        assert not handler.requested(step=218)
        os.kill(os.getpid(), signal.SIGINT)  # No KeyboardInterrupt: the handler takes it.
        deadline = time.monotonic() + 5
        while not handler.requested(step=219) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handler.requested(step=219) and exits == []
        err = handler.preempted(step=219, saved_step=219)
        assert err.code == INTERRUPTED_EXIT_CODE == 130 and err.interrupted
        assert str(err).startswith("Interrupted (Ctrl-C) after step 219; committed step 219")
        handler.set_activity("saving step 219")
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not exits and time.monotonic() < deadline:
            time.sleep(0.01)
    assert exits == [130]
    assert signal.getsignal(signal.SIGINT) is previous
    line = capfd.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("Second Ctrl-C while saving step 219: exiting now with code 130")
    assert "step 219 is not saved" in line


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_seconds must be > 0"):
        PreemptionHandler(timeout_seconds=0)


# ----------------------------------------------------------------------------------------------
# Through the trainer.
# ----------------------------------------------------------------------------------------------


def test_trainer_saves_the_last_completed_step_and_resumes_from_it(tmp_path):
    # No periodic saves: the only checkpoint is the one taken on preemption. The input sends
    # SIGTERM while fetching batch 4 (step 5's): step 5 is finished, saved, and the run exits.
    full_dir, run_dir = str(tmp_path / "full"), str(tmp_path / "preempted")
    cfg = rtu.resume_trainer_config(run_dir, max_step=8, checkpoint_every=1000, sigterm_at_batch=4)
    cfg.preemption_timeout_seconds = 120
    trainer = cfg.instantiate(parent=None)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingPreempted) as info:
        trainer.run(jax.random.PRNGKey(3))
    assert signal.getsignal(signal.SIGTERM) is previous
    err = info.value
    assert err.code == PREEMPTED_EXIT_CODE
    assert err.step == err.saved_step == trainer.step == 5
    assert 0 < err.notice_to_exit_s < 120
    committed, partial = rtu.committed_and_partial(os.path.join(run_dir, "checkpoints"))
    assert committed == [5] and partial == []
    # The last completed step was reported before exiting.
    assert max(rtu.losses_by_step(run_dir)) == 5

    resumed = rtu.resume_trainer_config(run_dir, max_step=8, checkpoint_every=1000)
    resumed_trainer = resumed.instantiate(parent=None)
    out = resumed_trainer.run(jax.random.PRNGKey(3))
    assert resumed_trainer.restored_steps == [5] and out["step"] == 8

    full = rtu.resume_trainer_config(full_dir, max_step=8, checkpoint_every=1000)
    full_trainer = full.instantiate(parent=None)
    full_trainer.run(jax.random.PRNGKey(3))
    assert rtu.losses_by_step(run_dir) == rtu.losses_by_step(full_dir)
    assert rtu.state_digest(resumed_trainer.trainer_state) == rtu.state_digest(
        full_trainer.trainer_state
    )


def test_preemption_at_a_step_the_policy_already_saves(tmp_path):
    # Step 4 is saved by the policy (every 2 steps); preemption after step 4 does not save twice.
    cfg = rtu.resume_trainer_config(
        str(tmp_path), max_step=8, checkpoint_every=2, keep_last_n=5, sigterm_at_batch=3
    )
    trainer = cfg.instantiate(parent=None)
    with pytest.raises(TrainingPreempted) as info:
        trainer.run(jax.random.PRNGKey(0))
    assert info.value.step == info.value.saved_step == 4
    committed, partial = rtu.committed_and_partial(os.path.join(str(tmp_path), "checkpoints"))
    assert committed == [2, 4] and partial == []


@pytest.mark.slow
def test_sigterm_from_another_process(tmp_path):
    """A real external SIGTERM at an arbitrary point of a running trainer process."""
    common = dict(max_step=30, checkpoint_every=1000, keep_last_n=2)
    runs = [
        dict(name="reference", dir=str(tmp_path / "reference"), **common),
        dict(
            name="preempted",
            dir=str(tmp_path / "run"),
            sigterm_at_step=3,
            preemption_timeout_seconds=120,
            # Keeps the run going for seconds, so the signal arrives mid-run.
            seconds_per_batch=0.05,
            **common,
        ),
        dict(name="resumed", dir=str(tmp_path / "run"), **common),
    ]
    records, log_path = run_driver(tmp_path, runs)
    log = log_path.read_text(errors="replace")
    preempted, resumed = records["preempted"], records["resumed"]
    assert preempted["returncode"] == PREEMPTED_EXIT_CODE, log[-4000:]
    info = preempted["child"]["preempted"]
    # The last completed step is committed; nothing partial is left.
    assert info["step"] == info["saved_step"] == preempted["child"]["step"]
    assert 3 <= info["step"] < 30
    assert preempted["committed"] == [info["step"]] and preempted["partial"] == []
    # The next start resumes from it and ends where the uninterrupted run ended.
    assert resumed["returncode"] == 0, log[-4000:]
    assert resumed["child"]["restored_steps"] == [info["step"]]
    assert resumed["child"]["step"] == 30
    assert resumed["child"]["state_digest"] == records["reference"]["child"]["state_digest"]


@pytest.mark.slow
def test_deadline_when_the_save_hangs(tmp_path):
    """A save that cannot finish: the process still exits with the preempted code in time."""
    common = dict(max_step=8, checkpoint_every=2, keep_last_n=5)
    runs = [
        dict(
            name="preempted",
            dir=str(tmp_path / "run"),
            sigterm_at_batch=4,
            preemption_timeout_seconds=4,
            # The preemption save of step 5 hangs after writing its arrays.
            env={FAULT_ENV: "after_arrays@5", FAULT_ACTION_ENV: "hang"},
            **common,
        ),
        dict(name="resumed", dir=str(tmp_path / "run"), **common),
    ]
    records, log_path = run_driver(tmp_path, runs)
    log = log_path.read_text(errors="replace")
    preempted, resumed = records["preempted"], records["resumed"]
    assert preempted["returncode"] == PREEMPTED_EXIT_CODE, log[-4000:]
    assert preempted["child"] is None  # It exited from the deadline, not from run().
    assert "still committing step 5" in log or "still saving step 5" in log, log[-4000:]
    assert preempted["committed"] == [2, 4] and preempted["partial"] == [5]
    assert resumed["returncode"] == 0 and resumed["child"]["restored_steps"] == [4]
    assert resumed["child"]["step"] == 8 and resumed["partial"] == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_workers(trainer_dir: str, max_step: int, log_dir) -> list[subprocess.Popen]:
    port = _free_port()
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    procs = []
    for pid in range(2):
        log = open(log_dir / f"worker_{pid}_{len(os.listdir(log_dir))}.log", "w+b")  # noqa: SIM115
        args = [sys.executable, "-m", "tests.common.preemption_mp_worker", str(pid), "2"]
        args += [str(port), trainer_dir, str(max_step)]
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc.log = log
        procs.append(proc)
    return procs


def _results(procs: list[subprocess.Popen], timeout: float = 600) -> list[dict]:
    results = []
    for proc in procs:
        proc.wait(timeout=timeout)
        proc.log.seek(0)
        text = proc.log.read().decode(errors="replace")
        proc.log.close()
        lines = [line for line in text.splitlines() if line.startswith("RESULT:")]
        assert lines, f"worker exited {proc.returncode} without a result:\n{text[-4000:]}"
        results.append(dict(json.loads(lines[-1][len("RESULT:") :]), returncode=proc.returncode))
    return results


@pytest.mark.slow
def test_two_processes_stop_after_the_same_step(tmp_path):
    """SIGTERM to one of 2 processes: both stop after the same step, which is committed."""
    trainer_dir, max_step = str(tmp_path / "run"), 100
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = _start_workers(trainer_dir, max_step, logs)
    try:
        metrics = os.path.join(trainer_dir, "metrics.jsonl")
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if os.path.exists(metrics) and len(rtu.losses_by_step(trainer_dir)) >= 3:
                break
            assert all(p.poll() is None for p in procs), "a worker exited early"
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGTERM)  # Only process 1 receives the notice.
        results = _results(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    steps = {r["preempted_step"] for r in results if "preempted_step" in r}
    assert [r["returncode"] for r in results] == [PREEMPTED_EXIT_CODE] * 2, results
    assert len(steps) == 1, results
    (step,) = steps
    assert 3 <= step < max_step and all(r["saved_step"] == step for r in results)
    committed, partial = rtu.committed_and_partial(os.path.join(trainer_dir, "checkpoints"))
    assert committed == [step] and partial == []

    resumed = _results(_start_workers(trainer_dir, max_step, logs))
    assert [r["returncode"] for r in resumed] == [0, 0], resumed
    assert all(r["restored_steps"] == [step] and r["final_step"] == max_step for r in resumed)


def _launch(trainer_dir: str, log_path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, "-m", "axlearn.common.launch_trainer_main"]
    cmd += ["--module=tests.common.preemption_experiment", "--config=gpt-tiny-preempt"]
    cmd += [f"--trainer_dir={trainer_dir}", "--data_dir=FAKE", "--jax_backend=cpu"]
    log = open(log_path, "w+b")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


@pytest.mark.slow
def test_launcher_exits_with_the_preempted_code_and_the_same_command_resumes(tmp_path):
    """`python -m axlearn.common.launch_trainer_main ...`: SIGTERM -> exit 75; rerun resumes."""
    from tests.common.preemption_experiment import MAX_STEP

    trainer_dir = str(tmp_path / "run")
    proc = _launch(trainer_dir, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if len(rtu.losses_by_step(trainer_dir)) >= 3:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    proc.log.seek(0)
    log = proc.log.read().decode(errors="replace")
    assert proc.returncode == PREEMPTED_EXIT_CODE, log[-4000:]
    last = max(rtu.losses_by_step(trainer_dir))
    assert 3 <= last < MAX_STEP
    committed, partial = rtu.committed_and_partial(os.path.join(trainer_dir, "checkpoints"))
    assert committed == [last] and partial == []
    assert f"Preempted after step {last}; committed step {last}" in log

    again = _launch(trainer_dir, tmp_path / "second.log")
    again.wait(timeout=900)
    again.log.seek(0)
    log = again.log.read().decode(errors="replace")
    assert again.returncode == 0, log[-4000:]
    assert f"Restored checkpoint at step {last}" in log
    assert sorted(rtu.losses_by_step(trainer_dir)) == list(range(1, MAX_STEP + 1))
    # Issue 55 item 4: the preemption is its own attempt outcome, not "failed: ended without
    # END_JOB".
    from axlearn.common import goodput  # pylint: disable=import-outside-toplevel

    report = goodput.compute_goodput(trainer_dir)
    assert [a.status for a in report.attempts] == ["preempted", "ok"], report.warnings
    assert report.attempts[0].committed_step == last and report.attempts[0].redone_steps == 0
    assert "ended without END_JOB" not in goodput.format_goodput(report)


def _interrupt_run(tmp_path, name: str, *, signals: int) -> tuple[subprocess.Popen, str, str]:
    """Starts the tiny run, sends `signals` SIGINTs (10 ms apart) once 3 steps are logged."""
    trainer_dir = str(tmp_path / name)
    proc = _launch(trainer_dir, tmp_path / f"{name}.log")
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if len(rtu.losses_by_step(trainer_dir)) >= 3:
                break
            time.sleep(0.02)
        for _ in range(signals):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.01)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    proc.log.seek(0)
    return proc, trainer_dir, proc.log.read().decode(errors="replace")


@pytest.mark.slow
def test_ctrl_c_saves_the_step_and_exits_130_and_a_second_exits_at_once(tmp_path):
    """Issue 55 case 3, a real process: Ctrl-C saves and exits 130 with one line, no traceback;
    two Ctrl-C exit at once saying the step is not saved."""
    from tests.common.preemption_experiment import MAX_STEP

    proc, trainer_dir, log = _interrupt_run(tmp_path, "once", signals=1)
    assert proc.returncode == INTERRUPTED_EXIT_CODE, log[-4000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-4000:]
    last = max(rtu.losses_by_step(trainer_dir))
    assert 3 <= last < MAX_STEP
    committed, partial = rtu.committed_and_partial(os.path.join(trainer_dir, "checkpoints"))
    assert committed == [last] and partial == []
    assert f"Interrupted (Ctrl-C) after step {last}; committed step {last}" in log

    proc, trainer_dir, log = _interrupt_run(tmp_path, "twice", signals=2)
    assert proc.returncode == INTERRUPTED_EXIT_CODE, log[-4000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-4000:]
    assert "Second Ctrl-C while " in log and "is not saved" in log, log[-4000:]
