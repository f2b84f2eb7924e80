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


def test_array_record_lm_state_records_and_checks_its_files(tmp_path):
    """The LM source's state lists its ArrayRecord files (through tokenizing, packing, batching
    and prefetch); a file replaced before the resume is refused, naming it."""
    import json

    from array_record.python import array_record_module

    from axlearn.common.input_grain import Input, InputStateError

    def write(path, docs):
        writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
        for d in docs:
            writer.write(d.encode("utf-8"))
        writer.close()

    path = tmp_path / "docs.array_record"
    write(path, DOCS)
    source = input_grain_lm.array_record_lm_source(
        is_training=True,
        vocab_cfg=VOCAB,
        max_sequence_length=6,
        global_batch_size=2,
        paths=[str(path)],
        window_size=2,
        shuffle_window=4,
    )
    cfg = Input.default_config().set(name="input", source=source)
    inp = cfg.instantiate(parent=None)
    it = iter(inp)
    next(it)
    state = inp.iterator_state(it)
    (entry,) = json.loads(state)["sources"]
    assert entry["path"] == str(path) and entry["size"] == path.stat().st_size
    expected = next(it)["input_ids"].tolist()
    assert next(cfg.instantiate(parent=None).restore_iterator(state))["input_ids"].tolist() == (
        expected
    )
    write(path, [d.upper() for d in DOCS])  # Same size, other text.
    with pytest.raises(InputStateError, match="docs.array_record changed since"):
        cfg.instantiate(parent=None).restore_iterator(state)


def test_make_autoregressive_inputs_windowed_matches_numpy():
    import functools  # pylint: disable=import-outside-toplevel

    from axlearn.common import input_grain_lm as lm  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 100, size=n) for n in [3, 7, 2, 9, 4, 5, 1]]
    for window_size, max_len, fraction in [(1, 4, 1.0), (3, 4, 0.5), (2, 3, 0.0)]:
        split_fn = functools.partial(lm._trim_or_pad_and_batch, max_padding_fraction=fraction)
        ds = grain.MapDataset.source([{"target_labels": d} for d in docs])
        ds = lm._make_autoregressive_inputs(
            ds,
            max_len=max_len,
            split_fn=split_fn,
            window_size=window_size,
            packing_fn=lm.windowed_packing,
        )
        got = list(ds)
        expected = []
        for start in range(0, len(docs), window_size):
            flat = np.concatenate(docs[start : start + window_size])
            shifted = np.concatenate([flat[-1:], flat[:-1]])
            rows, rem = divmod(len(flat), max_len)
            keep = rem > int(max_len * (1 - fraction))
            for arr_t, arr_i in [(flat, shifted)]:
                if keep:
                    pad = np.full(max_len - rem, -1)
                    arr_t, arr_i = np.concatenate([arr_t, pad]), np.concatenate([arr_i, pad])
                n = (rows + keep) * max_len
                for r in range(0, n, max_len):
                    expected.append((arr_i[r : r + max_len], arr_t[r : r + max_len]))
        assert len(got) == len(expected)
        for row, (inputs, targets) in zip(got, expected):
            np.testing.assert_array_equal(row["input_ids"], inputs)
            np.testing.assert_array_equal(row["target_labels"], targets)
    one = lm._make_autoregressive_inputs(
        grain.MapDataset.source([{"target_labels": np.array([10, 11, 12])}]),
        max_len=3,
        packing_fn=lm.windowed_packing,
    )
    (row,) = list(one)
    np.testing.assert_array_equal(row["input_ids"], [12, 10, 11])
    with pytest.raises(ValueError, match="rank-1"):
        lm._trim_or_pad_and_batch(np.zeros((2, 2)), max_len=2)


def _reference_stream_chunks(docs, max_len, window_size):
    """The chunks streaming packing must emit, by hand: each window's (or, without a window, the
    whole stream's) tokens concatenated and cut every max_len tokens (the last cut may be short)."""
    window_size = window_size or len(docs)
    chunks = []
    for start in range(0, len(docs), window_size):
        flat = np.concatenate([np.asarray(d, np.int64) for d in docs[start : start + window_size]])
        chunks.extend(flat[i : i + max_len] for i in range(0, len(flat), max_len))
    return chunks


def _as_one_row(chunk):
    return {"target_labels": np.asarray(chunk["target_labels"])[None]}


