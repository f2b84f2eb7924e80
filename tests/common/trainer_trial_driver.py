"""Runs many short trainer processes cheaply, for the crash-safety and preemption tests.

Usage: python -m tests.common.trainer_trial_driver SPEC.json RESULT.json

This driver imports JAX and the trainer once, without initializing any JAX backend, and then
forks one child process per run listed in the spec, one at a time: each child is a real,
separate trainer process (it can SIGKILL itself at a checkpoint fault point, or receive SIGTERM)
that skips the seconds of Python imports. The children share a JAX persistent compilation cache,
so only the first one compiles.

SPEC: {"num_devices": 1, "compilation_cache_dir": "...", "runs": [RUN, ...]} where RUN is
{"name": str, "dir": trainer dir, "max_step": int, "checkpoint_every": int, "keep_last_n": int,
 "env": {VAR: value} (e.g. AXLEARN_CHECKPOINT_FAULT), "sigterm_at_step": int or absent (the
 driver sends SIGTERM once metrics.jsonl shows this step), "sigterm_at_batch": int or absent
 (the child's input sends SIGTERM to itself when fetching this 0-based batch),
 "seconds_per_batch": float or absent (the input sleeps before each batch),
 "preemption_timeout_seconds": float or absent}.

RESULT: one record per run: {"name", "returncode" (negative: killed by that signal),
"newest_committed_before", "committed", "partial" (step directories after the run), "child":
what the child reported (restored steps, final step, state digest, preemption) or null if it
died first}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback


def _setup_env(spec: dict) -> None:
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={int(spec.get('num_devices', 1))}"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _child(run: dict, spec: dict) -> int:
    """The body of one trainer process; returns its exit code."""
    import jax  # pylint: disable=import-outside-toplevel

    from axlearn.common import preemption  # pylint: disable=import-outside-toplevel
    from tests.common import resume_test_utils as rtu  # pylint: disable=import-outside-toplevel

    cache_dir = spec.get("compilation_cache_dir")
    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    cfg = rtu.resume_trainer_config(
        run["dir"],
        max_step=run["max_step"],
        checkpoint_every=run.get("checkpoint_every", 2),
        keep_last_n=run.get("keep_last_n", 2),
        sigterm_at_batch=run.get("sigterm_at_batch"),
        seconds_per_batch=run.get("seconds_per_batch", 0.0),
    )
    if run.get("preemption_timeout_seconds") is not None:
        cfg.preemption_timeout_seconds = run["preemption_timeout_seconds"]
    result: dict = {}
    code = 0
    trainer = cfg.instantiate(parent=None)
    try:
        out = trainer.run(jax.random.PRNGKey(0))
        result["final_step"] = None if out is None else out["step"]
    except preemption.TrainingPreempted as e:
        code = e.code
        result["preempted"] = dict(
            step=e.step, saved_step=e.saved_step, notice_to_exit_s=e.notice_to_exit_s
        )
    result["restored_steps"] = getattr(trainer, "restored_steps", None)
    result["step"] = trainer.step
    result["state_digest"] = rtu.state_digest(trainer.trainer_state)
    with open(os.path.join(run["dir"], f"child_{run['name']}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)
    return code


def _wait_for_step(run: dict, pid: int, step: int, timeout_s: float = 300) -> None:
    """Sends SIGTERM to `pid` once metrics.jsonl records `step` (or the child has exited)."""
    path = os.path.join(run["dir"], "metrics.jsonl")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            raise RuntimeError(f"run {run['name']} exited before reaching step {step}")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                steps = [json.loads(line)["step"] for line in f if line.strip()]
            if steps and max(steps) >= step:
                os.kill(pid, signal.SIGTERM)
                return
        time.sleep(0.02)
    raise TimeoutError(f"run {run['name']} did not reach step {step} in {timeout_s}s")


def main() -> None:
    """Runs the spec's runs one after another; writes the result JSON."""
    spec_path, result_path = sys.argv[1:3]
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    _setup_env(spec)
    # Import everything once, before forking; no JAX backend is initialized in this process.
    import jax  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    from axlearn.common import trainer  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    from axlearn.common.checkpointer import (  # pylint: disable=import-outside-toplevel
        latest_checkpoint_step,
    )
    from tests.common import resume_test_utils as rtu  # pylint: disable=import-outside-toplevel

    records = []
    for run in spec["runs"]:
        ckpt_dir = os.path.join(run["dir"], "checkpoints")
        before = latest_checkpoint_step(ckpt_dir)
        start = time.monotonic()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for key, value in run.get("env", {}).items():
                    os.environ[key] = str(value)
                code = _child(run, spec)
            except BaseException:  # pylint: disable=broad-except
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # pylint: disable=protected-access
        if run.get("sigterm_at_step") is not None:
            _wait_for_step(run, pid, int(run["sigterm_at_step"]))
        _, status = os.waitpid(pid, 0)
        returncode = os.waitstatus_to_exitcode(status)
        committed, partial = rtu.committed_and_partial(ckpt_dir)
        child_path = os.path.join(run["dir"], f"child_{run['name']}.json")
        child = None
        if os.path.exists(child_path):
            with open(child_path, encoding="utf-8") as f:
                child = json.load(f)
            os.remove(child_path)
        records.append(
            dict(
                name=run["name"],
                returncode=returncode,
                seconds=time.monotonic() - start,
                newest_committed_before=before,
                committed=committed,
                partial=partial,
                child=child,
            )
        )
        print(f"driver: {records[-1]}", flush=True)
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(records, f)


if __name__ == "__main__":
    main()
