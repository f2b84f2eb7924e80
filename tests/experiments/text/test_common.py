"""Tests axlearn/experiments/text/common.py: vocabulary lookup and the text source."""

from __future__ import annotations

import os
import shutil

import pytest

from axlearn.common import embedded_data
from axlearn.experiments.text.common import embedded_vocab_config, vocab, vocab_search_dirs


def test_shipped_vocab_is_found():
    v = embedded_vocab_config().instantiate()
    assert v.vocab_size == embedded_data.VOCAB_SIZE
    assert (v.pad_id, v.eos_id) == (0, 1)
    text = 'The "assert" statement<n>    x = 1'
    assert v.decode(v.encode(text)) == text


def test_byte_vocab_without_a_file():
    v = vocab(sentencepiece_model_name=None)
    assert v.encode("ab") == [ord("a") + 3, ord("b") + 3]


def test_data_dir_vocab_takes_precedence(tmp_path, monkeypatch):
    sp_dir = tmp_path / "tokenizers" / "sentencepiece"
    sp_dir.mkdir(parents=True)
    shutil.copy(embedded_data.vocab_path(), sp_dir / "mine.model")
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert vocab_search_dirs()[0] == str(sp_dir)
    assert vocab(sentencepiece_model_name="mine.model").vocab_size == embedded_data.VOCAB_SIZE


def test_missing_vocab_names_every_path(tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        vocab(sentencepiece_model_name="nope.model")
    msg = str(e.value)
    assert os.path.join(str(tmp_path), "tokenizers", "sentencepiece", "nope.model") in msg
    assert os.path.join(embedded_data.SENTENCEPIECE_DIR, "nope.model") in msg


def test_garbage_vocab_file_names_the_path(tmp_path, monkeypatch):
    sp_dir = tmp_path / "tokenizers" / "sentencepiece"
    sp_dir.mkdir(parents=True)
    (sp_dir / "bad.model").write_bytes(b"\x00\xffnot a model\x12\x34" * 10)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"bad\.model is not a valid sentencepiece model file"):
        vocab(sentencepiece_model_name="bad.model")