@pytest.mark.parametrize("max_len,window_size", [(4, None), (4, 2), (3, 3), (5, 1), (16, None)])
def test_streaming_packing_chunks_match_reference(max_len, window_size):
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 50, size=n) for n in [3, 7, 0, 2, 9, 4, 5, 1, 11]]
    ds = grain.MapDataset.source([{"target_labels": d, "other": 1} for d in docs])
    out = list(
        input_grain_lm.streaming_packing(
            ds, max_len=max_len, inner=_as_one_row, window_size=window_size
        )
    )
    expected = _reference_stream_chunks(docs, max_len, window_size)
    assert len(out) == len(expected)
    for row, chunk in zip(out, expected):
        assert set(row) == {"target_labels"}  # Only the packed key is kept.
        np.testing.assert_array_equal(row["target_labels"], chunk)
    # Every token appears exactly once, in order.
    np.testing.assert_array_equal(
        np.concatenate([r["target_labels"] for r in out]), np.concatenate(docs)
    )


def test_streaming_packing_drops_what_inner_drops_and_checks_rows():
    docs = [np.arange(1, 6), np.arange(10, 13)]  # 8 tokens: chunks [1..3], [4, 5, 10], [11, 12].
    ds = grain.MapDataset.source([{"target_labels": d} for d in docs])

    def keep_full(chunk):
        ids = chunk["target_labels"]
        return {"target_labels": ids[None] if len(ids) == 3 else ids[:0][None][:0]}

    out = list(input_grain_lm.streaming_packing(ds, max_len=3, inner=keep_full))
    assert [r["target_labels"].tolist() for r in out] == [[1, 2, 3], [4, 5, 10]]
    two_rows = lambda c: {"target_labels": np.stack([c["target_labels"]] * 2)}  # noqa: E731
    with pytest.raises(ValueError, match="expected 1"):
        list(input_grain_lm.streaming_packing(ds, max_len=3, inner=two_rows))
    with pytest.raises(ValueError, match="must be positive"):
        input_grain_lm.streaming_packing(ds, max_len=0, inner=_as_one_row)


@pytest.mark.parametrize("window_size", [None, 2])
def test_streaming_packing_resumes_exactly_from_every_step(window_size):
    import json  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(2)
    docs = [rng.integers(1, 50, size=n) for n in [2, 13, 3, 1, 6, 0, 8]]
    ds = input_grain_lm.streaming_packing(
        grain.MapDataset.source([{"target_labels": d} for d in docs]),
        max_len=4,
        inner=_as_one_row,
        window_size=window_size,
    )
    it = iter(ds)
    states, rows = [], []
    while True:
        states.append(json.loads(json.dumps(it.get_state())))  # States are JSON.
        try:
            rows.append(next(it)["target_labels"].tolist())
        except StopIteration:
            break
    for step, state in enumerate(states):
        fresh = iter(ds)
        fresh.set_state(state)
        assert [r["target_labels"].tolist() for r in fresh] == rows[step:]


def test_streaming_and_windowed_packing_agree_on_targets():
    import functools  # pylint: disable=import-outside-toplevel

    lm = input_grain_lm
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 100, size=n) for n in [2, 9, 3, 6, 5, 7, 4]]
    split_fn = functools.partial(lm._trim_or_pad_and_batch, max_padding_fraction=0.5)
    rows = {}
    for packing_fn in (lm.windowed_packing, lm.streaming_packing):
        rows[packing_fn] = list(
            lm._make_autoregressive_inputs(
                grain.MapDataset.source([{"target_labels": d} for d in docs]),
                max_len=6,
                split_fn=split_fn,
                window_size=3,
                packing_fn=packing_fn,
            )
        )
    assert len(rows[lm.windowed_packing]) == len(rows[lm.streaming_packing]) > 0
    for w, s in zip(rows[lm.windowed_packing], rows[lm.streaming_packing]):
        np.testing.assert_array_equal(w["target_labels"], s["target_labels"])
        # Only the first input differs (rolled within the window vs within the chunk).
        np.testing.assert_array_equal(w["input_ids"][1:], s["input_ids"][1:])
        n = int((s["target_labels"] != -1).sum())  # Tokens in the row (then -1 padding).
        np.testing.assert_array_equal(s["input_ids"][1:n], s["target_labels"][: n - 1])


def test_drop_empty_targets_keeps_rows_with_bytes():
    example = {
        "input_ids": np.arange(8).reshape(4, 2),
        "target_num_bytes": np.array([0, 3, 0, 1]),
    }
    out = input_grain_lm._drop_empty_targets(example)
    np.testing.assert_array_equal(out["input_ids"], [[2, 3], [6, 7]])
    np.testing.assert_array_equal(out["target_num_bytes"], [3, 1])
