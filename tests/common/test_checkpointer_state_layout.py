"""Checkpoints written before the optimizer state layout change (EmaState.scale,
SkipClipState.grad_norm_square_ema) restore where their leaves still match, and otherwise fail
with a message saying they predate the change (axlearn/common/checkpointer/tensorstore_restore.py).
"""

import jax
import numpy as np
import pytest

from axlearn.common import optimizers
from axlearn.common.checkpointer import (
    Checkpointer,
    StateMismatchError,
    TensorStoreStateStorage,
    every_n_steps_policy,
    layout,
)
from axlearn.common.config import config_for_function
from axlearn.common.optimizer_base import OptParam
from tests.common.checkpointer_test_utils import edit_our_index


def _checkpointer(tmp_path) -> Checkpointer:
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=str(tmp_path / "ckpt"),
        save_policy=config_for_function(every_n_steps_policy).set(n=1),
        storage=TensorStoreStateStorage.default_config(),
    )
    return cfg.instantiate(parent=None)


def _make_old(tmp_path, state, step=1):
    """Saves `state` and rewrites its index as a pre-change checkpoint (no state_layout)."""
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=step, state=state)
    ckpt.wait_until_finished()

    def make_old(index):
        assert index["state_layout"] == layout.STATE_LAYOUT_VERSION
        del index["state_layout"]

    edit_our_index(str(tmp_path / "ckpt" / layout.step_dir_name(step)), make_old)
    return ckpt


def _skip_clip_state():
    tx = optimizers.skip_and_clip_by_global_norm(
        inner=optimizers.sgd_optimizer(0.1, decouple_weight_decay=True),
        drop_norm=config_for_function(optimizers.drop_norm_by_grad_norm_ema),
        grad_norm_ema_decay=0.99,
    )
    return tx.init({"w": OptParam(np.zeros((2,), np.float32), None, None)})


def test_pre_change_checkpoint_with_old_fields_names_the_layout_change(tmp_path):
    new_state = _skip_clip_state()
    # The old layout: the same state with grad_norm_var_ema instead of grad_norm_square_ema.
    old = new_state._asdict()
    old["grad_norm_var_ema"] = old.pop("grad_norm_square_ema")
    ckpt = _make_old(tmp_path, {"opt": old})
    with pytest.raises(StateMismatchError, match="predates the state layout change") as e:
        ckpt.restore(state={"opt": new_state})
    assert "grad_norm_square_ema" in str(e.value)


def test_pre_change_checkpoint_whose_leaves_match_restores(tmp_path):
    state = {"w": jax.numpy.arange(4.0), "count": jax.numpy.asarray(3)}
    ckpt = _make_old(tmp_path, state)
    step, restored = ckpt.restore(state=state)
    assert step == 1
    np.testing.assert_array_equal(restored["w"], np.arange(4.0))


def test_current_checkpoint_mismatch_has_no_layout_hint(tmp_path):
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=1, state={"a": jax.numpy.zeros((2,))})
    ckpt.wait_until_finished()
    with pytest.raises(StateMismatchError) as e:
        ckpt.restore(state={"b": jax.numpy.zeros((2,))})
    assert "predates" not in str(e.value)
