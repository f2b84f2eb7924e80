"""External SIGKILLs at random times on the real main job: nothing committed is lost.

The README's main job (`axlearn/experiments/text/gpt/tiny.py`, `gpt-tiny`: the 1M-parameter GPT
reading the embedded corpus through tf.data) runs as `python -m axlearn.common.launch_trainer_main`,
shrunk with `--config_override` to MAX_STEP steps with a checkpoint every CHECKPOINT_EVERY (the
schedule's and save policy's derived `max_step` overridden too; the evaler's interval stays 100,
so no evaluation runs) and with `keep_last_n` above the number of saves, so that no committed
step may legitimately disappear.

A reference run goes uninterrupted. A second run in another trainer dir is SIGKILLed from
outside NUM_KILLS times, each at a random delay (seeded RNG, logged) after the process commits
its first new checkpoint, and restarted with the same command until it exits 0. Then:
- every step ever seen committed is still committed, and no partial step directory remains;
- every committed step verifies and holds the same array bytes (index checksums) as the
  reference's step;
- the final step restores to parameters and optimizer state bit-identical to the reference's,
  with the same input iterator position: the same header (batches consumed, config, feeds), and
  both positions restored into the real input yield bit-identical next batches (tf.data's
  serialized iterator bytes themselves differ between identical runs, so they are not compared);
- every step's loss equals the reference's.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from axlearn.common import checkpointer as ckpt_lib
from axlearn.common.input_iterator import decode_state
from tests.common import resume_test_utils as rtu

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_STEP = 48
CHECKPOINT_EVERY = 4
NUM_KILLS = 3
SEED = 16
# A kill comes uniformly within this many (reference-run) steps of the trigger commit.
KILL_WINDOW_STEPS = 8
_SCHEDULE = "learner.optimizer.inner.learning_rate"
OVERRIDES = [
    f"max_step={MAX_STEP}",
    f"{_SCHEDULE}.max_step={MAX_STEP}",
    f"{_SCHEDULE}.warmup_steps=4",
    f"checkpointer.save_policy.n={CHECKPOINT_EVERY}",
    f"checkpointer.save_policy.max_step={MAX_STEP}",
    "checkpointer.keep_last_n=100",
]
EXPECTED_STEPS = list(range(CHECKPOINT_EVERY, MAX_STEP + 1, CHECKPOINT_EVERY))


def _launch(trainer_dir: str, log_path: str, cache_dir: str) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    # Restarts reuse the reference run's compilations.
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    cmd = [sys.executable, "-m", "axlearn.common.launch_trainer_main"]
    cmd += ["--module=text.gpt.tiny", "--config=gpt-tiny", f"--trainer_dir={trainer_dir}"]
    cmd += ["--jax_backend=cpu", *(f"--config_override={o}" for o in OVERRIDES)]
    log = open(log_path, "ab")  # noqa: SIM115 (closed by _finish)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def _finish(proc: subprocess.Popen, timeout: float = 600) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.log.close()


def _committed(trainer_dir: str) -> list[int]:
    return rtu.committed_and_partial(os.path.join(trainer_dir, "checkpoints"))[0]


def _wait_for_new_commit(proc, trainer_dir: str, before: set, seen: set, timeout=600) -> bool:
    """Polls until a step not in `before` is committed (True) or the process exits (False).

    Every committed step seen on the way is added to `seen`.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        committed = set(_committed(trainer_dir))
        seen.update(committed)
        if committed - before:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    raise AssertionError(f"no checkpoint committed within {timeout}s")


def _restore(step_dir: str) -> tuple[int, dict]:
    ckpt = (
        ckpt_lib.Checkpointer.default_config()
        .set(name="ckpt", dir=os.path.dirname(step_dir))
        .instantiate(parent=None)
    )
    try:
        return ckpt.restore(state=ckpt_lib.read_state_spec(step_dir), step=MAX_STEP)
    finally:
        ckpt.stop()


def _next_batches(input_state: bytes, n: int = 2) -> list[dict]:
    """The next `n` batches of the real training input restored to `input_state`."""
    from axlearn.experiments.text.gpt.tiny import tiny_trainer_config  # Imports TensorFlow.

    iterator = iter(tiny_trainer_config().input.set(name="input").instantiate(parent=None))
    iterator.set_state(input_state)
    return [next(iterator) for _ in range(n)]


