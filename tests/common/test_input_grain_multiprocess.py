"""Elastic resume of a Grain input across real processes (jax.distributed on 127.0.0.1).

A run of N processes reads 3 global batches and saves; a run of M != N processes restores from
process 0's saved state and reads on to the end of the epoch: together they read every example
of the epoch exactly once (the rule of `axlearn.common.input_grain`'s module docstring).
"""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.common.input_grain_mp_worker import EPOCH

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(out_dir, num_processes: int, num_batches: int, state_file=None) -> list[dict]:
    os.makedirs(out_dir, exist_ok=True)
    coordinator = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, XLA_FLAGS="", TF_CPP_MIN_LOG_LEVEL="3")
    args = [str(out_dir), str(num_batches)] + ([str(state_file)] if state_file else [])
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.common.input_grain_mp_worker", coordinator]
            + [str(num_processes), str(i)]
            + args,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(num_processes)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out.decode()[-3000:]
    results = []
    for i in range(num_processes):
        with open(os.path.join(out_dir, f"process_{i}.json"), encoding="utf-8") as f:
            results.append(json.load(f))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("old,new", [(2, 1), (1, 2)])
def test_elastic_resume_reads_each_example_once(tmp_path, old, new):
    saved = _run(tmp_path / "saved", old, num_batches=3)
    state_file = tmp_path / "state_0.json"
    state_file.write_text(saved[0]["state"], encoding="utf-8")
    assert json.loads(saved[0]["state"])["num_shards"] == old
    # 3 global batches of 4 = 12 examples read; the resumed run reads the other 28.
    resumed = _run(tmp_path / "resumed", new, num_batches=7, state_file=state_file)
    before = [x for r in saved for x in r["seen"]]
    after = [x for r in resumed for x in r["seen"]]
    assert len(before) == 12 and len(after) == 28
    assert sorted(before + after) == list(range(EPOCH))  # Nothing lost, nothing repeated.
    assert json.loads(resumed[0]["state"])["num_batches"] == 10
