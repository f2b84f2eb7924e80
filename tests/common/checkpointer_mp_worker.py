"""One process of the multi-process checkpointer tests (run by test_checkpointer_multiprocess.py).

Usage: python checkpointer_mp_worker.py MODE PROCESS_ID NUM_PROCESSES PORT CKPT_DIR

Each process has 4 CPU devices; the global mesh (data=2, fsdp=4) spans both processes. Prints
one JSON line prefixed with RESULT: and exits with os._exit (after an orderly shutdown in
roundtrip mode).
"""

import json
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402


def _global_values():
    rng = np.random.default_rng(0)
    return dict(
        w=rng.standard_normal((16, 8)).astype(np.float32),
        b=rng.integers(0, 100, size=(8,), dtype=np.int32),
        s=np.float32(3.5),
    )


def _make(values, mesh, specs):
    return {
        k: jax.make_array_from_callback(
            v.shape, NamedSharding(mesh, specs[k]), lambda idx, v=v: v[idx]
        )
        for k, v in values.items()
    }


def _check(arrays, values):
    for k, arr in arrays.items():
        for shard in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), values[k][shard.index])


def main():
    mode, pid, nproc, port, ckpt_dir = sys.argv[1:6]
    pid, nproc = int(pid), int(nproc)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=nproc, process_id=pid
    )
    from axlearn.common.checkpointer import (  # pylint: disable=import-outside-toplevel
        BarrierTimeoutError,
        Checkpointer,
        TensorStoreStateStorage,
    )

    assert jax.process_count() == nproc and len(jax.devices()) == 4 * nproc
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
    values = _global_values()
    specs = dict(w=PartitionSpec(("data", "fsdp")), b=PartitionSpec("fsdp"), s=PartitionSpec())
    arrays = _make(values, mesh, specs)
    timeout = 3 if mode == "barrier_timeout" else 60
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=ckpt_dir,
        keep_last_n=5,
        storage=TensorStoreStateStorage.default_config().set(timeout_secs=timeout),
    )
    ckpt = cfg.instantiate(parent=None)
    state = dict(model=arrays, step=7, iterator=f"iterator of process {pid}".encode())
    result = dict(pid=pid)
    if mode == "roundtrip":
        ckpt.save(step=6, state=state)
        ckpt.save(step=7, state=state)
        ckpt.wait_until_finished()
        # Committed on every process once wait_until_finished returns.
        result["committed"] = os.path.exists(os.path.join(ckpt_dir, "step_00000007", "index"))
        # The barrier keys of the first save were deleted from the key-value store.
        client = jax._src.distributed.global_state.client  # pylint: disable=protected-access
        keys = [k for k, _ in client.key_value_dir_get("axlearn_ckpt/")]
        result["stale_keys"] = [k for k in keys if "/1/" in k]
        result["num_live_keys"] = len([k for k in keys if "/2/committed" in k])
        step, restored = ckpt.restore(state=state)
        _check(restored["model"], values)
        result["step"] = step
        result["iterator"] = restored["iterator"].decode()
        # A different sharding: columns over (data, fsdp), and replicated.
        other = dict(w=PartitionSpec(None, ("fsdp", "data")), b=PartitionSpec(), s=PartitionSpec())
        target = {
            k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, other[k]))
            for k, v in values.items()
        }
        _, resharded = ckpt.restore(state=dict(state, model=target))
        _check(resharded["model"], values)
        result["resharded"] = True
        ckpt.stop()
    elif mode in ("resume_1_process", "fallback_chunk_damage"):
        # The test wrote steps 1 and 2 with one process (8 devices), model `w` only plus, for
        # resume_1_process, a per-process `iterator`; in fallback mode a chunk of step 2 is
        # damaged and restore_fallback is "previous".
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.checkpointer import CheckpointCorruptionError

        target = dict(
            w=jax.ShapeDtypeStruct((16, 8), np.float32, sharding=NamedSharding(mesh, specs["w"]))
        )
        if mode == "resume_1_process":
            target["iterator"] = b""
        else:
            ckpt = cfg.set(restore_fallback="previous").instantiate(parent=None)
        try:
            step, restored = ckpt.restore(state=target)
            result["error"] = None
            result["step"] = step
            if "iterator" in restored:
                result["iterator"] = restored["iterator"].decode()
        except CheckpointCorruptionError as e:
            result["error"] = f"{type(e).__name__}: {e}"
    elif mode == "barrier_timeout":
        start = time.perf_counter()
        ckpt.save(step=7, state=state)
        try:
            ckpt.wait_until_finished()
            result["error"] = None
        except BarrierTimeoutError as e:
            result["error"] = str(e)
        result["elapsed"] = time.perf_counter() - start
    # The result is printed before the last barrier: process 0 hosts the coordination service,
    # and once it exits the other process is terminated (SIGABRT) by its error-polling thread,
    # which under load can happen between the barrier and a print after it.
    print("RESULT:" + json.dumps(result), flush=True)
    if mode != "barrier_timeout":
        # No process exits while another still uses the service.
        client = jax._src.distributed.global_state.client  # pylint: disable=protected-access
        client.wait_at_barrier("worker_done", 120_000)
    if mode == "roundtrip":
        jax.distributed.shutdown()  # Waits for every process to shut down.
    elif pid == 0:
        time.sleep(2)  # The others exit at once after the barrier; the service goes last.
    os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
    main()
