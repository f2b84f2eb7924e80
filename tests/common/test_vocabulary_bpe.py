"""Tests of axlearn/common/vocabulary_bpe.py against Hugging Face `tokenizers`.

A tiny byte-level BPE is trained with `tokenizers` on a few sentences; its vocabulary and
merges become a SentencePiece BPE model (merge rank -> piece score), and our encoding must give
the ids of the Hugging Face tokenizer (GPT-2 pre-tokenization, special tokens kept whole).
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from sentencepiece import sentencepiece_model_pb2 as spm_pb
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from axlearn.common.golden import golden_path, load_golden
from axlearn.common.vocabulary_bpe import BPEVocabulary, _bytes_to_unicode

# Ids 0..3 in the Hugging Face tokenizer; our id_map swaps <s> and <pad> (seqio wants pad at 0).
_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]
_ID_MAP = {0: 1, 1: 0}
_CORPUS = [
    "hello world, this is a test's text.",
    "Hello  there!\n  the tester tests 123 4567 we'll",
    "über café 博推 🤗 цIи — Боливариа́нхой",
]
_TEXTS = [
    "",
    "  this\r  \t\t a\ntest's  11'm'll  \tx  hello world",
    "über café 博推 🤗 zzq  — a  b   c\n\n d",
    " \x0b- \x85\x85- ",
    "<s> \thello <s world<s>test !<pad></s>  \x85<s>",
]


@pytest.fixture(scope="module", name="bpe")
def fixture_bpe(tmp_path_factory):
    """(Hugging Face tokenizer, path of the equivalent SentencePiece model)."""
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(_CORPUS * 3, trainer)
    merges = json.loads(hf.to_str())["model"]["merges"]
    rank = {"".join(m): i for i, m in enumerate(merges)}
    proto = spm_pb.ModelProto()
    piece_type = spm_pb.ModelProto.SentencePiece
    for piece, _ in sorted(hf.get_vocab().items(), key=lambda kv: kv[1]):
        p = proto.pieces.add(piece=piece, score=-float(rank.get(piece, -1) + 1))
        if piece == "<unk>":
            p.type = piece_type.UNKNOWN
        elif piece in _SPECIAL:
            p.type = piece_type.USER_DEFINED
    spec = proto.trainer_spec
    spec.model_type = spm_pb.TrainerSpec.BPE
    spec.bos_piece, spec.pad_piece, spec.eos_piece, spec.unk_piece = _SPECIAL
    spec.bos_id, spec.pad_id, spec.eos_id, spec.unk_id = 0, 1, 2, 3
    norm = proto.normalizer_spec
    norm.name, norm.add_dummy_prefix = "identity", False
    norm.remove_extra_whitespaces, norm.escape_whitespaces = False, False
    path = tmp_path_factory.mktemp("bpe") / "tiny.model"
    path.write_bytes(proto.SerializeToString())
    return hf, str(path)


def test_encode_matches_hugging_face_and_decodes_back(bpe):
    hf, path = bpe
    vocab = BPEVocabulary(path, id_map=_ID_MAP)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 2, 3)
    assert vocab.vocab_size == hf.get_vocab_size()
    for text in _TEXTS:
        hf_ids = hf.encode(text).ids
        ids = vocab.encode(text)  # Through encode_tf.
        assert ids == [_ID_MAP.get(i, i) for i in hf_ids], text
        ids = tf.constant(ids, tf.int32)
        assert vocab.apply_inv_id_map_tf(ids).numpy().tolist() == hf_ids
        assert vocab._decode(ids.numpy().tolist()) == text
        if text:  # Batched decoding.
            batch = vocab._decode_tf(tf.stack([ids, ids])).numpy()
            assert [b.decode("utf-8") for b in batch] == [text] * 2


def test_byte_table_and_chunked_encoding(bpe):
    table = _bytes_to_unicode()
    # A bijection from the 256 bytes onto the alphabet of Hugging Face's byte-level BPE.
    assert sorted(table) == list(range(256))
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert table[ord(" ")] == "\u0120" and table[ord("a")] == "a"
    vocab = BPEVocabulary(bpe[1], id_map=_ID_MAP)
    tokens = tf.constant(["a b", "\x00\xff", "é博", ""])
    expected = ["a\u0120b", "\u0100\u00c3\u00bf", "\u00c3\u00a9\u00e5\u012f\u013c", ""]
    for chunk_size in (1, 3):
        out = vocab._chunk_byte_encode_tf(tokens, chunk_size=chunk_size).numpy()
        assert [s.decode("utf-8") for s in out] == expected
    decoded = vocab._byte_decode_tf(vocab._byte_encode_tf(tokens)).numpy()
    assert decoded.tolist() == [t.encode("utf-8") for t in ["a b", "\x00\xff", "é博", ""]]


def test_validation_decode_as_control_and_extra_ids(bpe):
    path = bpe[1]
    with pytest.raises(ValueError, match="seqio expects pad_id 0"):
        BPEVocabulary(path)
    with pytest.raises(ValueError, match="must be bijective"):
        BPEVocabulary(path, id_map={0: 1, 1: 1})
    with pytest.raises(ValueError, match="decode_as_control must be unique"):
        BPEVocabulary(path, id_map=_ID_MAP, decode_as_control=(0, 0))
    vocab = BPEVocabulary(path, id_map=_ID_MAP, decode_as_control=(0, 2))
    ids = vocab.encode_tf(tf.constant("<pad>hello </s>world</s><pad>"))
    assert ids.numpy().tolist()[0] == 0
    assert vocab._decode_tf(ids).numpy() == b"hello world"
    vocab = BPEVocabulary(path, id_map=_ID_MAP, extra_ids=2)
    assert vocab.vocab_size == bpe[0].get_vocab_size() + 2


# AXLearn's vocabulary_bpe_test reads `load_golden("axlearn.common.vocabulary_bpe_test", ...)`:
# Hugging Face's outputs for a list of texts it indexes by position (`text_00`, ...), kept in
# tests/testdata/vocabulary_bpe_texts.json. The regex split and the byte encoding do not depend
# on the vocabulary (GPT-2's pre-tokenizer, shared by the three vocabularies it names), so they
# are written here from `tokenizers`' ByteLevel pre-tokenizer (regenerate with
# AXLEARN_UPDATE_GOLDENS=1). Its id-map and encode cases need HF's GPT-2/OPT/RoBERTa vocabulary
# files and are not written.
GOLDEN_MODULE = "axlearn.common.vocabulary_bpe_test"
_GOLDEN_TOKENIZERS = ("roberta-base", "gpt2", "opt")
_TEXTS_FILE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "testdata",
    "vocabulary_bpe_texts.json",
)


def _bpe_golden_arrays(texts: list) -> dict:
    """{golden key: array} of HF's regex split and byte encoding of `texts`."""
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    whole = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    arrays = {}
    for name in _GOLDEN_TOKENIZERS:
        for i, text in enumerate(texts):
            pieces = [text[a:b] for _, (a, b) in split.pre_tokenize_str(text)]
            arrays[f"test_regex_split_fake_data/{name}/text_{i:02d}"] = np.array(pieces, dtype=str)
        encoded = ["".join(p for p, _ in whole.pre_tokenize_str(text)) for text in texts]
        arrays[f"test_byte_encode_fake_data/{name}/byte_encoded"] = np.array(encoded, dtype=str)
    return arrays


