"""Tests axlearn/common/input_glue.py against hand-built expectations."""

from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf

from axlearn.common import input_glue
from axlearn.common.config import config_for_class, config_for_function
from axlearn.common.input_test_utils import python_docs_sentence_piece_vocab_file

VOCAB_CFG = config_for_class(seqio.SentencePieceVocabulary).set(
    sentencepiece_model_file=python_docs_sentence_piece_vocab_file
)


@pytest.fixture(name="vocab", scope="module")
def fixture_vocab():
    return VOCAB_CFG.instantiate()


def _one(fn, example):
    return next(iter(fn(tf.data.Dataset.from_tensors(example))))


def _np_truncation_lengths(sizes: list[int], max_len: int) -> list[int]:
    """Reference: even budgets, spare shared among long sequences, remainder to the longest."""
    k = len(sizes)
    budgets = [max_len // k] * k
    used = sum(min(b, s) for b, s in zip(budgets, sizes))
    long = [s > b for s, b in zip(sizes, budgets)]
    num_long = max(1, sum(long))
    spare = max_len - used
    budgets = [b + (spare // num_long) * int(is_long) for b, is_long in zip(budgets, long)]
    for i in sorted(range(k), key=lambda i: -sizes[i])[: spare % num_long]:
        budgets[i] += 1
    return [min(b, s) for b, s in zip(budgets, sizes)]


@pytest.mark.parametrize(
    "sizes,max_len", [([3, 3], 4), ([1, 9], 6), ([7, 2, 5], 10), ([5, 5, 5, 5], 7), ([2], 5)]
)
def test_multi_sequence_truncation_matches_reference(sizes, max_len):
    keys = [f"s{i}" for i in range(len(sizes))]
    example = {k: tf.range(n) for k, n in zip(keys, sizes)}
    out = _one(input_glue.multi_sequence_truncation(max_len=max_len, input_key=keys), example)
    got = [len(out[k]) for k in keys]
    assert got == _np_truncation_lengths(sizes, max_len)
    assert sum(got) <= max_len
    for k, n in zip(keys, got):
        assert out[k].numpy().tolist() == list(range(n))  # Truncated from the right.


def test_roberta_special_tokens_and_text_to_glue_input(vocab):
    a, b = vocab.encode("first input"), vocab.encode("second")
    fn = input_glue.add_special_tokens_for_roberta(VOCAB_CFG, input_key=["a", "b"])
    out = _one(fn, {"a": tf.constant(a), "b": tf.constant(b)})
    eos = vocab.eos_id  # No BOS piece: BOS is EOS.
    assert out["input_ids"].numpy().tolist() == [eos, *a, eos, eos, *b, eos]

    processor = input_glue.text_to_glue_input(
        is_training=False,
        input_key=["a", "b"],
        max_len=12,
        vocab_cfg=VOCAB_CFG,
        truncation=config_for_function(input_glue.multi_sequence_truncation).set(max_len=8),
        concatenation=config_for_function(input_glue.add_special_tokens_for_roberta),
    )
    ex = _one(processor, {"a": "first input", "b": "second", "label": 1})
    want = [eos, *a, eos, eos, *b, eos]
    assert ex["input_ids"].numpy().tolist() == want + [0] * (12 - len(want))
    assert int(ex["target_labels"]) == 1
    with pytest.raises(ValueError, match="input_key"):
        input_glue.text_to_glue_input(
            is_training=False,
            input_key=[],
            max_len=4,
            vocab_cfg=VOCAB_CFG,
            truncation=config_for_function(input_glue.multi_sequence_truncation),
            concatenation=config_for_function(input_glue.add_special_tokens_for_roberta),
        )


def test_copa_pre_and_post_processing():
    ex = {
        "premise": "I packed up.",
        "question": "cause",
        "choice1": "A.",
        "choice2": "B.",
        "label": 1,
    }
    out = _one(input_glue.preprocess_copa(), ex)
    assert out["premise"].numpy().tolist() == [b"I packed up. What's the CAUSE for this?"] * 2
    assert out["choice"].numpy().tolist() == [b"A.", b"B."]
    rows = tf.data.Dataset.from_tensor_slices(
        {"input_ids": tf.constant([[1, 2], [3, 4]]), "target_labels": tf.constant([1, 1])}
    )
    grouped = next(iter(input_glue.postprocess_copa()(rows)))
    np.testing.assert_array_equal(grouped["input_ids"], [[1, 2], [3, 4]])
    assert int(grouped["target_labels"]) == 1


def test_record_and_text_to_text_formats():
    record = {
        "passage": "P.",
        "query": "Q @placeholder.",
        "entities": tf.constant(["x", "y"]),
        "answers": tf.constant(["y"]),
    }
    out = _one(input_glue.preprocess_record(), record)
    assert out["entity"].numpy().tolist() == [b"x", b"y"]
    assert out["label"].numpy().tolist() == [0, 1]

    fn = input_glue.add_prefix_concat_sequence_pair(
        dataset_name="qqp", label_names=["no", "yes"], input_key=("question2", "question1")
    )
    ex = {"question1": "Hi", "question2": "There", "label": 1, "idx": 3, "prefix": [1]}
    out = _one(fn, ex)
    assert out["source_text"].numpy() == b"qqp question1: Hi question2: There"
    assert out["target_text"].numpy() == b"yes"
    out = _one(fn, {**ex, "label": -1})
    assert out["target_text"].numpy() == b"<unk>"

    stsb = input_glue.add_prefix_concat_sequence_pair(
        dataset_name="stsb", label_names=["none"], input_key=("sentence1", "sentence2")
    )
    ex = {"sentence1": "a", "sentence2": "b", "label": 1.73, "idx": 0, "prefix": [1]}
    assert _one(stsb, ex)["target_text"].numpy() == b"1.8"

    wsc = input_glue.add_prefix_concat_sequence_pair(
        dataset_name="wsc", label_names=["False", "True"], input_key="text"
    )
    ex = {
        "text": "We show an example here .",
        "span1_text": "example",
        "span1_index": 3,
        "span2_text": "We",
        "span2_index": 0,
        "label": 0,
        "idx": 0,
        "prefix": [1],
    }
    out = _one(wsc, ex)
    assert out["source_text"].numpy() == b"wsc text: # We # show an * example * here ."
    assert out["target_text"].numpy() == b"False"


def test_make_glue_autoregressive_inputs(vocab):
    fn = input_glue.make_glue_autoregressive_inputs(
        vocab_cfg=VOCAB_CFG, max_source_length=4, max_target_length=4
    )
    eos = vocab.eos_id
    ex = {
        "prefix": tf.constant([100]),
        "source_ids": tf.constant([10, 11, 12, eos]),
        "target_labels": tf.constant([20, 21, 22, 23, eos]),
        "idx": 3,
    }
    out = _one(fn, ex)
    assert out["source_ids"].numpy().tolist() == [10, 11, 12, eos]
    assert out["target_labels"].numpy().tolist() == [20, 21, 22, eos]
    assert out["target_ids"].numpy().tolist() == [100, 20, 21, 22]
    two = _one(fn, {**ex, "prefix": tf.constant([100, 7])})
    assert two["target_labels"].numpy().tolist() == [-1, 20, 21, eos]
