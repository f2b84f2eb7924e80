"""Tests axlearn.common.input_grain_lm against hand-written NumPy references."""

import grain
import numpy as np
import pytest

from axlearn.common import input_grain_lm
from axlearn.common.input_grain import maybe_to_iter_dataset


class CharVocab:
    """A vocabulary of bytes: id = byte + 2 (0 pad, 1 EOS); each id stands for one byte."""

    pad_id, eos_id, vocab_size = 0, 1, 258

    def encode(self, text):
        return [b + 2 for b in text.encode("utf-8")]

    def decode(self, ids):
        return bytes(i - 2 for i in ids if i >= 2).decode("utf-8", errors="replace")


VOCAB = CharVocab()
DOCS = ["hello world", "a", "the quick brown fox jumps", "xy", "0123456789abcdef", "zz top"]


def reference_pack(docs, max_len):
    """Next-fit packing written out by hand: chunks of max_len, a chunk that does not fit closes
    the row (padded), segment ids count chunks from 1, positions restart per chunk."""
    rows, row = [], []

    def flush():
        ids = np.zeros(max_len, np.int32)
        tgt = np.zeros(max_len, np.int32)
        seg = np.zeros(max_len, np.int32)
        pos = np.zeros(max_len, np.int32)
        at = 0
        for s, (ci, ct) in enumerate(row, start=1):
            for j in range(len(ci)):
                ids[at], tgt[at], seg[at], pos[at] = ci[j], ct[j], s, j
                at += 1
        rows.append((ids, tgt, seg, pos))

    for doc in docs:
        t = VOCAB.encode(doc)
        inputs, targets = [1] + t, t + [1]
        for start in range(0, len(inputs), max_len):
            chunk = (inputs[start : start + max_len], targets[start : start + max_len])
            if sum(len(c[0]) for c in row) + len(chunk[0]) > max_len:
                flush()
                row = []
            row.append(chunk)
    if row:
        flush()
    return rows


def reference_split(docs, max_len, window_size):
    """Concatenate-and-split by hand: EOS after each doc, inputs shifted right by one."""
    rows = []
    for w in range(0, len(docs), window_size):
        stream = []
        for doc in docs[w : w + window_size]:
            stream += VOCAB.encode(doc) + [1]
        inputs = [stream[-1]] + stream[:-1]
        for start in range(0, len(stream), max_len):
            tgt = stream[start : start + max_len]
            ids = inputs[start : start + max_len]
            pad = [0] * (max_len - len(tgt))
            rows.append((np.array(ids + pad), np.array(tgt + pad)))
    return rows


def docs_ds():
    return grain.MapDataset.source([{"text": d} for d in DOCS])


@pytest.mark.parametrize("max_len", [4, 7, 16])
def test_streaming_packing_matches_numpy_reference(max_len):
    ds = input_grain_lm.text_to_lm_training_input(
        docs_ds(), vocab=VOCAB, max_len=max_len, packing="streaming"
    )
    got = list(ds)
    want = reference_pack(DOCS, max_len)
    assert len(got) == len(want)
    for g, (ids, tgt, seg, pos) in zip(got, want):
        np.testing.assert_array_equal(g["input_ids"], ids)
        np.testing.assert_array_equal(g["target_labels"], tgt)
        np.testing.assert_array_equal(g["input_segment_ids"], seg)
        np.testing.assert_array_equal(g["input_positions"], pos)
        assert g["target_num_bytes"] == np.count_nonzero(tgt)  # One byte per non-pad target.
    # Every token of every document appears exactly once.
    total = sum(len(d.encode()) + 1 for d in DOCS)
    assert sum(int(np.count_nonzero(g["input_segment_ids"])) for g in got) == total


@pytest.mark.parametrize("max_len,window", [(5, 2), (8, 10)])
def test_windowed_split_matches_numpy_reference(max_len, window):
    ds = input_grain_lm.text_to_lm_training_input(
        docs_ds(), vocab=VOCAB, max_len=max_len, window_size=window
    )
    got = list(ds)
    want = reference_split(DOCS, max_len, window)
    assert len(got) == len(want)
    for g, (ids, tgt) in zip(got, want):
        np.testing.assert_array_equal(g["input_ids"], ids)
        np.testing.assert_array_equal(g["target_labels"], tgt)
        assert set(g) == {"input_ids", "target_labels", "target_num_bytes"}


def test_windowed_drops_short_tails():
    # max_padding_fraction=0.5: a tail row is kept only with more than half its tokens real.
    ds = input_grain_lm.text_to_lm_training_input(
        grain.MapDataset.source([{"text": "abcdefghij"}]),  # 11 tokens with EOS.
        vocab=VOCAB,
        max_len=4,
        max_padding_fraction=0.5,
    )
    assert len(list(ds)) == 3  # 11 = 2 * 4 + 3: a tail of 3 > 2 tokens is kept (padded).
    ds = input_grain_lm.text_to_lm_training_input(
        grain.MapDataset.source([{"text": "abcdefgh"}]),  # 9 tokens: tail of 1 dropped.
        vocab=VOCAB,
        max_len=4,
        max_padding_fraction=0.5,
    )
    assert len(list(ds)) == 2


@pytest.mark.parametrize("packing", ["windowed", "streaming"])
def test_resume_mid_row_is_exact(packing):
    source = grain.MapDataset.source([{"text": d} for d in DOCS]).repeat(3)
    ds = input_grain_lm.text_to_lm_training_input(
        source, vocab=VOCAB, max_len=6, packing=packing, window_size=2, shuffle_window=4, seed=1
    )
    it = iter(ds)
    reference, states = [], []
    for _ in range(25):
        states.append(it.get_state())
        reference.append(next(it)["input_ids"].tobytes())
    for k in (0, 1, 7, 13, 24):
        it2 = iter(ds)
        it2.set_state(states[k])
        assert [next(it2)["input_ids"].tobytes() for _ in range(25 - k)] == reference[k:]


def test_eval_windows_score_every_token_once():
    ds = input_grain_lm.text_to_lm_eval_input(docs_ds(), vocab=VOCAB, max_len=8, stride=3)
    windows = list(ds)
    scored = sum(int(w["target_num_bytes"]) for w in windows)
    assert scored == sum(len(d.encode()) + 1 for d in DOCS)
    # The long document (25 chars, 26 tokens): windows start 0, 3, ... each scoring new targets.
    for w in windows:
        assert w["input_ids"].shape == (8,)
        assert int(w["target_num_bytes"]) == np.count_nonzero(w["target_labels"])
    with pytest.raises(ValueError, match="stride"):
        input_grain_lm.text_to_lm_eval_input(docs_ds(), vocab=VOCAB, max_len=8, stride=9)


def test_bad_packing_mode():
    with pytest.raises(ValueError, match="packing"):
        input_grain_lm.text_to_lm_training_input(
            maybe_to_iter_dataset(docs_ds()), vocab=VOCAB, max_len=4, packing="best_fit"
        )
