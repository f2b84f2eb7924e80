"""Tests for `axlearn eval` and `axlearn generate` (axlearn/cli/inference_commands.py).

A module-scoped fixture trains `tests.common.trainer_mp_experiment:gpt-tiny-eval` (1 layer of dim
64, 6 steps on the embedded corpus, an eval and a checkpoint at step 6) with launch_trainer_main;
the commands then run on its trainer dir as subprocesses, as a user runs them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.cli.conftest import axlearn


def _tb_scalars(path: str) -> dict[str, dict[int, float]]:
    # pylint: disable-next=import-outside-toplevel
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            value = tf.make_ndarray(event.tensor_proto)
            if value.dtype.kind in "fiu" and value.ndim == 0:
                out.setdefault(tag, {})[event.step] = float(value)
    return out


@pytest.mark.slow
def test_eval_reproduces_the_runs_validation_metrics_on_another_mesh(trained_dir):
    trained = _tb_scalars(os.path.join(trained_dir, "summaries", "validation"))
    assert 6 in trained["loss"]
    # Two devices (the run had one): the checkpoint is resharded; the numbers must not move.
    proc = axlearn("eval", f"--trainer_dir={trained_dir}", devices=2)
    assert "Evaluating step 6 of" in proc.stdout
    printed = {}
    for line in proc.stdout.splitlines():
        if line.startswith("validation/"):
            key, value = line.split()
            printed[key.split("/", 1)[1]] = float(value)
    evaluated = _tb_scalars(os.path.join(trained_dir, "summaries", "eval_only", "validation"))
    metrics = ["loss", "accuracy", "perplexity", "bits_per_byte", "num_targets"]
    for name in metrics:
        expected = trained[name][6]
        np.testing.assert_allclose(printed[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(evaluated[name][6], expected, rtol=1e-5, atol=1e-5)
    # Nothing was trained: the checkpoints and metrics.jsonl are as the run left them.
    assert sorted(os.listdir(os.path.join(trained_dir, "checkpoints"))) == ["step_00000006"]


def test_eval_errors_name_the_problem(trained_dir, tmp_path):
    proc = axlearn("eval", f"--trainer_dir={tmp_path}", check=False)
    assert proc.returncode == 1
    assert "launch_trainer_flags does not exist" in proc.stderr
    proc = axlearn("eval", f"--trainer_dir={trained_dir}", "--evaler=valid", check=False)
    assert proc.returncode == 1 and "Unknown evaler(s) ['valid']" in proc.stderr
    proc = axlearn("eval", f"--trainer_dir={trained_dir}", "--step=3", check=False)
    assert proc.returncode == 1 and "Cannot restore step 3" in proc.stderr
