"""Multi-process tests of axlearn/common/checkpointer: 2 processes on 127.0.0.1."""

import json
import os
import socket
import subprocess
import sys

import pytest

from axlearn.common import checkpointer as ckpt_lib

WORKER = os.path.join(os.path.dirname(__file__), "checkpointer_mp_worker.py")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(mode, pid, port, ckpt_dir, extra_env=None):
    env = dict(os.environ)
    env.pop(ckpt_lib.FAULT_ENV, None)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra_env or {})
    return subprocess.Popen(
        [sys.executable, WORKER, mode, str(pid), "2", str(port), ckpt_dir],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _result(proc, timeout):
    out, _ = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("RESULT:")]
    assert lines, f"worker failed (rc={proc.returncode}):\n{out[-4000:]}"
    return json.loads(lines[-1][len("RESULT:") :])


@pytest.mark.slow
def test_two_processes_write_their_shards_and_restore(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    port = _free_port()
    procs = [_start("roundtrip", pid, port, ckpt_dir) for pid in range(2)]
    try:
        results = [_result(p, timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for pid, result in enumerate(results):
        assert result["committed"] and result["step"] == 7 and result["resharded"]
        assert result["stale_keys"] == [] and result["num_live_keys"] > 0
        assert result["iterator"] == f"iterator of process {pid}"
    index = ckpt_lib.read_index_file(os.path.join(ckpt_dir, "step_00000007"))
    assert index["process_count"] == 2
    leaves = {leaf["path"]: leaf for leaf in index["leaves"]}
    # w is split in 8 row blocks, 4 written by each process; every chunk has a checksum.
    assert sorted(leaves["model/w"]["checksum"]["crc32"]) == [f"{i}.0" for i in range(8)]
    assert sorted(leaves["iterator"]["per_process"]) == ["0", "1"]
    assert ckpt_lib.verify_checkpoint(os.path.join(ckpt_dir, "step_00000007")).ok


@pytest.mark.slow
def test_barrier_timeout_names_missing_process(tmp_path):
    ckpt_dir = str(tmp_path / "ckpt")
    port = _free_port()
    hang = {ckpt_lib.FAULT_ENV: "after_arrays", ckpt_lib.FAULT_ACTION_ENV: "hang"}
    procs = [
        _start("barrier_timeout", 0, port, ckpt_dir),
        _start("barrier_timeout", 1, port, ckpt_dir, extra_env=hang),
    ]
    try:
        result = _result(procs[0], timeout=240)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert result["error"] is not None
    assert "process 1 did not arrive" in result["error"], result["error"]
    assert "timed out after 3.0s" in result["error"]
    assert result["elapsed"] < 3 + 10
    assert not ckpt_lib.is_committed(os.path.join(ckpt_dir, "step_00000007"))


def _save_one_process(ckpt_dir: str, *, with_iterator: bool) -> None:
    """Steps 1 and 2 written by this (one) process, as a 1-process run leaves them."""
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    ckpt = (
        ckpt_lib.Checkpointer.default_config()
        .set(name="ckpt", dir=ckpt_dir, keep_last_n=5)
        .instantiate(parent=None)
    )
    for step in (1, 2):
        state = dict(w=jnp.full((16, 8), float(step)))
        if with_iterator:
            state["iterator"] = b"position of the only process"
        ckpt.save(step=step, state=state)
    ckpt.stop()


def _run_pair(mode: str, ckpt_dir: str) -> list[dict]:
    port = _free_port()
    procs = [_start(mode, pid, port, ckpt_dir) for pid in range(2)]
    try:
        return [_result(p, timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()


@pytest.mark.slow
def test_resuming_a_one_process_checkpoint_with_two_processes_is_not_corrupt(tmp_path):
    """Issue 38: a 1-process checkpoint restored by 2 processes is not called corrupt (with a
    fallback advice that gives the same error): both processes restore it, the process the
    saving run lacked reading process 0's per-process value (its owner, e.g. the input, decides
    whether it can use it)."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save_one_process(ckpt_dir, with_iterator=True)
    for result in _run_pair("resume_1_process", ckpt_dir):
        assert result["error"] is None, result
        assert result["step"] == 2 and result["iterator"] == "position of the only process"
    assert ckpt_lib.verify_checkpoint(os.path.join(ckpt_dir, "step_00000002")).ok
    assert sorted(os.listdir(ckpt_dir)) == ["step_00000001", "step_00000002"]  # Nothing moved.


@pytest.mark.slow
def test_two_process_run_with_fallback_previous_is_not_told_to_pass_it(tmp_path):
    """Issue 38: chunk damage found by a 2-process run that already has
    --restore_fallback=previous names --restore_step instead of asking for the flag it has."""
    ckpt_dir = str(tmp_path / "ckpt")
    _save_one_process(ckpt_dir, with_iterator=False)
    chunk = os.path.join(ckpt_dir, "step_00000002", "gda", "w", "0.0")
    with open(chunk, "r+b") as f:
        data = bytearray(f.read())
        data[0] ^= 1
        f.seek(0)
        f.write(data)
    errors = [r["error"] for r in _run_pair("fallback_chunk_damage", ckpt_dir)]
    assert any(errors), errors
    for error in filter(None, errors):
        assert error.startswith("CorruptCheckpointError: Checkpoint "), error
        assert (
            "--restore_fallback=previous is set, but a multi-process run falls back only" in error
        )
        assert "pass --restore_step=N" in error and "pass --restore_fallback" not in error
    assert sorted(os.listdir(ckpt_dir)) == ["step_00000001", "step_00000002"]  # Nothing moved.
