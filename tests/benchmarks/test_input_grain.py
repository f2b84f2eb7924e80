"""benchmarks/input_grain.py: one Grain trial measures batches/s and a sub-millisecond position."""

import os
import sys

import pytest

from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import input_grain as bench  # noqa: E402  pylint: disable=wrong-import-position


@pytest.mark.slow
def test_grain_trial(tmp_path, monkeypatch):
    monkeypatch.setenv("AXLEARN_CACHE_DIR", str(tmp_path))  # The ArrayRecord copy goes here.
    out = bench._trial("grain", batches=5, saves=3)  # pylint: disable=protected-access
    assert out["batches_per_s"] > 0 and out["first_batch_s"] > 0
    assert out["position_save_ms"] < 50  # Grain's JSON state: well under tf.data's ~100 ms.
    assert 0 < out["state_bytes"] < 4096


def test_input_configs_are_the_main_jobs():
    tf_cfg = bench._input_config("tf_data")  # pylint: disable=protected-access
    grain_cfg = bench._input_config("grain_2_workers")  # pylint: disable=protected-access
    assert tf_cfg.batcher.global_batch_size == grain_cfg.source.global_batch_size == 16
    assert grain_cfg.source.max_sequence_length == 128 and grain_cfg.source.num_workers == 2
