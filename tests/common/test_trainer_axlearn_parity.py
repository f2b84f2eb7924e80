"""Tests that SpmdTrainer.init (axlearn/common/trainer.py) equals AXLearn's trainer init.

The fixtures (tests/testdata/axlearn_parity/fuji_init_trainer*) were written by AXLearn HEAD
34aed43c's own trainer for `fuji-test-v3`, `init(jax.random.PRNGKey(0))`, threefry PRNG.
"""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

from axlearn.common.input_fake import replace_inputs_with_fake
from axlearn.common.test_utils import prng_impl
from axlearn.common.utils import flatten_items

DATA = pathlib.Path(__file__).parent.parent / "testdata" / "axlearn_parity"


def _trainer(tmp_path):
    from axlearn.experiments.text.gpt import c4_trainer  # pylint: disable=import-outside-toplevel

    cfg = c4_trainer.named_trainer_configs()["fuji-test-v3"]()
    ndim = len(cfg.mesh_axis_names)
    cfg.set(dir=str(tmp_path), mesh_shape=(1,) * ndim, mesh_rules=None)
    cfg = replace_inputs_with_fake(cfg)
    devices = np.array(jax.devices()[:1]).reshape((1,) * ndim)
    return cfg.instantiate(parent=None, devices=devices)


def _load(name: str) -> dict:
    with np.load(DATA / name, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.slow
def test_trainer_init_equals_axlearn(tmp_path):
    with prng_impl("threefry2x32"):
        trainer = _trainer(tmp_path)
        trainer.init(jax.random.PRNGKey(0))
    state = trainer.trainer_state
    pairs = (
        (state.model, "fuji_init_trainer.npz"),
        (state.learner, "fuji_init_trainer_learner.npz"),
    )
    for ours, name in pairs:
        ours, theirs = dict(flatten_items(ours)), _load(name)
        assert sorted(ours) == sorted(theirs), name
        for path, ref in theirs.items():
            np.testing.assert_array_equal(np.asarray(ours[path]), ref, err_msg=path)
    prng = np.load(DATA / "fuji_init_trainer_prng.npy", allow_pickle=False)
    np.testing.assert_array_equal(np.asarray(state.prng_key), prng)


def test_rbg_key_is_threefry_key_twice():
    """Under rbg (what the launcher selects, as AXLearn's), the trainer's key leaf is uint32[4]
    `[a, b, a, b]` where the threefry key is `[a, b]`, through init's split too."""
    with prng_impl("threefry2x32"):
        threefry = np.asarray(jax.random.split(jax.random.PRNGKey(0))[0])
    with prng_impl("rbg"):
        rbg = np.asarray(jax.random.split(jax.random.PRNGKey(0))[0])
    assert rbg.dtype == np.uint32 and rbg.shape == (4,)
    np.testing.assert_array_equal(rbg, np.concatenate([threefry, threefry]))
    np.testing.assert_array_equal(threefry, np.load(DATA / "fuji_init_trainer_prng.npy"))
