"""Tests axlearn/common/input_t5.py: span-corruption statistics and a NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf

from axlearn.common.config import config_for_class
from axlearn.common.input_fake import fake_source
from axlearn.common.input_t5 import (
    _noise_span_to_unique_sentinel,
    apply_t5_mask,
    make_t5_autoregressive_inputs,
    random_spans_helper,
    random_spans_noise_mask,
    reduce_concat_tokens,
    select_random_chunk,
    split_tokens,
)
from axlearn.common.input_test_utils import python_docs_sentence_piece_vocab_file

VOCAB_CFG = config_for_class(seqio.SentencePieceVocabulary).set(
    sentencepiece_model_file=python_docs_sentence_piece_vocab_file, extra_ids=100
)


@pytest.fixture(name="vocab", scope="module")
def fixture_vocab():
    return VOCAB_CFG.instantiate()


def _np_corrupt(tokens: np.ndarray, noise: np.ndarray, vocab_size: int):
    """Hand-written reference: (source, target) of span corruption for a given noise mask.

    The source keeps non-noise tokens and puts one sentinel per noise run; the target does the
    same with the roles swapped. Sentinels count down from vocab_size - 1 in each.
    """

    def collapse(keep: np.ndarray) -> list[int]:
        out, sentinel = [], vocab_size
        for i, tok in enumerate(tokens):
            if keep[i]:
                out.append(int(tok))
            elif i == 0 or keep[i - 1]:
                sentinel -= 1
                out.append(sentinel)
        return out

    return collapse(~noise), collapse(noise)


def _interleave(source: list[int], target: list[int], first_sentinel: int) -> list[int]:
    """Rebuilds the original tokens: each source sentinel is replaced by the target's run."""
    runs, current = {}, None
    for t in target:
        if t >= first_sentinel:
            current = t
            runs[current] = []
        else:
            runs[current].append(t)
    out = []
    for t in source:
        out.extend(runs.get(t, []) if t >= first_sentinel else [t])
    return out


def test_noise_density_and_mean_span_length_statistics():
    tf.random.set_seed(0)
    seq_len, density, mean_span = 512, 0.15, 3.0
    masks = np.stack(
        [
            random_spans_noise_mask(
                seq_len=seq_len, noise_density=density, mean_noise_span_length=mean_span
            ).numpy()
            for _ in range(20)
        ]
    )
    num_noise = round(seq_len * density)
    num_spans = round(num_noise / mean_span)
    for mask in masks:
        assert mask.sum() == num_noise  # Exactly round(L * density) noise tokens.
        starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
        assert len(starts) == num_spans  # Exactly round(noise / mean) spans...
        assert not mask[0]  # ...after a first non-noise span.
    assert abs(masks.mean() - density) < 0.01
    assert masks.sum() / (num_spans * len(masks)) == pytest.approx(mean_span, rel=0.05)
    # Span starts are spread over the whole sequence (not all at one end).
    positions = np.flatnonzero(masks.reshape(-1)) % seq_len
    assert 0.4 < positions.mean() / seq_len < 0.6


def test_sentinels_match_numpy_reference_and_reconstruct(vocab):
    rng = np.random.default_rng(0)
    tokens = rng.integers(10, 4000, size=60).astype(np.int32)
    noise = random_spans_noise_mask(seq_len=60, noise_density=0.3, mean_noise_span_length=3.0)
    noise = noise.numpy()
    source = _noise_span_to_unique_sentinel(input_ids=tokens, noise_mask=noise, vocab=vocab)
    want_source, want_target = _np_corrupt(tokens, noise, vocab.vocab_size)
    assert source.numpy().tolist() == want_source
    target = _noise_span_to_unique_sentinel(input_ids=tokens, noise_mask=~noise, vocab=vocab)
    assert target.numpy().tolist() == want_target
    sentinels = [t for t in want_source if t >= vocab.vocab_size - 100]
    assert sentinels == list(range(vocab.vocab_size - 1, vocab.vocab_size - 1 - len(sentinels), -1))

    ds = fake_source(
        is_training=False,
        examples=[{"source_ids": tokens}],
        spec={"source_ids": tf.TensorSpec([None], tf.int32)},
    )()
    tf.random.set_seed(1)
    out = next(iter(apply_t5_mask(noise_density=0.3, vocab_cfg=VOCAB_CFG)(ds)))
    src, tgt = out["source_ids"].numpy().tolist(), out["target_labels"].numpy().tolist()
    assert _interleave(src, tgt, vocab.vocab_size - 100) == tokens.tolist()
    # Noise fraction of this example: target tokens that are not sentinels.
    num_noise = sum(t < vocab.vocab_size - 100 for t in tgt)
    assert num_noise == round(60 * 0.3)


def test_chunk_concat_split():
    ds = fake_source(
        is_training=False,
        examples=[{"source_ids": np.arange(1, 10, dtype=np.int32)}, {"source_ids": [20, 21]}],
        spec={"source_ids": tf.TensorSpec([None], tf.int32)},
    )()
    chunks = [x["source_ids"].numpy().tolist() for x in select_random_chunk(chunk_size=4)(ds)]
    assert chunks[0] in ([1, 2, 3, 4], [5, 6, 7, 8], [9]) and chunks[1] == [20, 21]
    joined = [x["source_ids"].numpy().tolist() for x in reduce_concat_tokens(batch_size=2)(ds)]
    assert joined == [[*range(1, 10), 20, 21]]
    pieces = [x["source_ids"].numpy().tolist() for x in split_tokens(max_tokens_per_segment=4)(ds)]
    assert pieces == [[1, 2, 3, 4], [5, 6, 7, 8], [9], [20, 21]]


def test_random_spans_helper_and_pipeline(vocab):
    raw, target = random_spans_helper(
        desired_source_length=512, noise_density=0.15, mean_noise_span_length=3.0
    )
    # Reference: the formula for the returned raw length, and that one more token overflows.
    noise = round(raw * 0.15)
    assert raw - noise + round(noise / 3.0) + 1 <= 512
    assert target == noise + round(noise / 3.0) + 1
    over = raw + 1
    assert over - round(over * 0.15) + round(round(over * 0.15) / 3.0) + 1 > 512

    examples = [{"source_ids": np.arange(10, 10 + n, dtype=np.int32)} for n in (40, 7, 25)]
    ds = fake_source(
        is_training=False, examples=examples, spec={"source_ids": tf.TensorSpec([None], tf.int32)}
    )()
    fn = make_t5_autoregressive_inputs(
        vocab_cfg=VOCAB_CFG, max_source_length=16, max_target_length=16, noise_density=0.3
    )
    tf.random.set_seed(2)
    for ex in fn(ds):
        assert ex["source_ids"][-1] == vocab.eos_id and ex["target_labels"][-1] == vocab.eos_id
        assert len(ex["source_ids"]) <= 16 and len(ex["target_labels"]) <= 16
        want_ids = [vocab.eos_id, *ex["target_labels"].numpy().tolist()[:-1]]
        assert ex["target_ids"].numpy().tolist() == want_ids
    with pytest.raises(ValueError, match="exceeds max target"):
        make_t5_autoregressive_inputs(
            vocab_cfg=VOCAB_CFG, max_source_length=64, max_target_length=4
        )
