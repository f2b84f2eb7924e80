"""Tests checkpointer.base helpers (structure checks, TF savables, filters) and EvalMetric."""

import concurrent.futures
import os

import pytest
import tensorflow as tf

from axlearn.common.checkpointer import (
    BaseCheckpointer,
    BestMetricPolicy,
    Checkpointer,
    CheckpointValidationType,
    EvalMetric,
    PythonSavable,
    async_save_tf_savables,
    check_state_structure,
    drop_learner_optimizer_cfg,
    restore_tf_savables,
)

V = CheckpointValidationType


def test_check_state_structure_modes():
    ckpt = [("step", 3), ("w", {"dtype": "float32", "shape": "(2,)"}), ("extra", 1)]
    target = [("step", 3), ("w", {"dtype": "bfloat16", "shape": "(2,)"})]
    check_state_structure(ckpt, ckpt)
    check_state_structure(ckpt, target, validation=V.CONTAINS_STATE_UP_TO_DTYPE)
    with pytest.raises(ValueError, match="extra=1"):
        check_state_structure(ckpt, target, validation=V.EXACT_UP_TO_DTYPE)
    with pytest.raises(ValueError, match="'bfloat16'"):
        check_state_structure(ckpt, target, validation=V.CONTAINS_STATE)
    # Empty subtrees do not count.
    check_state_structure([("a", 1)], [("a", 1), ("b", {})])


def test_tf_savables_round_trip(tmp_path):
    executor = concurrent.futures.ThreadPoolExecutor(1)
    ckpt_dir = str(tmp_path / "tf")
    async_save_tf_savables({}, executor=executor, dir=ckpt_dir).result()
    assert not os.path.exists(ckpt_dir)
    ds = tf.data.Dataset.range(10)
    it = iter(ds)
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    future = async_save_tf_savables({"it": it}, executor=executor, dir=ckpt_dir)
    next(it)  # Advancing after the call does not change what is saved.
    future.result()
    fresh = iter(ds)
    restore_tf_savables({"it": fresh}, dir=ckpt_dir)
    assert int(next(fresh)) == 3


def test_python_savable_protocol():
    class Savable:
        def get_state(self):
            return {}

        def set_state(self, state):
            del state

    assert isinstance(Savable(), PythonSavable)
    assert not isinstance(object(), PythonSavable)


def test_drop_learner_optimizer_filter():
    keep = drop_learner_optimizer_cfg().instantiate()
    assert not keep("learner/optimizer/0/mu/w")
    assert keep("learner/ema/w") and keep("model/w")


def test_best_metric_policy_with_eval_metric():
    policy = (
        BestMetricPolicy.default_config()
        .set(metric=EvalMetric(evaler_name="ev", metric_name="acc"), mode="max")
        .instantiate()
    )
    assert policy(step=1, evaler_summaries={"ev": {"acc": 0.5}})
    assert not policy(step=2, evaler_summaries={"ev": {"acc": 0.4}})
    assert policy(step=3, evaler_summaries={"ev": {"acc": 0.6}})
    with pytest.raises(ValueError, match="needs evaler="):
        BestMetricPolicy.default_config().set(metric="acc", mode="max").instantiate()


def test_checkpointer_is_a_base_checkpointer():
    assert issubclass(Checkpointer, BaseCheckpointer)


def test_max_concurrent_restore_gb():
    from axlearn.common.checkpointer import TensorStoreStateStorage

    with pytest.raises(ValueError, match="strictly positive"):
        TensorStoreStateStorage.default_config().set(max_concurrent_restore_gb=-2).instantiate()
    storage = (
        TensorStoreStateStorage.default_config()
        .set(max_concurrent_gb=4, max_concurrent_restore_gb=0.5)
        .instantiate()
    )
    assert storage._read_budget_bytes == int(0.5e9)  # The restore bound wins over the save one.
    storage.close()
    storage = TensorStoreStateStorage.default_config().set(max_concurrent_gb=2).instantiate()
    assert storage._read_budget_bytes == int(2e9)
    storage.close()
