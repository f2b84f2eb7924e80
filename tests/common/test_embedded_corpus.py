"""Tests axlearn/common/embedded_corpus.py: the split rule and the corpus reader, on small files."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from axlearn.common import embedded_corpus, embedded_data


def _write(path, records):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for record in records:
            f.write((record if isinstance(record, str) else json.dumps(record)) + "\n")


def test_split_of_is_one_in_twenty_by_crc32():
    ids = [f"doc-{i}" for i in range(400)]
    expected = ["validation" if zlib.crc32(i.encode()) % 20 == 0 else "train" for i in ids]
    assert [embedded_corpus.split_of(i) for i in ids] == expected
    assert 5 <= expected.count("validation") <= 40


def test_read_corpus_filters_by_split_in_file_order(tmp_path):
    ids = [f"doc-{i}" for i in range(60)]
    path = tmp_path / "corpus.jsonl.gz"
    _write(path, [{"id": i, "text": f"text of {i}"} for i in ids])
    every = list(embedded_corpus.read_corpus(path=str(path)))
    assert [d["id"] for d in every] == ids
    valid = [d["id"] for d in embedded_corpus.read_corpus("validation", path=str(path))]
    train = [d["id"] for d in embedded_corpus.read_corpus("train", path=str(path))]
    assert valid == [i for i in ids if zlib.crc32(i.encode()) % 20 == 0]
    assert train == [i for i in ids if i not in valid]


def test_read_corpus_errors_name_the_problem(tmp_path):
    path = tmp_path / "corpus.jsonl.gz"
    _write(path, [{"id": "a", "text": "ok"}, {"id": "b", "body": "no text"}])
    with pytest.raises(ValueError, match=r"corpus.jsonl.gz:2: malformed corpus record"):
        list(embedded_corpus.read_corpus(path=str(path)))
    with pytest.raises(ValueError, match="Unknown split 'test'"):
        list(embedded_corpus.read_corpus("test", path=str(path)))
    with pytest.raises(FileNotFoundError, match="regenerate it with"):
        list(embedded_corpus.read_corpus(path=str(tmp_path / "missing.gz")))


def test_embedded_data_reexports_the_corpus_names():
    for name in ("BUILDER_NAME", "CORPUS_PATH", "read_corpus", "split_of"):
        assert getattr(embedded_data, name) is getattr(embedded_corpus, name)