def test_axlearn_vocabulary_bpe_golden_holds_hf_pre_tokenizer_outputs(bpe):
    """The shipped golden equals HF's pre-tokenizer outputs; our TF split and encoding match."""
    with open(_TEXTS_FILE, encoding="utf-8") as f:
        texts = json.load(f)
    arrays = _bpe_golden_arrays(texts)
    path = golden_path(GOLDEN_MODULE)
    if os.environ.get("AXLEARN_UPDATE_GOLDENS"):
        np.savez_compressed(path, **arrays)
    with np.load(path, allow_pickle=False) as stored:
        assert set(stored.files) == set(arrays)
        for key, value in arrays.items():
            np.testing.assert_array_equal(stored[key], value, err_msg=key)
    vocab = BPEVocabulary(bpe[1], id_map=_ID_MAP)
    split = load_golden(GOLDEN_MODULE, "test_regex_split_fake_data")["gpt2"]
    encoded = load_golden(GOLDEN_MODULE, "test_byte_encode_fake_data")["gpt2"]["byte_encoded"]
    for i, text in enumerate(texts):
        ours = [x.numpy().decode("utf-8") for x in vocab._regex_split_tf(tf.constant(text))]
        assert ours == [str(s) for s in split[f"text_{i:02d}"]], text
        ours = vocab._byte_encode_tf(tf.constant([text]))[0].numpy().decode("utf-8")
        assert ours == str(encoded[i]), text
