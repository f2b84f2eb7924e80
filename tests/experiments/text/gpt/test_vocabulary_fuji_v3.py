"""Tests axlearn/experiments/text/gpt/vocabulary_fuji_v3.py on a small tokenizer.json made here."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from axlearn.common.config import config_for_class
from axlearn.experiments.text.gpt.vocabulary_fuji_v3 import FujiV3Vocabulary


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet of byte-level BPE files)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _write_tokenizer(path) -> str:
    """Bytes are ids 0-255 (id = byte value); merges he=256, ll=257, hell=258, ' w'=259;
    specials <|begin_of_text|>=260, <|end_of_text|>=261, <|finetune_right_pad_id|>=262."""
    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}

    def token(text: str) -> str:
        return "".join(alphabet[b] for b in text.encode("utf-8"))

    for i, text in enumerate(["he", "ll", "hell", " w"]):
        vocab[token(text)] = 256 + i
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"]
    spec = {
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
        "added_tokens": [
            {"id": 260 + i, "content": s, "special": True} for i, s in enumerate(specials)
        ],
    }
    path.write_text(json.dumps(spec), encoding="utf-8")
    return str(path)


@pytest.fixture(name="vocab")
def fixture_vocab(tmp_path) -> FujiV3Vocabulary:
    filename = _write_tokenizer(tmp_path / "tokenizer.json")
    return config_for_class(FujiV3Vocabulary).set(filename=filename).instantiate()


def test_encode_follows_bpe_ranks_and_decodes_back(vocab):
    # Hand-computed BPE: "hello" -> he, ll -> hell + o; " hello" -> ' ' + hell + o;
    # " world" -> ' w' + o r l d (bytes as ids).
    text = "hello hello world"
    expected = [258, 111, 32, 258, 111, 259, 111, 114, 108, 100]
    assert vocab.encode(text) == expected
    assert vocab.decode(expected) == text
    assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == expected
    assert vocab.decode_tf(tf.constant(expected)).numpy().decode() == text
    assert (vocab.vocab_size, vocab.eos_id, vocab.pad_id, vocab.bos_id) == (263, 261, 262, 260)
    # Special tokens in the text are plain text; decoding drops ids beyond the vocabulary.
    assert 261 not in vocab.encode("<|end_of_text|>")
    assert vocab.decode([258, 111, 999]) == "hello"
    assert vocab.decode([258, 261]) == "hell<|end_of_text|>"


def test_missing_and_malformed_files_are_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"vocab_cfg\.filename='nope\.json': .*not found"):
        FujiV3Vocabulary("nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json is not a valid tokenizer file .*filename"):
        FujiV3Vocabulary(str(bad))
    no_vocab = tmp_path / "empty.json"
    no_vocab.write_text(json.dumps({"model": {"vocab": {}}}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"empty\.json is not a valid tokenizer file"):
        FujiV3Vocabulary(str(no_vocab))
    for error in (FileNotFoundError, ValueError):
        try:
            FujiV3Vocabulary("nope.json" if error is FileNotFoundError else str(bad))
        except error as e:
            assert "\n" not in str(e)


def test_is_a_seqio_vocabulary_and_importing_needs_no_tensorflow(vocab):
    import os
    import subprocess
    import sys

    import seqio

    assert isinstance(vocab, seqio.Vocabulary)
    code = (
        "import sys\n"
        "import axlearn.experiments.text.gpt.c4_trainer\n"
        "assert 'tensorflow' not in sys.modules and 'seqio' not in sys.modules\n"
    )
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    )
    env = dict(os.environ, PYTHONPATH=root)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, env=env)
