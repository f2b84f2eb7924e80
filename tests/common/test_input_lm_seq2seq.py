"""Tests axlearn/common/input_lm_seq2seq.py (the seq2seq names of input_lm)."""

from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf

from axlearn.common import input_tf_data
from axlearn.common.config import config_for_class, config_for_function
from axlearn.common.input_fake import fake_source
from axlearn.common.input_lm import (
    InputDataType,
    ModelType,
    PackingMethodType,
    augment_text_from_inputs_targets_pretokenized,
    joint_truncation_for_seq2seq_lm_input,
    lm_from_seq2seq_text_preprocessor,
    make_autoregressive_inputs,
    text2text_lm_input,
    text_to_lm_training_input,
)
from axlearn.common.input_test_utils import make_ds_fn, python_docs_sentence_piece_vocab_file

VOCAB_CFG = config_for_class(seqio.SentencePieceVocabulary).set(
    sentencepiece_model_file=python_docs_sentence_piece_vocab_file
)


@pytest.fixture(name="vocab", scope="module")
def fixture_vocab():
    return VOCAB_CFG.instantiate()


def _ids(ds):
    return [tf.nest.map_structure(lambda t: t.numpy().tolist(), ex) for ex in ds]


def test_augment_text():
    ds = fake_source(is_training=False, examples=[{"q": "a\nb", "t": "c\n", "other": 5}])()
    out = list(
        augment_text_from_inputs_targets_pretokenized(
            replace_newlines_with="<n>",
            source_key="q",
            target_key="t",
            eos_id=9,
            prompt="Q: ",
            join_with="\n",
        )(ds)
    )[0]
    assert out["q"].numpy() == b"Q: a<n>b<n>" and out["t"].numpy() == b"c<n>"
    assert out["prefix"].numpy() == 9 and out["other"].numpy() == 5
    ds = fake_source(is_training=False, examples=[{"q": "x", "t": "y", "prefix": [7, 8]}])()
    kept = list(augment_text_from_inputs_targets_pretokenized(source_key="q", target_key="t")(ds))
    np.testing.assert_array_equal(kept[0]["prefix"].numpy(), [7, 8])  # An existing prefix stays.
    assert kept[0]["q"].numpy() == b"x<n><n>"  # Default join_with "\n\n", newlines as <n>.


def _stream(prefix, source, target, *, mask_source):
    """NumPy reference: inputs/labels of prefix + source + target shifted by one."""
    seq = list(prefix) + list(source) + list(target)
    labels = seq[1:]
    masked = len(prefix) - 1 + (len(source) if mask_source else 0)
    labels = [-1 if i < masked else v for i, v in enumerate(labels)]
    return seq[:-1], labels


@pytest.mark.parametrize("data_type", [InputDataType.SEQ2SEQ_MASK, InputDataType.SEQ2SEQ_NO_MASK])
@pytest.mark.parametrize("prefix", [[1], [5, 6]])
def test_make_autoregressive_inputs_decoder_only(data_type, prefix):
    ex = {"prefix": prefix, "input_ids": [11, 12, 13], "target_labels": [21, 22, 1], "id": [3]}
    ds = fake_source(is_training=False, examples=[ex])()
    out = _ids(make_autoregressive_inputs(input_data_type=data_type, passthrough_keys=["id"])(ds))
    inputs, labels = _stream(
        prefix, [11, 12, 13], [21, 22, 1], mask_source=data_type == InputDataType.SEQ2SEQ_MASK
    )
    assert out == [{"prefix": prefix, "input_ids": inputs, "target_labels": labels, "id": [3]}]
    if data_type == InputDataType.SEQ2SEQ_MASK and prefix == [1]:
        # Hand check of one case: only the target's tokens are predicted.
        assert labels == [-1, -1, -1, 21, 22, 1]


def test_make_autoregressive_inputs_encoder_decoder():
    ex = {"prefix": [1], "input_ids": [11, 12], "target_labels": [21, 1]}
    ds = fake_source(is_training=False, examples=[ex])()
    out = _ids(make_autoregressive_inputs(model_type=ModelType.ENCODER_DECODER)(ds))[0]
    assert out == {
        "prefix": [1],
        "source": {"input_ids": [11, 12]},
        "target": {"input_ids": [1, 21]},
        "target_labels": [21, 1],
    }


@pytest.mark.parametrize(
    "prefix,source,target,max_len,expected",
    [
        # Fits (1 + 2 + 2 = 5 <= 6): unchanged.
        ([1], [11, 12], [21, 1], 5, ([1], [11, 12], [21, 1])),
        # Budget 4: target 2, so 2 of prefix+source kept (the newest).
        ([1], [11, 12, 13], [21, 1], 3, ([], [12, 13], [21, 1])),
        # Budget 5: 3 kept: one prefix token survives.
        ([1, 2], [11, 12], [21, 1], 4, ([2], [11, 12], [21, 1])),
        # A target longer than the budget is cut at its end.
        ([1], [11], [21, 22, 23, 1], 2, ([], [], [21, 22, 23])),
    ],
)
def test_joint_truncation(prefix, source, target, max_len, expected):
    ex = {"prefix": prefix, "input_ids": source, "target_labels": target}
    spec = {k: tf.TensorSpec([None], tf.int32) for k in ex}
    ds = fake_source(is_training=False, examples=[ex], spec=spec)()
    out = _ids(joint_truncation_for_seq2seq_lm_input(max_len)(ds))[0]
    assert (out["prefix"], out["input_ids"], out["target_labels"]) == expected


