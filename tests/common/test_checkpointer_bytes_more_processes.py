"""A bytes leaf saved by fewer processes than restore it: the extra processes read process 0's
value (an elastic restart; e.g. a Grain input resumes from its global position)."""

from unittest import mock

import jax.numpy as jnp
import pytest

from axlearn.common.checkpointer import (
    CheckpointCorruptionError,
    Checkpointer,
    every_n_steps_policy,
    read_index_file,
    tensorstore_restore,
)
from axlearn.common.checkpointer.storage import TensorStoreStateStorage
from axlearn.common.checkpointer.tensorstore_restore import _Reader
from axlearn.common.config import config_for_function


def _checkpointer(tmp_path) -> Checkpointer:
    return (
        Checkpointer.default_config()
        .set(
            name="checkpointer",
            dir=str(tmp_path / "ckpt"),
            save_policy=config_for_function(every_n_steps_policy).set(n=1),
            storage=TensorStoreStateStorage.default_config(),
        )
        .instantiate(parent=None)
    )


def test_process_without_a_value_reads_process_0s(tmp_path):
    ckpt = _checkpointer(tmp_path)
    ckpt.save(step=1, state={"x": jnp.ones(3), "input_iter": b"state of process 0"})
    ckpt.wait_until_finished()
    step_dir = ckpt.ckpt_dir(1)
    (entry,) = [x for x in read_index_file(step_dir)["leaves"] if x["path"] == "input_iter"]
    reader = _Reader(step_dir, timeout_s=10.0)
    assert reader.read_bytes_leaf("input_iter", entry) == b"state of process 0"
    # Process 1 of a restart on 2 processes: the run that saved had only process 0.
    with mock.patch.object(tensorstore_restore.jax, "process_index", return_value=1):
        assert reader.read_bytes_leaf("input_iter", entry) == b"state of process 0"
    ckpt.stop()


def test_a_missing_value_among_saved_processes_is_still_corruption(tmp_path):
    reader = _Reader(str(tmp_path), timeout_s=1.0)
    entry = {"per_process": {"0": {"file": "a", "size": 1, "checksum": "0"}, "2": {}}}
    with mock.patch.object(tensorstore_restore.jax, "process_index", return_value=1):
        with pytest.raises(CheckpointCorruptionError, match="no value for process 1"):
            reader.read_bytes_leaf("input_iter", entry)
