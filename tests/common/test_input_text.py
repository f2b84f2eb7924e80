"""Tests axlearn/common/input_text.py against Python/NumPy references."""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pytest
import seqio
import tensorflow as tf

from axlearn.common import input_text
from axlearn.common.input_test_utils import (
    make_ds_fn,
    make_ragged_ds_fn,
    python_docs_sentence_piece_vocab_file,
)


@pytest.fixture(name="vocab", scope="module")
def fixture_vocab():
    return seqio.SentencePieceVocabulary(python_docs_sentence_piece_vocab_file)


def _texts(ds, key="text"):
    return [ex[key].numpy().decode("utf-8") for ex in ds]


def test_strip_accents_matches_unicodedata():
    texts = ["El Capitán", "dômes granitiques", "Yosemite", "优胜美地", "naïve café"]
    ds = make_ds_fn(False, texts, repeat=1)()
    for form in ("NFD", "NFKD"):
        got = _texts(input_text.strip_accents(["text"], normalization_form=form)(ds))
        want = [
            "".join(c for c in unicodedata.normalize(form, t) if unicodedata.category(c) != "Mn")
            for t in texts
        ]
        assert got == want
    with pytest.raises(AssertionError, match="NFD"):
        input_text.strip_accents(["text"], normalization_form="NFC")


def test_roberta_and_bert_normalize():
    texts = ["  Hello, World!  How are you?  "]
    ds = make_ds_fn(False, texts, repeat=1)()
    assert _texts(input_text.roberta_normalize(cased=False)(ds)) == [texts[0].strip().lower()]
    assert _texts(input_text.roberta_normalize(cased=True)(ds)) == [texts[0].strip()]
    # Reference for ASCII text: split on whitespace, every punctuation mark its own token.
    want = " ".join(re.findall(r"\w+|[^\w\s]", texts[0].lower()))
    out = list(input_text.bert_normalize(cased=False)(ds))
    assert _texts(out) == [want]
    assert all("index" in ex for ex in out)  # Other fields are kept.


def test_add_token_type_ids_dense_and_ragged(vocab):
    ds = tf.data.Dataset.from_tensors(
        {"q": tf.constant(["where is it"]), "a": tf.constant(["over the hill there"])}
    )
    ds = input_text.tokenize(
        {k: seqio.Feature(vocab, add_eos=False, dtype=tf.int32) for k in ("q", "a")},
        with_eos=False,
    )(ds)
    ex = next(iter(input_text.add_token_type_ids(["q", "a"])(ds)))
    lq, la = (len(vocab.encode(t)) for t in ("where is it", "over the hill there"))
    # BOS + q + SEP get 0; a + EOS get 1.
    want = [0] * (lq + 2) + [1] * (la + 1)
    assert ex["token_type_ids"].to_list() == [want]

    dense = tf.data.Dataset.from_tensors({"x": tf.zeros([2, 3], tf.int32)})
    ex = next(iter(input_text.add_token_type_ids("x")(dense)))
    np.testing.assert_array_equal(ex["token_type_ids"].numpy(), np.zeros([2, 5], np.int32))


def test_pack_unpack_strings_roundtrip():
    strings = ["", "What time is it?", "naïve 优胜"]
    packed = input_text.pack_strings(tf.constant(strings), 20)
    assert packed.shape == (3, 20)
    row = packed.numpy()[2]
    assert row[: len(strings[2])].tolist() == [ord(c) for c in strings[2]]
    assert (row[len(strings[2]) :] == input_text.STRINGS_BYTE_ARRAY_PAD_VALUE).all()
    assert input_text.unpack_strings(packed) == strings
    with pytest.raises(tf.errors.InvalidArgumentError):
        input_text.pack_strings(tf.constant(["a" * 10]), 5)


def test_split_sentences_and_sampling():
    texts = ["First one. Second one!\n\nThird? Mr. Smith met J. Doe.", "no end"]
    ds = make_ds_fn(False, texts, repeat=1)()
    got = _texts(input_text.split_sentences(passthrough_keys=["index"])(ds))
    assert got == ["first one.", "second one!", "third?", "mr. smith met j. doe.", "", "no end", ""]
    out = list(input_text.split_sentences(max_sentences_per_example=2)(ds))
    doc = [ex["text"].numpy().decode() for ex in out][:3]
    assert doc[-1] == "" and len(doc) == 3
    order = ["first one.", "second one!", "third?", "mr. smith met j. doe."]
    assert [order.index(s) for s in doc[:2]] == sorted(order.index(s) for s in doc[:2])


def test_random_chunking_windows_are_uniform():
    ds = tf.data.Dataset.from_tensors({"input_ids": tf.range(6)}).repeat(400)
    starts = [int(ex["input_ids"][0]) for ex in input_text.random_chunking(3)(ds)]
    counts = np.bincount(starts, minlength=4)
    assert counts.sum() == 400 and len(counts) == 4 and counts.min() > 60
    short = tf.data.Dataset.from_tensors({"input_ids": tf.range(2)})
    assert next(iter(input_text.random_chunking(3)(short)))["input_ids"].numpy().tolist() == [0, 1]


def test_preprocess_chunks_and_join():
    texts = ["x" * 10, "é" * 5]
    ds = make_ds_fn(False, texts, repeat=1)()
    got = _texts(input_text.preprocess_chunks(4)(ds))
    want = [t[k : k + 4] for t in texts for k in range(0, len(t), 4)]
    assert got == want
    pair = tf.data.Dataset.from_tensors({"a": tf.constant("x"), "b": tf.constant("y")})
    joined = next(iter(input_text.join_string_features(["a", "b"], key="c", separator="|")(pair)))
    assert joined["c"].numpy() == b"x|y"


def test_tokenize_example_and_num_bytes(vocab):
    ids = input_text.tokenize_example("hello\nworld", vocab, replace_newlines_with="<n>")
    assert ids.numpy().tolist() == vocab.encode("hello<n>world")
    with_eos = tf.concat([ids, [vocab.eos_id, 0, 0]], axis=0)
    # "hello\nworld" is 11 bytes; EOS counts one.
    assert int(input_text.num_bytes(with_eos, vocab, newlines_replaced_with="<n>")) == 12
    assert input_text.infer_bos_id(vocab) == vocab.eos_id  # This model has no BOS.


def test_make_ragged_ds_fn_and_perplexity():
    ds = make_ragged_ds_fn(False, [{"text": [["a b"], ["c", "d"]]}], repeat=1)()
    ex = next(iter(input_text.roberta_normalize(cased=False)(ds)))
    assert ex["text"].to_list() == [[b"a b"], [b"c", b"d"]]
    assert input_text.perplexity([], [0.0, np.log(4.0)])["perplexity"].value == pytest.approx(2.0)


def test_text_input_modules_import_without_tensorflow():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from axlearn.common import input_composite, input_glue, input_mlm, input_ranking\n"
        "from axlearn.common import input_t5, input_text\n"
        "heavy = [m for m in ('tensorflow', 'seqio', 'tensorflow_text') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
