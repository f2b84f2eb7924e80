"""Shared helpers for the input tests: a per-session cache of the embedded data, small configs."""

from __future__ import annotations

import os

import pytest

from axlearn.common import input_tf_data
from axlearn.common.config import config_for_function
from axlearn.experiments.text.common import embedded_vocab_config
from axlearn.experiments.text.gpt.common import tfds_input


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory):
    """Points AXLEARN_CACHE_DIR at a per-session directory and builds the embedded data there."""
    cache = str(tmp_path_factory.getbasetemp() / "axlearn_cache")
    old = os.environ.get("AXLEARN_CACHE_DIR")
    os.environ["AXLEARN_CACHE_DIR"] = cache
    from axlearn.common import embedded_data  # pylint: disable=import-outside-toplevel

    embedded_data.prepare()
    yield cache
    if old is None:
        os.environ.pop("AXLEARN_CACHE_DIR", None)
    else:
        os.environ["AXLEARN_CACHE_DIR"] = old


def lm_input_config(
    *,
    is_training: bool = True,
    split: str = "train",
    max_len: int = 16,
    batch_size: int = 4,
    packing: bool = False,
    shuffle: int = 64,
    **input_kwargs,
) -> input_tf_data.Input.Config:
    """An Input config reading the embedded data through `tfds_input`."""
    source = config_for_function(tfds_input).set(
        is_training=is_training,
        dataset_name="python_docs:1.0.0",
        split=split,
        vocab_cfg=embedded_vocab_config(),
        max_sequence_length=max_len,
        replace_newlines_with="<n>",
        train_shuffle_buffer_size=shuffle,
        packing=packing,
    )
    return input_tf_data.Input.default_config().set(
        name="input",
        is_training=is_training,
        source=source,
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=batch_size,
            pad_example_fn=input_tf_data.default_pad_example_fn,
        ),
        **input_kwargs,
    )


def take(it, n: int) -> list:
    """The next `n` batches of `it`."""
    return [next(it) for _ in range(n)]


def assert_batches_equal(a: list, b: list):
    """Asserts two lists of batches are identical, key by key."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), i
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"batch {i} key {k}")
