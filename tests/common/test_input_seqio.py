"""Tests axlearn/common/input_seqio.py: a seqio Task and Mixture as Input sources."""

from __future__ import annotations

import numpy as np
import pytest

from axlearn.common import embedded_data, input_tf_data
from axlearn.common.config import config_for_function
from axlearn.common.input_seqio import seqio_source
from tests.common import input_test_utils

# The session fixture that builds the embedded data in a temporary cache dir.
embedded_cache = input_test_utils.embedded_cache


@pytest.fixture(scope="module")
def tasks(embedded_cache):
    import seqio

    from axlearn.common import embedded_data_builder  # noqa: F401  (registers the builder)

    vocab = seqio.SentencePieceVocabulary(embedded_data.vocab_path())
    source = seqio.TfdsDataSource(
        tfds_name=embedded_data.DATASET_NAME, tfds_data_dir=embedded_data.tfds_data_dir()
    )
    features = {"text": seqio.Feature(vocab, add_eos=True)}
    for name in ("axlearn_test_docs_a", "axlearn_test_docs_b"):
        if name not in seqio.TaskRegistry.names():
            seqio.TaskRegistry.add(
                name,
                source=source,
                preprocessors=[seqio.preprocessors.tokenize],
                output_features=features,
            )
    if "axlearn_test_docs_mix" not in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.add(
            "axlearn_test_docs_mix", [("axlearn_test_docs_a", 3.0), ("axlearn_test_docs_b", 1.0)]
        )
    return vocab


def _input(name: str, *, is_training: bool, num_feeds=None):
    def ids_only():
        import tensorflow as tf

        # The first token of each document, with a static shape (padding needs one).
        return lambda ds: ds.map(lambda ex: {"n": tf.reshape(ex["text"][0], [1])})

    return input_tf_data.Input.default_config().set(
        name="input",
        is_training=is_training,
        num_feeds=num_feeds,
        source=config_for_function(seqio_source).set(
            mixture_or_task_name=name, split="validation", is_training=is_training
        ),
        processor=config_for_function(ids_only),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=4, pad_example_fn=input_tf_data.default_pad_example_fn
        ),
    )


def test_task_feeds_cover_the_split_once(tasks):
    del tasks
    cfg = _input("axlearn_test_docs_a", is_training=False, num_feeds=2)
    batches = list(iter(cfg.instantiate(parent=None)))
    first = np.concatenate([b["n"][:, 0] for b in batches])
    # 67 documents: 34 and 33 per feed, 2 per feed per batch: 17 batches, one padding row.
    assert np.count_nonzero(first) == 67
    assert len(batches) == 17


def test_mixture_is_deterministic(tasks):
    del tasks
    cfg = _input("axlearn_test_docs_mix", is_training=True)
    a = [next(it)["n"] for it in [iter(cfg.instantiate(parent=None))] for _ in range(5)]
    b = [next(it)["n"] for it in [iter(cfg.instantiate(parent=None))] for _ in range(5)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