def _array_leaves(step_dir: str) -> dict:
    return {
        leaf["path"]: leaf
        for leaf in ckpt_lib.read_index_file(step_dir)["leaves"]
        if leaf["kind"] == "array"
    }


@pytest.mark.slow
def test_random_external_sigkills_on_the_gpt_job(tmp_path):
    cache_dir = str(tmp_path / "compilation_cache")
    ref_dir, run_dir = str(tmp_path / "reference"), str(tmp_path / "killed")

    # The uninterrupted run; its pace (after the first commit) scales the kill delays.
    ref = _launch(ref_dir, str(tmp_path / "reference.log"), cache_dir)
    assert _wait_for_new_commit(ref, ref_dir, set(), set())
    first_commit = time.monotonic()
    assert _wait_for_new_commit(ref, ref_dir, set(EXPECTED_STEPS[:-1]), set())
    seconds_per_step = (time.monotonic() - first_commit) / (MAX_STEP - CHECKPOINT_EVERY)
    assert _finish(ref) == 0, (tmp_path / "reference.log").read_text()[-4000:]
    assert _committed(ref_dir) == EXPECTED_STEPS

    rng = random.Random(SEED)
    log_path = str(tmp_path / "killed.log")
    seen: set = set()
    kills, starts = [], 0
    while True:
        starts += 1
        assert starts <= NUM_KILLS + 2, f"run did not finish after {kills}"
        proc = _launch(run_dir, log_path, cache_dir)
        if len(kills) < NUM_KILLS:
            before = set(_committed(run_dir))
            if _wait_for_new_commit(proc, run_dir, before, seen):
                delay = rng.uniform(0, KILL_WINDOW_STEPS * seconds_per_step)
                time.sleep(delay)
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    newest = max(seen)
                    print(f"kill {len(kills) + 1}: {delay:.3f}s after a commit; newest {newest}")
                    kills.append((round(delay, 3), newest))
        returncode = _finish(proc)
        seen.update(_committed(run_dir))
        if returncode == 0:
            break
        assert returncode == -signal.SIGKILL, open(log_path, errors="replace").read()[-4000:]
    print(f"kills (delay s, newest committed at the kill): {kills}; {starts} starts")
    # Each kill hit a live process before the run was done.
    assert len(kills) == NUM_KILLS, (kills, seconds_per_step)
    log = open(log_path, errors="replace").read()
    assert log.count("Restored checkpoint at step") >= NUM_KILLS

    # No committed step was lost or deleted; no partial step left behind.
    committed, partial = rtu.committed_and_partial(os.path.join(run_dir, "checkpoints"))
    assert committed == EXPECTED_STEPS and partial == [] and seen <= set(committed)
    for step in committed:
        step_dir = os.path.join(run_dir, "checkpoints", f"step_{step:08d}")
        result = ckpt_lib.verify_checkpoint(step_dir)
        assert result.ok, (step, result.errors)
        ref_step_dir = os.path.join(ref_dir, "checkpoints", f"step_{step:08d}")
        assert _array_leaves(step_dir) == _array_leaves(ref_step_dir), step

    # The final state: parameters and optimizer state bit for bit, and the input position.
    final = f"checkpoints/step_{MAX_STEP:08d}"
    ref_step, ref_state = _restore(os.path.join(ref_dir, final))
    run_step, run_state = _restore(os.path.join(run_dir, final))
    assert ref_step == run_step == MAX_STEP
    ref_input, run_input = ref_state.pop("input_iter"), run_state.pop("input_iter")
    assert set(ref_state) == set(run_state) and {"model", "learner"} <= set(ref_state)
    assert rtu.state_digest(run_state) == rtu.state_digest(ref_state)
    (ref_header, _), (run_header, _) = decode_state(ref_input), decode_state(run_input)
    for header in (ref_header, run_header):
        for feed in header["feeds"]:
            del feed["offset"], feed["size"]  # Sizes of tf.data's (varying) serialization.
    assert run_header == ref_header and run_header["num_batches"] == MAX_STEP
    for ref_batch, run_batch in zip(_next_batches(ref_input), _next_batches(run_input)):
        assert ref_batch.keys() == run_batch.keys()
        for key, value in ref_batch.items():
            assert value.tobytes() == np.asarray(run_batch[key]).tobytes(), key

    ref_losses, run_losses = rtu.losses_by_step(ref_dir), rtu.losses_by_step(run_dir)
    assert sorted(run_losses) == sorted(ref_losses) == list(range(1, MAX_STEP + 1))
    assert run_losses == ref_losses
