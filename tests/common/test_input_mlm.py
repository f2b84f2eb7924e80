"""Tests axlearn/common/input_mlm.py: masking statistics against a NumPy counting reference."""

from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf

from axlearn.common.config import config_for_class, config_for_function
from axlearn.common.input_mlm import (
    MLMAction,
    apply_mlm_mask,
    apply_mlm_mask_combinatorial_ngram,
    iid_mlm_actions,
    roberta_mlm_actions,
    roberta_mlm_actions_combinatorial_ngram,
    text_to_mlm_input,
)
from axlearn.common.input_test_utils import make_ds_fn, python_docs_sentence_piece_vocab_file
from axlearn.common.input_text import roberta_normalize

VOCAB_CFG = config_for_class(seqio.SentencePieceVocabulary).set(
    sentencepiece_model_file=python_docs_sentence_piece_vocab_file, extra_ids=1
)


@pytest.fixture(name="vocab", scope="module")
def fixture_vocab():
    return VOCAB_CFG.instantiate()


def _mask(vocab, inputs, *, seed=0, **kwargs):
    tf.random.set_seed(seed)
    kwargs.setdefault("actions_cfg", config_for_function(iid_mlm_actions))
    fn = apply_mlm_mask(
        ignore_input_ids=[vocab.pad_id],
        ignore_target_id=0,
        mask_id=vocab.vocab_size - 1,
        vocab_cfg=VOCAB_CFG,
        **kwargs,
    )
    ds = tf.data.Dataset.from_tensors({"input_ids": tf.constant(inputs, tf.int32)})
    ex = next(iter(fn(ds)))
    return ex["input_ids"].numpy(), ex["target_labels"].numpy()


def _count(original, inputs, targets, mask_id):
    """The counting reference: each position's action read back from the output."""
    predicted = targets != 0
    assert (targets[predicted] == original[predicted]).all()
    assert (inputs[~predicted] == original[~predicted]).all()
    masked = predicted & (inputs == mask_id)
    kept = predicted & (inputs == original)
    swapped = predicted & ~masked & ~kept
    return {"select": predicted.mean(), "mask": masked.mean(), "swap": swapped.mean(),
            "keep": kept.mean(), "n_selected": predicted.sum(), "n_mask": masked.sum(),
            "n_swap": swapped.sum(), "n_keep": kept.sum()}  # fmt: skip


@pytest.mark.parametrize("actions_fn", [iid_mlm_actions, roberta_mlm_actions])
def test_masking_rates_within_one_percent_over_10k_tokens(vocab, actions_fn):
    rng = np.random.default_rng(0)
    original = rng.integers(3, 4000, size=10_000).astype(np.int32)
    inputs, targets = _mask(vocab, original, actions_cfg=config_for_function(actions_fn))
    got = _count(original, inputs, targets, vocab.vocab_size - 1)
    for key, rate in {"select": 0.15, "mask": 0.12, "swap": 0.015, "keep": 0.015}.items():
        assert abs(got[key] - rate) < 0.01, (key, got[key])
    if actions_fn is roberta_mlm_actions:
        # Exactly floor(0.15 * (n + 1) + u) words are selected (the dummy leading token counts).
        assert got["n_selected"] in (1500, 1501, 1499)


def test_replacement_split_80_10_10(vocab):
    rng = np.random.default_rng(1)
    original = rng.integers(3, 4000, size=60_000).astype(np.int32)
    inputs, targets = _mask(vocab, original, seed=3)
    got = _count(original, inputs, targets, vocab.vocab_size - 1)
    n = got["n_selected"]
    assert abs(got["n_mask"] / n - 0.8) < 0.02
    assert abs(got["n_swap"] / n - 0.1) < 0.02
    assert abs(got["n_keep"] / n - 0.1) < 0.02
    swapped = (targets != 0) & (inputs != original) & (inputs != vocab.vocab_size - 1)
    assert inputs[swapped].min() >= 0 and inputs[swapped].max() < vocab.vocab_size