@pytest.mark.parametrize("data_type", [InputDataType.SEQ2SEQ_MASK, InputDataType.SEQ2SEQ_NO_MASK])
def test_lm_from_seq2seq_text_preprocessor(vocab, data_type):
    examples = [{"inputs_pretokenized": "x = 1", "targets_pretokenized": "print(x)\nok"}]
    ds = fake_source(is_training=False, examples=examples)()
    max_len = 12
    fn = lm_from_seq2seq_text_preprocessor(
        is_training=False,
        vocab_cfg=VOCAB_CFG,
        max_sequence_length=max_len,
        input_data_type=data_type,
    )
    out = _ids(fn(ds))[0]
    source = vocab.encode("x = 1<n><n>")
    target = vocab.encode("print(x)<n>ok") + [vocab.eos_id]
    inputs, labels = _stream(
        [vocab.eos_id], source, target, mask_source=data_type == InputDataType.SEQ2SEQ_MASK
    )
    pad = max(0, max_len - len(inputs))
    assert out == {
        "input_ids": (inputs + [0] * pad)[:max_len],
        "target_labels": (labels + [-1] * pad)[:max_len],
    }


def test_text2text_encoder_decoder_pad(vocab):
    ds = fake_source(is_training=False, examples=[{"s": "abc", "t": "de", "k": 4}])()
    fn = text2text_lm_input(
        is_training=False,
        target_sentence_piece_vocab=VOCAB_CFG,
        max_target_length=8,
        max_source_length=6,
        source_key="s",
        target_key="t",
    )
    out = _ids(fn(ds))[0]
    src = (vocab.encode("abc") + [1])[:6]
    tgt = vocab.encode("de") + [1]
    assert out["k"] == 4 and out["prefix"] == [1]
    assert out["source"]["input_ids"] == src + [0] * (6 - len(src))
    assert out["source"]["input_segment_ids"] == [1] * len(src) + [0] * (6 - len(src))
    assert out["source"]["positions"] == list(range(len(src))) + [0] * (6 - len(src))
    assert out["target"]["input_ids"] == ([1] + tgt[:-1] + [0] * 8)[:8]
    assert out["target_labels"] == (tgt + [-1] * 8)[:8]


def test_text2text_decoder_only_pack(vocab):
    examples = [{"source": "a", "target": "b"}, {"source": "c", "target": "d"}]
    ds = fake_source(is_training=False, examples=examples)()
    fn = text2text_lm_input(
        is_training=False,
        model_type=ModelType.DECODER_ONLY,
        target_sentence_piece_vocab=VOCAB_CFG,
        max_target_length=32,
        packing_mode="pack",
    )
    rows = _ids(fn(ds))
    assert len(rows) == 1
    row = rows[0]
    first = _stream([1], vocab.encode("a"), vocab.encode("b") + [1], mask_source=True)
    second = _stream([1], vocab.encode("c"), vocab.encode("d") + [1], mask_source=True)
    n1, n2 = len(first[0]), len(second[0])
    pad = 32 - n1 - n2
    assert row["input_ids"] == first[0] + second[0] + [0] * pad
    assert row["target_labels"] == first[1] + second[1] + [-1] * pad
    assert row["input_segment_ids"] == [1] * n1 + [2] * n2 + [0] * pad
    assert row["input_positions"] == list(range(n1)) + list(range(n2)) + [0] * pad


def test_text2text_rejects_bad_packing_mode():
    with pytest.raises(ValueError, match="packing_mode must be"):
        text2text_lm_input(
            is_training=False,
            target_sentence_piece_vocab=VOCAB_CFG,
            max_target_length=4,
            packing_mode="zip",
        )


def test_packing_method_selects_packing():
    texts = ["one two three", "four five"]
    kwargs = dict(vocab_cfg=VOCAB_CFG, max_len=16, shuffle_buffer_size=0, is_training=False)
    ds = make_ds_fn(is_training=False, texts=texts)()
    packed = next(
        iter(
            text_to_lm_training_input(packing_method=PackingMethodType.EOS_DELIM_MASK, **kwargs)(ds)
        )
    )
    assert "input_segment_ids" in packed
    plain = next(
        iter(
            text_to_lm_training_input(packing_method=PackingMethodType.EOS_DELIM_NO_MASK, **kwargs)(
                ds
            )
        )
    )
    assert "input_segment_ids" not in plain
    with pytest.raises(ValueError, match="contradicts"):
        text_to_lm_training_input(
            packing=True, packing_method=PackingMethodType.EOS_DELIM_NO_MASK, **kwargs
        )


def test_make_ds_fn_and_input_batches():
    cfg = input_tf_data.Input.default_config().set(
        name="input",
        is_training=False,
        source=config_for_function(make_ds_fn).set(texts=["a", "b", "c"], repeat=1),
        processor=config_for_function(input_tf_data.identity),
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=2, pad_example_fn=input_tf_data.default_pad_example_fn
        ),
    )
    batches = [b["text"].tolist() for b in cfg.instantiate(parent=None)]
    assert batches == [[b"a", b"b"], [b"c", b""]]
