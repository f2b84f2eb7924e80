"""Tests axlearn/common/checkpointer/tf_iterators.py: tf.data iterators as checkpoint state."""

import io
import tarfile

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from axlearn.common.checkpointer import Checkpointer, tf_iterators


def _pipeline():
    return tf.data.Dataset.range(100).shuffle(10, seed=3).batch(4)


def test_checkpointer_saves_and_restores_tf_iterator(tmp_path):
    ckptr = (
        Checkpointer.default_config().set(name="ckptr", dir=str(tmp_path)).instantiate(parent=None)
    )
    it = iter(_pipeline())
    for _ in range(3):
        next(it)
    state = {"iterator": it, "w": jnp.arange(4.0)}
    ckptr.save(step=7, state=state)
    ckptr.wait_until_finished()
    expected = [next(it).numpy() for _ in range(3)]  # What follows the saved position.

    fresh = iter(_pipeline())
    step, restored = ckptr.restore(state={"iterator": fresh, "w": jnp.zeros(4)})
    assert step == 7
    assert restored["iterator"] is fresh
    np.testing.assert_array_equal(restored["w"], np.arange(4.0))
    for want in expected:
        np.testing.assert_array_equal(next(fresh).numpy(), want)


def test_serialize_round_trip_and_bad_bytes():
    it = iter(tf.data.Dataset.range(5))
    next(it)
    data = tf_iterators.serialize(it)
    other = tf_iterators.restore(iter(tf.data.Dataset.range(5)), data)
    assert int(next(other)) == 1
    with pytest.raises(ValueError, match="not a tf.data iterator checkpoint"):
        tf_iterators.restore(iter(tf.data.Dataset.range(5)), b"not a tar")
    # An archive with a path outside the folder is refused.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../evil")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="unexpected archive member"):
        tf_iterators.restore(iter(tf.data.Dataset.range(5)), buffer.getvalue())


def test_non_iterator_state_unchanged():
    state = {"a": np.ones(2), "b": b"x", "c": 3}
    assert tf_iterators.to_saved_state(state) is not state
    assert tf_iterators.to_saved_state(state)["b"] == b"x"
    assert tf_iterators.restore_iterators(state, state) is state