def test_padding_is_never_acted_on_and_translation_style(vocab):
    original = np.array([5, 6, 7, 0, 0], np.int32)
    cfg = config_for_function(iid_mlm_actions).set(
        select_token_prob=1.0, mask_selected_prob=1.0, swap_selected_prob=0.0
    )
    inputs, targets = _mask(vocab, original, actions_cfg=cfg)
    assert inputs.tolist() == [4096, 4096, 4096, 0, 0]
    assert targets.tolist() == [5, 6, 7, 0, 0]
    cfg = config_for_function(iid_mlm_actions).set(select_token_prob=0.0)
    inputs, targets = _mask(vocab, original, actions_cfg=cfg, is_translation_style=True)
    assert inputs.tolist() == original.tolist() and targets.tolist() == original.tolist()


def test_whole_word_mask_acts_on_whole_words(vocab):
    original = np.array(vocab.encode("preprocessing the configuration of modules " * 40), np.int32)
    cfg = config_for_function(iid_mlm_actions).set(
        select_token_prob=0.5, mask_selected_prob=1.0, swap_selected_prob=0.0
    )
    inputs, _ = _mask(vocab, original, actions_cfg=cfg, whole_word_mask=True)
    pieces = [vocab.tokenizer.id_to_piece(int(i)) for i in original]
    word = np.cumsum([p.startswith("▁") for p in pieces])
    masked = inputs == vocab.vocab_size - 1
    for w in np.unique(word):
        assert len(set(masked[word == w].tolist())) == 1  # All or none of a word's pieces.
    assert 0.3 < masked.mean() < 0.7


def test_mask_id_validation(vocab):
    kwargs = dict(ignore_input_ids=[0], ignore_target_id=0, vocab_cfg=VOCAB_CFG)
    with pytest.raises(ValueError, match="different from unk"):
        apply_mlm_mask(mask_id=vocab.unk_id, **kwargs)
    with pytest.raises(ValueError, match="should not be ignored"):
        apply_mlm_mask(mask_id=0, **kwargs)
    with pytest.raises(ValueError, match="start-of-word"):
        apply_mlm_mask(mask_id=vocab.encode("preprocessing")[1], **kwargs)
    with pytest.raises(ValueError, match="select_token_prob"):
        iid_mlm_actions(select_token_prob=2)
    with pytest.raises(ValueError, match=r"mask_selected_prob \+ swap_selected_prob <= 1"):
        roberta_mlm_actions(mask_selected_prob=0.6, swap_selected_prob=0.6)


def test_combinatorial_ngram(vocab):
    actions = roberta_mlm_actions_combinatorial_ngram(n=2)(5).numpy()
    want = np.zeros([4, 5], np.int32)
    for i in range(4):
        want[i, i : i + 2] = MLMAction.MASK.value
    np.testing.assert_array_equal(actions, want)
    fn = apply_mlm_mask_combinatorial_ngram(
        ignore_input_ids=[0], ignore_target_id=0, mask_id=4096, vocab_cfg=VOCAB_CFG, n=1
    )
    ds = tf.data.Dataset.from_tensors({"input_ids": tf.constant([5, 6, 0])})
    out = list(fn(ds))
    assert [ex["input_ids"].numpy().tolist() for ex in out] == [
        [4096, 6, 0],
        [5, 4096, 0],
        [5, 6, 0],
    ]
    assert [ex["target_labels"].numpy().tolist() for ex in out] == [[5, 0, 0], [0, 6, 0], [0, 0, 0]]


def test_text_to_mlm_input_packs_documents(vocab):
    texts = ["short", "", "not short", ""]
    fn = text_to_mlm_input(
        is_training=False,
        sentence_piece_vocab=VOCAB_CFG,
        normalization=config_for_function(roberta_normalize),
        max_len=16,
        apply_mlm_mask=config_for_function(apply_mlm_mask).set(
            actions_cfg=config_for_function(iid_mlm_actions).set(select_token_prob=0.0)
        ),
        shuffle_buffer_size=0,
        mask_token="▁<extra_id_0>",
    )
    ex = next(iter(fn(make_ds_fn(False, texts, repeat=1)())))
    eos = vocab.eos_id
    body = [*vocab.encode("short"), eos, eos, *vocab.encode("not short"), eos, eos]
    want = [eos, *body] + [0] * (16 - 1 - len(body))  # BOS is EOS here (no BOS piece).
    assert ex["input_ids"].numpy().tolist() == want
    assert ex["target_labels"].numpy().tolist() == [0] * 16
