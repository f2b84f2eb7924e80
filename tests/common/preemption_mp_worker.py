"""One process of the 2-process preemption test (run by test_preemption.py).

Usage: python -m tests.common.preemption_mp_worker PROCESS_ID NUM_PROCESSES PORT DIR MAX_STEP

Each process has 1 CPU device; the mesh (fsdp=2) spans both processes. The trainer runs until
`MAX_STEP` or a preemption notice (SIGTERM to any process: JAX's preemption service makes every
process stop after the same step). Prints one JSON line prefixed with RESULT: and exits with
os._exit (0, or PREEMPTED_EXIT_CODE).
"""

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402


def main():
    """Runs one process of the trainer."""
    pid, nproc, port, trainer_dir, max_step = sys.argv[1:6]
    pid, nproc = int(pid), int(nproc)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid
    )
    # pylint: disable=import-outside-toplevel
    from axlearn.common.preemption import TrainingPreempted
    from tests.common import resume_test_utils as rtu

    cfg = rtu.resume_trainer_config(
        trainer_dir,
        max_step=int(max_step),
        checkpoint_every=1000,
        mesh_shape=(1, 1, -1, 1),
        # Keeps the run going for seconds, so the signal arrives mid-run.
        seconds_per_batch=0.05,
    )
    cfg.preemption_timeout_seconds = 120
    trainer = cfg.instantiate(parent=None)
    result = dict(process=pid, code=0)
    try:
        out = trainer.run(jax.random.PRNGKey(0))
        result["final_step"] = None if out is None else out["step"]
    except TrainingPreempted as e:
        result.update(code=e.code, preempted_step=e.step, saved_step=e.saved_step)
    result["restored_steps"] = trainer.restored_steps
    result["step"] = trainer.step
    print("RESULT:" + json.dumps(result), flush=True)
    sys.stderr.flush()
    # Process 0 hosts the coordination service: once it exits, the other process is terminated
    # (SIGABRT) by its error-polling thread, so it waits for the others to reach this point and
    # then exits last.
    client = jax._src.distributed.global_state.client  # pylint: disable=protected-access
    client.wait_at_barrier("worker_done", 120_000)
    if pid == 0:
        time.sleep(2)
    os._exit(result["code"])  # pylint: disable=protected-access


if __name__ == "__main__":
    main()
