"""Crash safety of checkpoints with the trainer running: a crash never loses committed work.

For each of the 4 fault points of a save (`AXLEARN_CHECKPOINT_FAULT`: before any array,
mid-arrays, after the arrays before the index, after the index) and 5 trials each (the fault hits
the save of a different step), a trainer process SIGKILLs itself inside the save. The next start
must: restore the newest committed step without error, finish the run, leave no partial step
directory (GC removes it, or the re-save of that step replaces it), keep only valid checkpoints
(every chunk matches its checksum), and end with a state bit-identical to an uninterrupted run.

The trainer processes are forked by tests/common/trainer_trial_driver.py (one Python import for
all of them) and share a compilation cache, so a trial costs a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from axlearn.common.checkpointer import FAULT_ENV, FAULT_POINTS, verify_checkpoint

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_STEP = 8
CHECKPOINT_EVERY = 2
KEEP_LAST_N = 2
# The step whose save faults, per trial.
FAULT_STEPS = (4, 6, 8, 2, 6)


def run_driver(tmp_path, runs: list[dict], *, num_devices: int = 1, timeout: float = 1800):
    """Runs trainer processes through the trial driver; returns their records by name."""
    spec = dict(
        num_devices=num_devices,
        compilation_cache_dir=str(tmp_path / "compilation_cache"),
        runs=runs,
    )
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.pop(FAULT_ENV, None)
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    log_path = tmp_path / "driver.log"
    with open(log_path, "wb") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.common.trainer_trial_driver", spec_path, result_path],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    if proc.returncode != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace")[-6000:]
        raise AssertionError(f"trial driver failed (exit {proc.returncode}):\n{tail}")
    return {r["name"]: r for r in json.loads(result_path.read_text())}, log_path


def _trial_runs(tmp_path, trials: list[tuple[str, int]]) -> list[dict]:
    common = dict(max_step=MAX_STEP, checkpoint_every=CHECKPOINT_EVERY, keep_last_n=KEEP_LAST_N)
    runs = [dict(name="reference", dir=str(tmp_path / "reference"), **common)]
    for point, step in trials:
        trial = f"{point}@{step}"
        trial_dir = str(tmp_path / f"trial_{point}_{step}_{len(runs)}")
        runs.append(
            dict(name=f"crash {trial} {len(runs)}", dir=trial_dir, env={FAULT_ENV: trial}, **common)
        )
        runs.append(dict(name=f"resume {trial} {len(runs) - 1}", dir=trial_dir, **common))
    return runs


def _check_trials(tmp_path, trials: list[tuple[str, int]]) -> list[str]:
    runs = _trial_runs(tmp_path, trials)
    dirs = {run["name"]: run["dir"] for run in runs}
    records, log_path = run_driver(tmp_path, runs)
    reference = records.pop("reference")
    assert reference["returncode"] == 0, log_path.read_text()[-4000:]
    expected_final = sorted(range(CHECKPOINT_EVERY, MAX_STEP + 1, CHECKPOINT_EVERY))[-KEEP_LAST_N:]
    assert reference["committed"] == expected_final
    digest = reference["child"]["state_digest"]
    failures = []
    names = list(records)
    for crash_name, resume_name in zip(names[::2], names[1::2]):
        crash, resume = records[crash_name], records[resume_name]
        point, step = crash_name.split()[1].split("@")
        step = int(step)
        problems = []
        # The crash: SIGKILL inside the save of `step`.
        if crash["returncode"] != -9:
            problems.append(f"crash run exited {crash['returncode']}, not SIGKILL")
        newest = step if point == "after_index" else step - CHECKPOINT_EVERY
        if (crash["committed"] or [None])[-1] != (newest or None):
            problems.append(f"after the crash committed={crash['committed']}, newest != {newest}")
        if point != "after_index" and crash["partial"] != [step]:
            problems.append(f"after the crash partial={crash['partial']}, expected [{step}]")
        # The restart: restores the newest committed step, finishes, cleans up.
        if resume["returncode"] != 0:
            problems.append(f"resume run exited {resume['returncode']}")
        child = resume["child"] or {}
        if child.get("restored_steps") != [newest or None]:
            problems.append(f"restored {child.get('restored_steps')}, expected [{newest}]")
        if child.get("step") != MAX_STEP:
            problems.append(f"resume ended at step {child.get('step')}")
        if resume["partial"]:
            problems.append(f"partial directories remain: {resume['partial']}")
        # GC runs after each commit: once the restart commits, exactly the newest KEEP_LAST_N
        # remain. A crash after the index of the last step leaves nothing to train or commit, so
        # an older checkpoint GC had not yet removed may stay (harmless; removed by the next GC).
        kept = resume["committed"]
        if newest == MAX_STEP:
            kept = kept[-KEEP_LAST_N:]
        if kept != expected_final:
            problems.append(f"committed={resume['committed']}, expected {expected_final}")
        if child.get("state_digest") != digest:
            problems.append("final state differs from the uninterrupted run")
        if problems:
            failures.append(f"{crash_name}: " + "; ".join(problems))
    # Every checkpoint left behind verifies against its index checksums.
    for name in names[1::2]:
        ckpt_dir = os.path.join(dirs[name], "checkpoints")
        for step in records[name]["committed"]:
            result = verify_checkpoint(os.path.join(ckpt_dir, f"step_{step:08d}"))
            if not result.ok:
                failures.append(f"{name}: step {step} fails verification: {result.errors}")
    return failures


@pytest.mark.slow
def test_one_crash_per_fault_point(tmp_path):
    """The quick version: one trial per fault point."""
    failures = _check_trials(tmp_path, [(point, 4) for point in FAULT_POINTS])
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_crash_safety_20_trials(tmp_path):
    """The acceptance: 4 fault points x 5 trials; all 20 must pass."""
    trials = [(point, step) for point in FAULT_POINTS for step in FAULT_STEPS]
    assert len(trials) == 20
    failures = _check_trials(tmp_path, trials)
    print(f"crash-safety trials: {len(trials) - len(failures)} of {len(trials)} passed")
    assert not failures, "\n".join(failures)


def test_failed_precondition_writes_nothing(tmp_path):
    """The trainer's finiteness gate: a save whose precondition raises leaves no directory."""
    import jax.numpy as jnp

    from axlearn.common.checkpointer import Checkpointer

    checkpointer = (
        Checkpointer.default_config()
        .set(name="checkpointer", dir=str(tmp_path))
        .instantiate(parent=None)
    )
    state = dict(w=jnp.arange(8.0))

    def refuse():
        raise FloatingPointError("not finite")

    assert checkpointer.save(step=1, state=state, precondition=refuse) is not None
    with pytest.raises(FloatingPointError, match="not finite"):
        checkpointer.wait_until_finished()
    assert os.listdir(tmp_path) == []
    # The next save works; a precondition that passes is called once, before the write.
    calls = []
    checkpointer.save(step=2, state=state, precondition=lambda: calls.append(1))
    checkpointer.wait_until_finished()
    assert calls == [1] and checkpointer.latest_step() == 2
