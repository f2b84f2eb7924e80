"""Tests axlearn/common/input_lm.py against hand-written NumPy references."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from axlearn.common import embedded_data, input_lm
from axlearn.common.config import config_for_function
from axlearn.experiments.text.common import embedded_vocab_config, vocab
from tests.common import input_test_utils

# The session fixture that builds the embedded data in a temporary cache dir.
embedded_cache = input_test_utils.embedded_cache
PAD, EOS = 0, 1


class _StubVocab:
    """Minimal vocabulary for packing tests: pad 0, EOS 1, every other id is one byte."""

    pad_id, eos_id, vocab_size, tokenizer = PAD, EOS, 100, None

    def decode(self, ids):
        return "x" * len(ids)


def _token_source(docs):
    import tensorflow as tf

    return tf.data.Dataset.from_generator(
        lambda: ({"tokens": np.array(d, np.int32)} for d in docs),
        output_signature={"tokens": tf.TensorSpec([None], tf.int32)},
    )


def _reference_pack(docs, max_len):
    """Next-fit packing written out by hand: the expected packed rows."""
    rows, cur = [], []

    def flush():
        if cur:
            n = sum(len(c[0]) for c in cur)
            ids, tgt, seg, pos = [], [], [], []
            for s, (inp, t) in enumerate(cur, start=1):
                ids += inp
                tgt += t
                seg += [s] * len(inp)
                pos += list(range(len(inp)))
            pad = max_len - n
            rows.append(
                {
                    "input_ids": ids + [PAD] * pad,
                    "target_labels": tgt + [PAD] * pad,
                    "input_segment_ids": seg + [0] * pad,
                    "input_positions": pos + [0] * pad,
                }
            )
            cur.clear()

    for doc in docs:
        inputs, targets = [EOS] + list(doc), list(doc) + [EOS]
        for start in range(0, len(inputs), max_len):
            chunk = (inputs[start : start + max_len], targets[start : start + max_len])
            if sum(len(c[0]) for c in cur) + len(chunk[0]) > max_len:
                flush()
            cur.append(chunk)
    flush()
    return rows


def test_pack_matches_hand_packed_reference():
    docs = [[5, 6, 7], [8], [], [9] * 11, [10, 11, 12, 13, 14], [15, 16], [17] * 8, [18]]
    max_len = 8
    ds = input_lm.pack(max_len, vocab=_StubVocab())(_token_source(docs))
    got = list(ds.as_numpy_iterator())
    expected = _reference_pack(docs, max_len)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        for k, v in e.items():
            np.testing.assert_array_equal(g[k], v, err_msg=k)
        assert g["input_ids"].dtype == np.int32
        # target_num_bytes: one byte per (non-pad) target with the stub vocabulary.
        assert g["target_num_bytes"] == np.count_nonzero(g["target_labels"])


@pytest.mark.parametrize("packing", [False, True])
def test_no_token_lost_or_duplicated_over_an_epoch(embedded_cache, packing):
    """Every target token of the validation split appears exactly once in one epoch."""
    import sentencepiece as spm
    import tensorflow_datasets as tfds

    sp = spm.SentencePieceProcessor(model_file=embedded_data.vocab_path())
    expected = collections.Counter()
    for doc in embedded_data.read_corpus("validation"):
        expected.update(sp.encode(doc["text"].replace("\n", "<n>")) + [EOS])
    processor = input_lm.text_to_lm_training_input(
        embedded_vocab_config(),
        max_len=64,
        replace_newlines_with="<n>",
        shuffle_buffer_size=0,
        is_training=False,  # One epoch, no repeat.
        packing=packing,
        window_size=16,
    )
    ds = tfds.builder("python_docs:1.0.0", data_dir=embedded_data.tfds_data_dir()).as_dataset(
        split="validation"
    )
    got = collections.Counter()
    for ex in processor(ds).as_numpy_iterator():
        targets = ex["target_labels"]
        got.update(targets[targets != PAD].tolist())
        if packing:
            live = ex["input_segment_ids"] > 0
            np.testing.assert_array_equal(live, targets != PAD)
        else:
            # Inputs are the targets shifted right by one.
            n = np.count_nonzero(targets != PAD)
            np.testing.assert_array_equal(ex["input_ids"][1:n], targets[: n - 1])
    assert got == expected


def test_concatenate_and_split_windows():
    docs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    fn = input_lm.concatenate_and_split(4, vocab=_StubVocab(), window_size=2)
    got = [
        (ex["input_ids"].tolist(), ex["target_labels"].tolist())
        for ex in fn(_token_source(docs)).as_numpy_iterator()
    ]
    # Window 1: stream 5 6 7 E 8 9 E (rolled inputs start with the last E); window 2: 10..13 E.
    assert got == [
        ([EOS, 5, 6, 7], [5, 6, 7, EOS]),
        ([EOS, 8, 9, PAD], [8, 9, EOS, PAD]),
        ([EOS, 10, 11, 12], [10, 11, 12, 13]),
        ([13, PAD, PAD, PAD], [EOS, PAD, PAD, PAD]),
    ]
    # max_padding_fraction=0 drops partial tails.
    fn = input_lm.concatenate_and_split(
        4, vocab=_StubVocab(), window_size=2, max_padding_fraction=0.0
    )
    assert len(list(fn(_token_source(docs)).as_numpy_iterator())) == 2


@pytest.mark.parametrize("stride", [None, 3, 4])
def test_eval_windows_score_every_token_once(stride):
    import tensorflow as tf

    texts = [b"abcdefghij", b"xy", b"0123456789abcdefghijk"]
    ds = tf.data.Dataset.from_tensor_slices({"text": texts})
    byte_vocab = config_for_function(vocab).set(sentencepiece_model_name=None)
    fn = input_lm.text_to_lm_eval_input(byte_vocab, max_len=8, stride=stride)
    windows = list(fn(ds).as_numpy_iterator())
    targets = np.concatenate([w["target_labels"] for w in windows])
    expected = []
    for t in texts:
        expected += [c + 3 for c in t] + [EOS]
    np.testing.assert_array_equal(targets[targets != PAD], expected)
    for w in windows:
        # Inputs are the document shifted right; every window's input is a contiguous slice.
        assert w["target_num_bytes"] == np.count_nonzero(w["target_labels"])
        scored = np.nonzero(w["target_labels"])[0]
        if len(scored) and scored[0] > 0:
            np.testing.assert_array_equal(
                w["input_ids"][scored[0] :][1 : len(scored)], w["target_labels"][scored][:-1]
            )


def test_eval_windows_carry_document_index():
    import tensorflow as tf

    texts = [b"abcdefghij", b"xy", b"0123456789abcdefghijk"]
    byte_vocab = config_for_function(vocab).set(sentencepiece_model_name=None)
    fn = input_lm.text_to_lm_eval_input(byte_vocab, max_len=8, index_key="index")
    ds = tf.data.Dataset.from_tensor_slices({"text": texts})
    windows = list(fn(ds).as_numpy_iterator())
    # Documents of 11, 3 and 22 tokens (with EOS) -> 2, 1 and 3 disjoint windows of 8.
    assert [int(w["index"]) for w in windows] == [0, 0, 1, 2, 2, 2]
    # A document's own index field is kept as it is.
    ds = tf.data.Dataset.from_tensor_slices({"text": texts[:2], "index": [7, 9]})
    assert [int(w["index"]) for w in fn(ds).as_numpy_iterator()] == [7, 7, 9]
    # Without index_key no index field is added.
    plain = input_lm.text_to_lm_eval_input(byte_vocab, max_len=8)
    ds = tf.data.Dataset.from_tensor_slices({"text": texts})
    assert "index" not in next(iter(plain(ds)))


def test_target_num_bytes_counts_text_bytes(embedded_cache):
    """Bytes of a document's targets = its UTF-8 bytes + EOS + the sentencepiece dummy space."""
    import tensorflow as tf

    v = embedded_vocab_config().instantiate()
    docs = [d["text"] for d in embedded_data.read_corpus("validation")][:20]
    for text in docs:
        ids = v.encode_tf(tf.constant(text.replace("\n", "<n>")))
        n = int(input_lm.num_bytes(ids, vocab=v, newlines_replaced_with="<n>"))
        dummy = 0 if text[0].isspace() else 1
        assert n + 1 == len(text.encode("utf-8")) + 1 + dummy, text[:40]


