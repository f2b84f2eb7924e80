"""Two real processes (jax.distributed on 127.0.0.1) read their slices of the global batch."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.common.input_mp_worker import input_config

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_union_is_global_batch(tmp_path):
    coordinator = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, XLA_FLAGS="", TF_CPP_MIN_LOG_LEVEL="3")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.common.input_mp_worker",
                coordinator,
                str(i),
                str(tmp_path),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out.decode()[-3000:]
    parts = [np.load(tmp_path / f"process_{i}.npz") for i in range(2)]
    # One process with the same number of feeds (2) reads the same global batches.
    train = iter(input_config(is_training=True, n=100).set(num_feeds=2).instantiate(parent=None))
    for step in range(4):
        np.testing.assert_array_equal(
            next(train)["x"], np.concatenate([parts[0]["train"][step], parts[1]["train"][step]])
        )
    # Evaluation: both processes padded to the same number of batches (all-gathered), and every
    # example appears once.
    assert parts[0]["eval"].shape == parts[1]["eval"].shape == (3, 2)
    xs = np.concatenate([parts[0]["eval"].reshape(-1), parts[1]["eval"].reshape(-1)])
    assert sorted(xs[xs > 0].tolist()) == list(range(1, 9))
    # Example 0 plus padding: one row on process 0 (5 -> 6), two on process 1 (4 -> 6).
    assert np.count_nonzero(xs == 0) == 4
