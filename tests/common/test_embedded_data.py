"""Tests axlearn/common/embedded_data.py: the shipped corpus, its TFDS build and its entropy."""

from __future__ import annotations

import collections
import math

import numpy as np

from axlearn.common import embedded_data
from tests.common import input_test_utils

# The session fixture that builds the embedded data in a temporary cache dir.
embedded_cache = input_test_utils.embedded_cache


def test_corpus_splits():
    train = list(embedded_data.read_corpus("train"))
    valid = list(embedded_data.read_corpus("validation"))
    assert (len(train), len(valid)) == (1448, 67)
    assert not {d["id"] for d in train} & {d["id"] for d in valid}
    assert sum(len(d["text"]) for d in train + valid) > 1_000_000


def test_tfds_build_matches_corpus(embedded_cache):
    import tensorflow_datasets as tfds

    builder = tfds.builder(embedded_data.DATASET_NAME, data_dir=embedded_data.tfds_data_dir())
    assert builder.info.splits["validation"].num_examples == 67
    got = {
        ex["id"].decode(): ex["text"].decode()
        for ex in tfds.as_numpy(builder.as_dataset(split="validation"))
    }
    assert got == {d["id"]: d["text"] for d in embedded_data.read_corpus("validation")}


def test_unigram_entropy_against_numpy():
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=embedded_data.vocab_path())
    counts = collections.Counter()
    for doc in embedded_data.read_corpus("validation"):
        counts.update(sp.encode(doc["text"].replace("\n", "<n>")))
        counts[1] += 1  # EOS per document.
    p = np.array(list(counts.values()), dtype=np.float64)
    p /= p.sum()
    expected = float(-(p * np.log(p)).sum())
    got = embedded_data.corpus_unigram_entropy("validation")
    assert math.isclose(got, expected, rel_tol=1e-12)
    train = embedded_data.corpus_unigram_entropy("train")
    # Far below log(vocab size): the distribution is skewed, and a real LM must get below it.
    assert 5.0 < train < math.log(embedded_data.VOCAB_SIZE) - 1.5


def test_garbage_dataset_info_names_the_file(embedded_cache, tmp_path):
    """Issue 29 case 13: a garbage dataset_info.json in the built data set is a ValueError naming
    the file's folder and the fix, not a bare protobuf ParseError."""
    import os
    import shutil

    import pytest

    src = os.path.join(embedded_data.tfds_data_dir(), embedded_data.BUILDER_NAME)
    data_dir = tmp_path / "tfds"
    shutil.copytree(src, data_dir / embedded_data.BUILDER_NAME)
    (info,) = data_dir.glob(f"{embedded_data.BUILDER_NAME}/*/dataset_info.json")
    info.write_text("garbage{")
    folder = data_dir / embedded_data.BUILDER_NAME
    with pytest.raises(ValueError, match=f"dataset_info.json under {folder} is not valid") as e:
        embedded_data.prepare(str(data_dir))
    assert f"delete {folder} and rerun" in str(e.value)


def test_first_build_says_no_download(tmp_path, capsys, caplog):
    """Issue 38: the first run builds the embedded data set without TFDS's "Downloading and
    preparing dataset" line (the README promises no download); it says what it does instead."""
    import logging

    with caplog.at_level(logging.INFO, logger="absl"):
        embedded_data.prepare(str(tmp_path / "tfds"))
    out = capsys.readouterr()
    text = out.out + out.err + caplog.text
    assert "Downloading" not in text and "downloaded" not in text, text
    assert "has no dataset_info" not in text, text
    assert "from the corpus shipped in the package" in caplog.text and "no download" in caplog.text
    # The built data set is the corpus (its validation split's size).
    import tensorflow_datasets as tfds

    builder = tfds.builder(embedded_data.DATASET_NAME, data_dir=str(tmp_path / "tfds"))
    assert builder.info.splits["validation"].num_examples == 67