def test_tokenize_replaces_newlines():
    import tensorflow as tf

    v = embedded_vocab_config().instantiate()
    ds = tf.data.Dataset.from_tensor_slices({"text": [b"a\nb"]})
    (ex,) = list(input_lm.tokenize(v, replace_newlines_with="<n>")(ds).as_numpy_iterator())
    assert 3 in ex["tokens"].tolist()  # "<n>" is id 3 in the embedded vocabulary.
    assert v.decode(ex["tokens"].tolist()) == "a<n>b"


def test_lm_text_preprocessor_matches_hand_concatenation(embedded_cache):
    """Windows of documents, EOS after each, cut into max_sequence_length pieces (NumPy ref)."""
    import tensorflow as tf

    v = embedded_vocab_config().instantiate()
    docs = [d["text"] for d in embedded_data.read_corpus("validation")][:6]
    fn = input_lm.lm_text_preprocessor(
        vocab_cfg=embedded_vocab_config(),
        max_sequence_length=16,
        replace_newlines_with="<n>",
        window_size=3,
        max_padding_fraction=1.0,
        shuffle_buffer_size=0,
    )
    got = list(fn(tf.data.Dataset.from_tensor_slices({"text": docs})).as_numpy_iterator())
    expected = []
    for start in (0, 3):
        stream = []
        for text in docs[start : start + 3]:
            stream += list(v.encode(text.replace("\n", "<n>"))) + [v.eos_id]
        inputs = [stream[-1]] + stream[:-1]
        pad = -len(stream) % 16
        stream, inputs = stream + [v.pad_id] * pad, inputs + [v.pad_id] * pad
        expected += [(inputs[i : i + 16], stream[i : i + 16]) for i in range(0, len(stream), 16)]
    assert [(g["input_ids"].tolist(), g["target_labels"].tolist()) for g in got] == expected
