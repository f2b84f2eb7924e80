"""Tests axlearn.common.embedded_array_record: a split's documents, written once, in order."""

import gzip
import json

import pytest

from axlearn.common import embedded_array_record
from axlearn.common.embedded_corpus import split_of
from axlearn.common.input_grain import array_record_dataset


def _corpus(tmp_path, n=60):
    path = tmp_path / "corpus.jsonl.gz"
    docs = [{"id": f"doc{i}", "text": f"text {i}\nline é"} for i in range(n)]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    return str(path), docs


def test_prepare_writes_each_split_once(tmp_path):
    corpus, docs = _corpus(tmp_path)
    out = str(tmp_path / "ar")
    for split in ("train", "validation"):
        path = embedded_array_record.prepare_array_record(split, directory=out, corpus_path=corpus)
        expected = [d["text"].encode() for d in docs if split_of(d["id"]) == split]
        assert expected and list(array_record_dataset(path)) == expected
    # A second call reuses the file (not rewritten).
    mtime = (tmp_path / "ar" / "train-v1.array_record").stat().st_mtime_ns
    embedded_array_record.prepare_array_record("train", directory=out, corpus_path=corpus)
    assert (tmp_path / "ar" / "train-v1.array_record").stat().st_mtime_ns == mtime


def test_unknown_split(tmp_path):
    corpus, _ = _corpus(tmp_path)
    with pytest.raises(ValueError, match="Unknown split"):
        embedded_array_record.prepare_array_record(
            "test", directory=str(tmp_path), corpus_path=corpus
        )
