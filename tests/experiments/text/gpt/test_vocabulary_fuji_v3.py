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


def _write_hf_tokenizer(path, *, pattern: str, specials: list) -> str:
    """A tokenizer.json that both HF `tokenizers` and FujiV3Vocabulary read: byte ids 0-255,
    merges he=256, ll=257, hell=258, ' w'=259, pre-tokenized by a Split on `pattern`."""
    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}

    def token(text: str) -> str:
        return "".join(alphabet[b] for b in text.encode("utf-8"))

    merges = [("h", "e"), ("l", "l"), ("he", "ll"), (" ", "w")]
    for i, (a, b) in enumerate(merges):
        vocab[token(a + b)] = 256 + i
    spec = {
        "version": "1.0",
        "added_tokens": [
            {
                "id": i,
                "content": s,
                "special": True,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
            }
            for s, i in specials
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[token(a), token(b)] for a, b in merges],
        },
    }
    path.write_text(json.dumps(spec), encoding="utf-8")
    return str(path)


def test_silent_text_the_regex_skips_is_encoded_byte_level(tmp_path):
    """Silent case: with a file's regex matching letters only, encode('abc cab') lost the space.

    The reference is Hugging Face `tokenizers` reading the same file: its Split keeps the text
    between matches as pieces; ids and round trips must agree."""
    import tokenizers

    path = _write_hf_tokenizer(tmp_path / "t.json", pattern=r"\p{L}+", specials=[])
    vocab = FujiV3Vocabulary(path)
    hf = tokenizers.Tokenizer.from_file(path)
    texts = ["abc cab", "hello, world!!  \n 12 hell", " lead and trail ", "", "ünï ☃ x", "  "]
    for text in texts:
        ids = vocab.encode(text)
        assert ids == hf.encode(text).ids, text
        assert vocab.decode(ids) == text
    assert vocab.encode("abc cab") == [97, 98, 99, 32, 99, 97, 98]
    assert vocab.encode("hello world") == [258, 111, 32, 119, 111, 114, 108, 100]


def test_default_pattern_matches_tiktoken(tmp_path, vocab):
    """With Llama 3's regex (total), encode is tiktoken's own, and the general path agrees."""
    import tiktoken

    from axlearn.experiments.text.gpt import vocabulary_fuji_v3

    reference = tiktoken.Encoding(
        name="ref",
        pat_str=vocabulary_fuji_v3.DEFAULT_PATTERN,
        mergeable_ranks=dict(vocab.encoding._mergeable_ranks),
        special_tokens={},
    )
    general = FujiV3Vocabulary(_write_tokenizer(tmp_path / "t2.json"))
    general._total_pattern = False
    import regex

    general._regex = regex.compile(vocabulary_fuji_v3.DEFAULT_PATTERN)
    texts = ["abc cab", "hello   world\n\n x's 12345 ☃\t", "  trailing  ", "a\r\nb"]
    for text in texts:
        expected = reference.encode(text)
        assert vocab.encode(text) == expected == general.encode(text), text
        assert vocab.decode(expected) == text


def test_special_token_ids_outside_the_ordinary_range(tmp_path):
    """Silent case: an added special token got the id of an ordinary token."""
    path = _write_hf_tokenizer(
        tmp_path / "ok.json", pattern=r"\p{L}+", specials=[("<|end_of_text|>", 300)]
    )
    vocab = FujiV3Vocabulary(path)
    assert vocab.eos_id == 300 and vocab.decode([258, 300]) == "hell<|end_of_text|>"
    clash = _write_hf_tokenizer(
        tmp_path / "clash.json", pattern=r"\p{L}+", specials=[("<|end_of_text|>", 97)]
    )
    with pytest.raises(
        ValueError,
        match=r"special token '<\|end_of_text\|>' .* id 97, which is "
        r"ordinary token 'a''s; .*>= 260",
    ) as e:
        FujiV3Vocabulary(clash)
    assert "\n" not in str(e.value)
    twice = _write_hf_tokenizer(
        tmp_path / "twice.json", pattern=r"\p{L}+", specials=[("<|a|>", 300), ("<|b|>", 300)]
    )
    with pytest.raises(ValueError, match=r"special tokens '<\|a\|>' and '<\|b\|>' share id 300"):
        FujiV3Vocabulary(twice)


def test_fifo_or_deep_tokenizer_file_is_one_line(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    for name, match in [("fifo.json", "not a regular file"), ("deep.json", "not a valid")]:
        with pytest.raises(ValueError, match=match) as e:
            FujiV3Vocabulary(str(tmp_path / name))
        assert "\n" not in str(e.value) and len(str(e.value)) < 600
