"""Tests axlearn/common/launch_trainer_main.py: `--help` and the first errors a user meets.

Each mistake below exits with a deterministic-error code (exit_codes.py: 64 or 78) and one line
naming the bad thing and the fix, and no traceback
(issue 29 cases 6, 7 and 13). The commands fail before training, so they run in parallel.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LR = "learner.optimizer.inner.learning_rate.peak_lr"


def _start(*args: str) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("JAX_PLATFORMS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "axlearn.common.launch_trainer_main", *args],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def test_help_prints_the_training_flags_and_exits_0():
    """`python -m axlearn.common.launch_trainer_main --help` (the README's promise)."""
    code, out, err = _finish(_start("--help"))
    assert code == 0, err[-3000:]
    for flag in (
        "--module",
        "--config",
        "--trainer_dir",
        "--config_override",
        "--restore_fallback",
        "--jax_backend",
        "--data_dir",
    ):
        assert f"  {flag}:" in out, flag
    assert out.startswith("Trains a named experiment.")


def _tiny(trainer_dir: str, *extra: str) -> list[str]:
    return [
        "--module=text.gpt.tiny",
        "--config=gpt-tiny",
        f"--trainer_dir={trainer_dir}",
        "--jax_backend=cpu",
        *extra,
    ]


@pytest.mark.slow
def test_user_errors_are_one_line_without_a_traceback(tmp_path):
    """Cases 6, 7 and 13: each mistake names itself and the fix in the last line of stderr."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "a_file").write_text("not a directory")
    runs = iter(str(tmp_path / f"run{i}") for i in range(100))
    cases = {
        "unknown flag": (
            _tiny(next(runs), "--max_step=20"),
            "unknown flag --max_step. Fields of the trainer config are set with "
            "--config_override=PATH=VALUE (e.g. --config_override=max_step=...)",
        ),
        "unknown module": (
            ["--module=text.gpt.tinyy", "--config=gpt-tiny", f"--trainer_dir={next(runs)}"],
            "No experiment module found for --module='text.gpt.tinyy'",
        ),
        "unknown config": (
            ["--module=text.gpt.tiny", "--config=gpt-tinyy", f"--trainer_dir={next(runs)}"],
            "Did you mean: gpt-tiny",
        ),
        "no trainer dir": (
            ["--module=text.gpt.tiny", "--config=gpt-tiny", "--jax_backend=cpu"],
            "--trainer_dir is required",
        ),
        "missing data dir": (
            _tiny(next(runs), f"--data_dir={tmp_path}/nowhere"),
            f"--data_dir={tmp_path}/nowhere does not exist",
        ),
        "empty data dir": (
            _tiny(next(runs), f"--data_dir={empty}"),
            f"--data_dir={empty} is an empty directory",
        ),
        "no TPU": (
            ["--module=text.gpt.tiny", "--config=gpt-tiny", f"--trainer_dir={next(runs)}"]
            + ["--jax_backend=tpu"],
            "--jax_backend=tpu but this machine has no TPU",
        ),
        "fractional max_step": (
            _tiny(next(runs), "--config_override=max_step=20.5"),
            "max_step=20.5: a step count must be a whole number",
        ),
        "NaN learning rate": (
            _tiny(next(runs), f"--config_override={_LR}=nan"),
            f"{_LR}=nan is NaN",
        ),
        "schedule shorter than its warm-up": (
            _tiny(
                next(runs), "--config_override=learner.optimizer.inner.learning_rate.max_step=30"
            ),
            "must be > the step its decay starts at (warmup_steps=30): raise max_step or lower "
            "warmup_steps",
        ),
        "trainer dir is a file (issue 38)": (
            _tiny(str(tmp_path / "a_file")),
            f"--trainer_dir={tmp_path / 'a_file'} is a file, not a directory",
        ),
        "trainer dir under a file (issue 55 case 2)": (
            _tiny(str(tmp_path / "a_file" / "run")),
            f"--trainer_dir={tmp_path / 'a_file' / 'run'} is under a file, not a directory",
        ),
        "trainer dir in /sys (issue 55 case 2)": (
            _tiny("/sys/axlearn_test_run"),
            "--trainer_dir=/sys/axlearn_test_run cannot be written (Operation not permitted)",
        ),
        "trainer dir /proc itself (issue 55 case 2)": (
            _tiny("/proc"),
            "--trainer_dir=/proc cannot be written",
        ),
        "zero model dim": (
            _tiny(next(runs), "--config_override=model.decoder.dim=0"),
            "model.decoder.dim=0: a size must be >= 1",
        ),
    }
    procs = {name: _start(*args) for name, (args, _) in cases.items()}
    for name, proc in procs.items():
        code, _, err = _finish(proc)
        expected = cases[name][1]
        last = err.strip().splitlines()[-1] if err.strip() else ""
        assert code in (64, 78), (name, code, err[-3000:])
        assert last.startswith("launch_trainer_main: error: "), (name, err[-3000:])
        assert expected in last, (name, last)
        assert "Traceback" not in err, (name, err[-3000:])
    # None of them started a run: nothing was recorded in a trainer dir.
    assert not list(tmp_path.glob("run*/trainer_config"))


@pytest.mark.slow
def test_cpu_run_prints_no_error_looking_lines(tmp_path):
    """Case 14: a normal CPU run prints no `E0000 ... cuInit` (or any `E0000`) line."""
    code, out, err = _finish(
        _start(*_tiny(str(tmp_path / "run"), "--config_override=max_step=2", "--data_dir=FAKE"))
    )
    assert code == 0, err[-3000:]
    assert "cuInit" not in err and "\nE0000" not in "\n" + err


def test_out_of_memory_is_one_line_naming_the_size_and_the_knobs():
    """Case 13: a too-long sequence's raw `RESOURCE_EXHAUSTED: Out of memory allocating ...`
    becomes one line with the size in GB and what to lower."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.launch_trainer_main import out_of_memory_message

    message = out_of_memory_message(
        "RESOURCE_EXHAUSTED: Out of memory allocating 123456789012 bytes."
    )
    assert "\n" not in message
    assert message.startswith("the train step does not fit in device memory (it asked for 123.5 GB")
    assert "input.source.max_sequence_length" in message and "global_batch_size" in message


def test_disk_full_outside_a_save_names_the_path(tmp_path):
    """Case 13: an OSError(ENOSPC) reaching the launcher (outside a checkpoint save) exits with
    one line naming the file (or the trainer dir when the error has none) and what to do."""
    # pylint: disable-next=import-outside-toplevel
    import errno
    import types

    from axlearn.common import launch_trainer_main as ltm  # pylint: disable=import-outside-toplevel

    cfg = types.SimpleNamespace(dir=str(tmp_path))
    path = str(tmp_path / "summaries" / "events.out")
    with pytest.raises(SystemExit) as e:
        ltm._exit_disk_full(  # pylint: disable=protected-access
            OSError(errno.ENOSPC, "No space left on device", path), cfg
        )
    assert str(e.value) == (
        f"launch_trainer_main: error: No space left on device (writing {path}). Free space and "
        "rerun the same command: the run resumes from its last committed checkpoint."
    )
    with pytest.raises(SystemExit, match=f"writing {tmp_path}\\)"):
        ltm._exit_disk_full(OSError(errno.ENOSPC, "No space"), cfg)  # pylint: disable=W0212


@pytest.mark.slow
def test_busy_coordinator_port_is_one_line_and_the_peer_says_what_it_waits_for(tmp_path):
    """Issue 38: a coordinator port held by another program: process 0 exits with one line
    naming the port (no gRPC traceback); process 1 says where it connects and how long it waits
    (no silent hang), and stops at its timeout."""
    # pylint: disable-next=import-outside-toplevel
    import socket

    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        procs = [
            _start(
                *_tiny(str(tmp_path / "run"), "--data_dir=FAKE"),
                f"--distributed_coordinator=127.0.0.1:{port}",
                "--num_processes=2",
                f"--process_id={i}",
                "--initialization_timeout=10",
            )
            for i in range(2)
        ]
        (code0, _, err0), (code1, _, err1) = [_finish(p) for p in procs]
    finally:
        holder.close()
    last = err0.strip().splitlines()[-1]
    # A busy port is the command line's to fix: the usage exit code, never retried by a launcher.
    assert code0 == 64 and "Traceback" not in err0, err0[-3000:]  # USAGE_ERROR_EXIT_CODE.
    assert last == (
        f"launch_trainer_main: error: --distributed_coordinator=127.0.0.1:{port}: port {port} is "
        "already in use on this host (another run or program holds it). Pass another free port "
        "to every process of the run (`axlearn local launch` picks a free one when --port is not "
        "given)."
    ), last
    assert code1 != 0
    assert (
        f"Process 1 of 2: connecting to the coordinator at 127.0.0.1:{port} (process 0's). If "
        "process 0 did not start (see its log: e.g. a busy port), this process stops after "
        "--initialization_timeout=10 s." in err1
    ), err1[-3000:]
    assert not os.path.exists(tmp_path / "run" / "trainer_config")


def test_refused_or_rejected_runs_write_nothing_into_the_live_runs_events(tmp_path):
    """Issue 55 item 4: a second trainer refused by the run lock, and a run rejected for a bad
    --config_override, appended START_JOB (and accelerator-init events) to the live run's
    events, so `axlearn goodput` listed failed attempts whose parts summed to 102.9% of the
    wall time. Now nothing is recorded before the lock is held and the trainer is built."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.run_lock import RunLock

    live = tmp_path / "live"
    events = live / "events"
    events.mkdir(parents=True)
    log = events / "process_0.jsonl"
    log.write_bytes(b'{"event": "START_JOB", "time": 1.0}\n{"event": "START_STEP", "step": 1, '
                    b'"time": 2.0}\n')  # fmt: skip
    before = (log.read_bytes(), log.stat().st_mtime_ns)
    with RunLock(str(live)):  # The live run holds its dir.
        refused = _start(*_tiny(str(live), "--data_dir=FAKE"))
        rejected = _start(*_tiny(str(live), "--config_override=max_steps=3", "--data_dir=FAKE"))
        (code_refused, _, err_refused), (code_rejected, _, err_rejected) = (
            _finish(refused),
            _finish(rejected),
        )
    assert code_refused == 73, err_refused[-3000:]  # exit_codes.BUSY_EXIT_CODE.
    assert code_rejected == 78, err_rejected[-3000:]  # exit_codes.CONFIG_ERROR_EXIT_CODE.
    assert "Traceback" not in err_refused + err_rejected
    assert (log.read_bytes(), log.stat().st_mtime_ns) == before
    assert sorted(os.listdir(events)) == ["process_0.jsonl"]
