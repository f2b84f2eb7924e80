"""Tests axlearn.common.input_grain_text against hand-computed ids and UTF-8 byte counts."""

import grain
import numpy as np
import pytest

from axlearn.common.config import config_for_function
from axlearn.common.input_grain_text import (
    Vocabulary,
    count_num_bytes,
    num_bytes,
    tokenize,
    with_regex_mapping,
)


class CodePointVocab:
    """id = Unicode code point + 3 (0 pad, 1 EOS, 2 BOS)."""

    pad_id, eos_id, bos_id = 0, 1, 2

    def encode(self, s):
        return [ord(c) + 3 for c in s]

    def _decode(self, ids):
        return "".join(chr(int(i) - 3) for i in ids if int(i) >= 3)

    def decode(self, ids):
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self._decode(ids)


def test_vocabulary_protocol():
    assert isinstance(CodePointVocab(), Vocabulary)
    assert not isinstance(object(), Vocabulary)


def test_with_regex_mapping_rewrites_around_the_vocab():
    cls = with_regex_mapping(
        CodePointVocab,
        encode_mapping=[("\n", "<n>"), ("  +", " ")],
        decode_mapping=[("<n>", "\n")],
    )
    vocab = cls()
    assert isinstance(vocab, CodePointVocab)
    text = "a\nb    c"
    # By hand: "a<n>b c" encoded code point by code point.
    assert vocab.encode(text) == [ord(c) + 3 for c in "a<n>b c"]
    assert vocab.decode(vocab.encode(text)) == "a\nb c"
    assert vocab.decode(vocab.encode(text) + [1, 50]) == "a\nb c"  # Up to the first EOS.
    # Mappings apply in order: "x" -> "y", then "y" -> "z".
    chain = with_regex_mapping(
        CodePointVocab, encode_mapping=[("x", "y"), ("y", "z")], decode_mapping=[]
    )()
    assert chain.encode("xy") == [ord("z") + 3] * 2
    with pytest.raises(ValueError, match=r"encode_mapping\[0\]"):
        with_regex_mapping(CodePointVocab, encode_mapping=[("a",)], decode_mapping=[])


def test_tokenize_fields_with_bos_eos():
    ds = grain.MapDataset.source([{"text": "hi", "other": "é", "n": 3}])
    out = tokenize(ds, vocab={"text": CodePointVocab(), "other": CodePointVocab()}, with_eos=True)
    (example,) = list(out)
    np.testing.assert_array_equal(example["text"], [ord("h") + 3, ord("i") + 3, 1])
    np.testing.assert_array_equal(example["other"], [ord("é") + 3, 1])
    assert example["n"] == 3  # Not in the mapping: passes through.
    one_vocab = config_for_function(CodePointVocab)  # A config instantiates.
    (example,) = list(
        tokenize(grain.MapDataset.source([{"a": b"z"}]), vocab=one_vocab, with_bos=True)
    )
    np.testing.assert_array_equal(example["a"], [2, ord("z") + 3])


def test_num_bytes_counts_utf8_bytes_and_eos():
    vocab = CodePointVocab()
    ids = np.array(vocab.encode("aé€") + [1, 0, 0])  # 1 + 2 + 3 bytes, EOS 1, pads 0.
    assert num_bytes(ids, vocab=vocab, eos_id=1) == 7
    batch = np.stack([ids, np.array(vocab.encode("bb") + [0, 0, 0, 0])])
    np.testing.assert_array_equal(num_bytes(batch, vocab=vocab, eos_id=1), [7, 2])
    with pytest.raises(ValueError, match="rank 1 or 2"):
        num_bytes(np.zeros((1, 1, 1), int), vocab=vocab, eos_id=1)


def test_count_num_bytes_adds_the_count():
    vocab = CodePointVocab()
    ds = grain.MapDataset.source([{"ids": np.array(vocab.encode("日本") + [1])}])
    (example,) = list(count_num_bytes(ds, input_key="ids", vocab=vocab))
    assert example["ids_num_bytes"] == 3 + 3 + 1
    (example,) = list(count_num_bytes(ds, input_key="ids", vocab=vocab, eos_id=99, output_key="n"))
    assert example["n"] == 6  # The id 1 is no EOS here (and decodes to no text).

    class NoEos(CodePointVocab):
        eos_id = None

    with pytest.raises(ValueError, match="no eos_id"):
        count_num_bytes(ds, input_key="ids", vocab=NoEos())
