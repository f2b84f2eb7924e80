"""Tests axlearn/experiments/text/gpt/common.py `tfds_input`."""

from __future__ import annotations

import numpy as np
import pytest

from axlearn.common.config import config_for_function
from axlearn.experiments.text.common import embedded_vocab_config
from axlearn.experiments.text.gpt.common import tfds_input
from tests.common import input_test_utils

# The session fixture that builds the embedded data in a temporary cache dir.
embedded_cache = input_test_utils.embedded_cache


def _source(is_training: bool, **kwargs):
    return config_for_function(tfds_input).set(
        is_training=is_training,
        dataset_name="python_docs:1.0.0",
        vocab_cfg=embedded_vocab_config(),
        max_sequence_length=16,
        replace_newlines_with="<n>",
        **kwargs,
    )


def test_eval_windows_overlap_by_three_quarters(embedded_cache):
    del embedded_cache
    ds = _source(False, split="validation[:1]").instantiate()()
    windows = list(ds.as_numpy_iterator())
    assert len(windows) > 2
    # Stride max_sequence_length // 4 = 4: each window starts 4 tokens after the previous one,
    # and scores only its last 4 targets (the first scores all 16).
    np.testing.assert_array_equal(windows[1]["input_ids"][:12], windows[0]["input_ids"][4:])
    assert np.count_nonzero(windows[0]["target_labels"]) == 16
    assert np.count_nonzero(windows[1]["target_labels"][:12]) == 0


def test_training_pieces_and_packing(embedded_cache):
    del embedded_cache
    plain = next(iter(_source(True, split="train", train_shuffle_buffer_size=8).instantiate()()))
    assert set(plain) == {"input_ids", "target_labels", "target_num_bytes"}
    packed = next(
        iter(
            _source(True, split="train", train_shuffle_buffer_size=8, packing=True).instantiate()()
        )
    )
    assert {"input_segment_ids", "input_positions"} <= set(packed)
    assert packed["input_ids"].shape == (16,)


def test_mixture_train_input_source_samples_by_weight(monkeypatch):
    """Two components weighted 3:1: about 3/4 of the examples come from the first (each
    component's TFDS reader replaced by a source repeating one word)."""
    import tensorflow as tf

    from axlearn.common import input_tf_data
    from axlearn.common.input_lm import lm_text_preprocessor
    from axlearn.experiments.text.common import DataMixtureComponent
    from axlearn.experiments.text.gpt.common import mixture_train_input_source

    def fake_tfds(dataset_name, *, split, is_training, train_shuffle_buffer_size, read_config):
        del split, is_training, read_config
        assert train_shuffle_buffer_size == 64 * 2  # 64 x the component's shuffle buffer.
        return lambda: tf.data.Dataset.from_tensors({"text": dataset_name}).repeat(2000)

    monkeypatch.setattr(input_tf_data, "tfds_dataset", fake_tfds)
    components = [
        DataMixtureComponent(name="apple", weight=3.0, shuffle_buffer_size=2),
        DataMixtureComponent(name="zebra", weight=1.0, shuffle_buffer_size=2),
    ]
    preprocessor = config_for_function(lm_text_preprocessor).set(shuffle_buffer_size=0)
    vocab = embedded_vocab_config().instantiate()
    apple = set(vocab.encode("apple"))
    source = mixture_train_input_source(
        is_training=True,
        vocab_cfg=embedded_vocab_config(),
        preprocessor=preprocessor,
        data_mixture_components=components,
        max_sequence_length=4,
    )
    examples = list(source().take(800).as_numpy_iterator())
    from_apple = [bool(set(ex["target_labels"].tolist()) & apple) for ex in examples]
    assert abs(np.mean(from_apple) - 0.75) < 0.06
    with pytest.raises(ValueError, match="1 preprocessors for 2 data_mixture_components"):
        mixture_train_input_source(
            is_training=True,
            vocab_cfg=embedded_vocab_config(),
            preprocessor=[preprocessor],
            data_mixture_components=components,
            max_sequence_length=4,
        )


def test_adastar_learner_config_updates_like_adafactor_by_hand():
    """One step of adastar_learner_config on a 2-vector vs the update computed by hand."""
    import jax
    import jax.numpy as jnp

    from axlearn.common.learner import Learner
    from axlearn.common.optimizer_base import OptParam
    from axlearn.experiments.text.gpt.common import adastar_learner_config

    cfg = adastar_learner_config(peak_lr=0.1, max_step=10, lr_warmup_steps=0, weight_decay=0.0)
    optimizer = cfg.optimizer.instantiate()
    params = {
        "w": OptParam(value=jnp.array([1.0, -2.0]), factorization_spec=None, weight_decay_scale=1.0)
    }
    state = optimizer.init(params)
    grads = {"w": jnp.array([0.5, -0.25])}
    updates, _ = optimizer.update(grads, state, params)
    # Step 1: v = g**2 + 1e-30 (debiased: (1-b2) v / (1-b2)); raw = g / sqrt(v) = sign(g);
    # block RMS of raw is 1 (no clipping); u = (1 - b1) * raw, not debiased; schedule at step 1
    # of a 10-step cosine to alpha=0.005 is alpha + (1 - alpha) * (1 + cos(pi / 10)) / 2
    # (schedule steps count from 1) -> update = -0.1 * 0.05 * schedule * sign(g).
    scale = 0.005 + 0.995 * (1 + np.cos(np.pi / 10)) / 2
    expected = -0.1 * 0.05 * scale * np.sign([0.5, -0.25])
    np.testing.assert_allclose(updates["w"], expected, rtol=1e-5)
    assert isinstance(cfg, Learner.Config)
    del jax
