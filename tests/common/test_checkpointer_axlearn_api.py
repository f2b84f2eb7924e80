"""AXLearn's checkpointer API extras: Checkpointer.latest_checkpoint_path, restore_from_dir's
validation types, BestMetricPolicy, TensorStoreStateStorage.max_data_shard_degree."""

import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.checkpointer import (
    BestMetricPolicy,
    Checkpointer,
    CheckpointValidationType,
    StateMismatchError,
    TensorStoreStateStorage,
    every_n_steps_policy,
)
from axlearn.common.config import config_for_function
from axlearn.common.metrics import WeightedScalar


def _checkpointer(tmp_path) -> Checkpointer:
    cfg = Checkpointer.default_config().set(
        name="checkpointer",
        dir=str(tmp_path / "ckpt"),
        save_policy=config_for_function(every_n_steps_policy).set(n=1),
        keep_last_n=3,
    )
    return cfg.instantiate(parent=None)


def test_latest_checkpoint_path(tmp_path):
    ckpt = _checkpointer(tmp_path)
    with pytest.raises(ValueError, match="No committed checkpoint under"):
        Checkpointer.latest_checkpoint_path(str(tmp_path / "ckpt"))
    for step in (3, 10):
        ckpt.save(step=step, state={"x": jnp.zeros(2)})
    ckpt.wait_until_finished()
    path = Checkpointer.latest_checkpoint_path(str(tmp_path / "ckpt"))
    assert path.endswith("step_00000010")
    assert [p[-13:] for p in Checkpointer.checkpoint_paths(str(tmp_path / "ckpt"))] == [
        "step_00000003",
        "step_00000010",
    ]


def test_restore_from_dir_validation_types(tmp_path):
    ckpt = _checkpointer(tmp_path)
    saved = {"a": jnp.arange(4, dtype=jnp.float32), "b": jnp.ones((2,), jnp.int32)}
    ckpt.save(step=1, state=saved)
    ckpt.wait_until_finished()
    storage = ckpt.storage
    ckpt_dir = ckpt.ckpt_dir(1)
    subset = {"a": jnp.zeros(4, jnp.float32)}
    with pytest.raises(StateMismatchError, match=r"not in the target state: \['b'\]"):
        storage.restore_from_dir(1, subset, ckpt_dir=ckpt_dir)
    got = storage.restore_from_dir(
        1, subset, ckpt_dir=ckpt_dir, validation=CheckpointValidationType.CONTAINS_STATE
    )
    np.testing.assert_array_equal(got["a"], [0, 1, 2, 3])
    bf16 = {"a": jnp.zeros(4, jnp.bfloat16), "b": jnp.zeros((2,), jnp.int32)}
    with pytest.raises(StateMismatchError, match="bfloat16"):
        storage.restore_from_dir(1, bf16, ckpt_dir=ckpt_dir)
    got = storage.restore_from_dir(
        1, bf16, ckpt_dir=ckpt_dir, validation=CheckpointValidationType.EXACT_UP_TO_DTYPE
    )
    assert got["a"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got["a"], np.float32), [0, 1, 2, 3])
    got = storage.restore_from_dir(
        1,
        {"a": jnp.zeros(4, jnp.bfloat16)},
        ckpt_dir=ckpt_dir,
        validation=CheckpointValidationType.CONTAINS_STATE_UP_TO_DTYPE,
    )
    assert got["a"].dtype == jnp.bfloat16
    # Shapes must still match.
    with pytest.raises(StateMismatchError, match=r"float32\[4\]"):
        storage.restore_from_dir(
            1,
            {"a": jnp.zeros(5, jnp.float32)},
            ckpt_dir=ckpt_dir,
            validation=CheckpointValidationType.CONTAINS_STATE_UP_TO_DTYPE,
        )


def test_best_metric_policy():
    policy = (
        BestMetricPolicy.default_config()
        .set(evaler="eval", metric="loss", mode="min")
        .instantiate()
    )
    assert policy(step=1, evaler_summaries={"eval": {"loss": WeightedScalar(2.0, 1.0)}})
    assert not policy(step=2, evaler_summaries={"eval": None})
    assert not policy(step=3, evaler_summaries={"eval": {"loss": jnp.asarray(2.5)}})
    assert policy(step=4, evaler_summaries={"eval": {"loss": 1.5}})
    with pytest.raises(ValueError, match="other not found in evaler_summaries"):
        BestMetricPolicy.default_config().set(
            evaler="other", metric="loss", mode="max"
        ).instantiate()(step=5, evaler_summaries={"eval": {}})
    with pytest.raises(ValueError, match="acc not found in eval's summaries"):
        BestMetricPolicy.default_config().set(
            evaler="eval", metric="acc", mode="max"
        ).instantiate()(step=5, evaler_summaries={"eval": {"loss": 1.0}})
    with pytest.raises(ValueError, match="mode must be 'max' or 'min'"):
        BestMetricPolicy.default_config().set(evaler="e", metric="m", mode="best").instantiate()


def test_max_data_shard_degree():
    assert TensorStoreStateStorage.default_config().max_data_shard_degree is None
    TensorStoreStateStorage.default_config().set(max_data_shard_degree=1).instantiate()
    with pytest.raises(ValueError, match="max_data_shard_degree: only 1 is supported"):
        TensorStoreStateStorage.default_config().set(max_data_shard_degree=-1).instantiate()


def test_shard_threshold_bytes_accepted_and_validated():
    cfg = TensorStoreStateStorage.default_config()
    assert cfg.shard_threshold_bytes is None
    assert "shard_threshold_bytes" not in cfg.debug_string()  # None: not in dumps.
    cfg.set(max_data_shard_degree=1, shard_threshold_bytes=1024**3).instantiate()
    with pytest.raises(ValueError, match="shard_threshold_bytes must be None or >= 0, got -1"):
        TensorStoreStateStorage.default_config().set(shard_threshold_bytes=-1).instantiate()
