"""T5's span-corruption inputs (the "denoising" pre-training objective).

A token sequence is split into alternating non-noise and noise spans (starting with non-noise);
about `noise_density` of the tokens are noise, in spans of mean length `mean_noise_span_length`.
The encoder input keeps the non-noise tokens and replaces each noise span by one sentinel; the
target is each sentinel followed by the noise span it stands for. Sentinels are the last ids of
the vocabulary, counting down: the first span gets `vocab_size - 1`, the next `vocab_size - 2`.
Example (vocab_size 32100):

    tokens         [10, 11, 12, 13, 14, 15]    noise  [F, T, T, F, F, T]
    source_ids     [10, 32099, 13, 14, 32098]
    target_labels  [32099, 11, 12, 32098, 15]

`make_t5_autoregressive_inputs` chains the whole pipeline: `select_random_chunk`,
`reduce_concat_tokens`, `split_tokens` (to the length `random_spans_helper` computes so that the
noised source fills `max_source_length`), `apply_t5_mask`, EOS, and the decoder inputs.

TensorFlow and seqio are imported lazily: importing this module does not import them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from axlearn.common.config import InstantiableConfig, config_for_function
from axlearn.common.input_lm_seq2seq import ModelType

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn


def _map(fn):
    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)

    return process


def select_random_chunk(*, chunk_size: int, input_key: str = "source_ids") -> DatasetToDatasetFn:
    """Keeps one random chunk of at most `chunk_size` tokens of each (non-empty) example.

    The sequence is cut into consecutive chunks of `chunk_size` (the last may be shorter) and one
    is picked uniformly. Empty examples are dropped, as are all fields but `input_key`.

    Args:
        chunk_size: The chunk length.
        input_key: The token field.

    Returns:
        A DatasetToDatasetFn to `{input_key: chunk}` examples.
    """

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def pick(example):
            tokens = example[input_key]
            n = tf.shape(tokens)[0]
            num_chunks = (n + chunk_size - 1) // chunk_size
            start = chunk_size * tf.random.uniform([], maxval=num_chunks, dtype=tf.int32)
            return {input_key: tokens[start : tf.minimum(start + chunk_size, n)]}

        ds = ds.filter(lambda x: tf.size(x[input_key]) > 0)
        return ds.map(pick, num_parallel_calls=tf.data.AUTOTUNE)

    return process


def reduce_concat_tokens(*, batch_size: int, input_key: str = "source_ids") -> DatasetToDatasetFn:
    """Concatenates every `batch_size` consecutive examples into one (the last group may be
    smaller).

    Tokens equal to 0 are taken as padding and dropped, so inputs must not contain id 0. All
    fields but `input_key` are dropped.

    Args:
        batch_size: How many examples are joined.
        input_key: The token field.

    Returns:
        A DatasetToDatasetFn.
    """

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ds = ds.map(lambda x: {input_key: x[input_key]}, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.padded_batch(batch_size, padded_shapes={input_key: [-1]})

        def flatten(x):
            tokens = tf.reshape(x[input_key], [-1])
            return {input_key: tf.boolean_mask(tokens, tokens != 0)}

        return ds.map(flatten, num_parallel_calls=tf.data.AUTOTUNE)

    return process


def random_spans_helper(
    *,
    desired_source_length: int,
    noise_density: float,
    mean_noise_span_length: float,
    source_sentinel_length: int = 1,
    target_sentinel_length: int = 1,
) -> tuple[int, int]:
    """The raw length whose noised source (with EOS) is at most `desired_source_length`.

    For a raw length L: noise = round(L * density), spans = round(noise / mean span length);
    source = L - noise + spans * source_sentinel_length + 1; target = noise + spans *
    target_sentinel_length + 1. The largest L whose source fits is returned; with density 0.5
    the pair is nudged so the target is not longer than the source.

    Args:
        desired_source_length: The encoder input length.
        noise_density: Fraction of noise tokens.
        mean_noise_span_length: Mean noise span length.
        source_sentinel_length: Tokens per sentinel in the source.
        target_sentinel_length: Tokens per sentinel in the target.

    Returns:
        (raw tokens per example, noised target length including EOS).
    """

    def lengths(raw: int) -> tuple[int, int]:
        noise = int(round(raw * noise_density))
        spans = int(round(noise / mean_noise_span_length))
        source = raw - noise + spans * source_sentinel_length + 1
        target = noise + spans * target_sentinel_length + 1
        return source, target

    raw = desired_source_length - 1
    while lengths(raw + 1)[0] <= desired_source_length:
        raw += 1
    source, target = lengths(raw)
    if noise_density == 0.5 and target > source:
        raw, target = raw - 1, target - 1
    return raw, target


def split_tokens(
    *, max_tokens_per_segment: int, input_key: str = "source_ids"
) -> DatasetToDatasetFn:
    """Splits each example into consecutive segments of `max_tokens_per_segment` tokens.

    Only the last segment of an example may be shorter; empty examples are dropped.

    Args:
        max_tokens_per_segment: The segment length.
        input_key: The token field (other fields are dropped).

    Returns:
        A DatasetToDatasetFn yielding one example per segment.
    """

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def segments(x):
            tokens = x[input_key]
            n = tf.shape(tokens, out_type=tf.int64)[0]
            starts = tf.range(0, n, max_tokens_per_segment, dtype=tf.int64)
            limits = tf.minimum(starts + max_tokens_per_segment, n)
            ragged = tf.RaggedTensor.from_row_limits(tokens, limits)
            return tf.data.Dataset.from_tensor_slices({input_key: ragged})

        ds = ds.filter(lambda x: tf.size(x[input_key]) > 0)
        ds = ds.flat_map(segments)
        return ds.map(lambda x: {input_key: x[input_key]})

    return process


def _random_segmentation(seq_len: Any, num_segments: Any) -> tf.Tensor:
    """Splits `seq_len` items into `min(num_segments, seq_len)` random non-empty segments.

    The cut points are a uniformly random subset of the `seq_len - 1` gaps.

    Args:
        seq_len: The number of items (>= 1).
        num_segments: The number of segments wanted (>= 1).

    Returns:
        int32 [min(num_segments, seq_len)] positive lengths summing to `seq_len`.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    gaps = tf.range(seq_len - 1)
    is_cut = tf.random.shuffle(tf.cast(gaps < num_segments - 1, tf.int32))
    segment_of_item = tf.cumsum(tf.concat([[0], is_cut], axis=0))
    return tf.math.segment_sum(tf.ones_like(segment_of_item), segment_of_item)


def random_spans_noise_mask(
    *, seq_len: Any, noise_density: float, mean_noise_span_length: float
) -> tf.Tensor:
    """A random noise mask of alternating non-noise/noise spans, starting with non-noise.

    With L = max(seq_len, 2): noise tokens = clip(round(L * density), 1, L - 1), noise spans =
    max(round(noise / mean_noise_span_length), 1), and as many non-noise spans; every such mask
    is equally likely. The mask is computed for L and cut to `seq_len`.

    Args:
        seq_len: The sequence length (int or scalar tensor).
        noise_density: Fraction of noise tokens (0: no noise).
        mean_noise_span_length: Mean noise span length.

    Returns:
        bool [seq_len]: True at noise tokens.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if noise_density == 0:
        return tf.zeros([seq_len], tf.bool)
    length = tf.maximum(seq_len, 2)
    num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise = tf.clip_by_value(num_noise, 1, length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32)
    num_spans = tf.maximum(num_spans, 1)
    noise_lengths = _random_segmentation(num_noise, num_spans)
    clean_lengths = _random_segmentation(length - num_noise, num_spans)
    # Span k (0-based) is noise when k is odd: [clean_0, noise_0, clean_1, noise_1, ...].
    span_lengths = tf.reshape(tf.stack([clean_lengths, noise_lengths], axis=1), [-1])
    span_of_token = tf.repeat(tf.range(tf.size(span_lengths)), span_lengths)
    return tf.equal(span_of_token % 2, 1)[:seq_len]


def _noise_span_to_unique_sentinel(*, input_ids: Any, noise_mask: Any, vocab: Any) -> tf.Tensor:
    """Replaces each run of noise tokens by one sentinel (vocab_size - 1, vocab_size - 2, ...).

    Args:
        input_ids: Token ids [seq_len].
        noise_mask: bool [seq_len].
        vocab: The seqio vocabulary (`vocab_size` includes its extra ids).

    Returns:
        The ids with each noise run collapsed to its sentinel (same dtype).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    input_ids = tf.convert_to_tensor(input_ids)
    noise_mask = tf.convert_to_tensor(noise_mask, dtype=tf.bool)
    previous = tf.concat([[False], noise_mask[:-1]], axis=0)[: tf.size(noise_mask)]
    run_start = tf.logical_and(noise_mask, tf.logical_not(previous))
    run_rest = tf.logical_and(noise_mask, previous)
    sentinels = vocab.vocab_size - tf.cumsum(tf.cast(run_start, input_ids.dtype))
    replaced = tf.where(run_start, sentinels, input_ids)
    return tf.boolean_mask(replaced, tf.logical_not(run_rest))


def _nonnoise_span_to_unique_sentinel(*, input_ids: Any, noise_mask: Any, vocab: Any) -> tf.Tensor:
    """Like `_noise_span_to_unique_sentinel`, for the runs of non-noise tokens (the targets)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return _noise_span_to_unique_sentinel(
        input_ids=input_ids,
        noise_mask=tf.logical_not(tf.convert_to_tensor(noise_mask, dtype=tf.bool)),
        vocab=vocab,
    )


def apply_t5_mask(
    *,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    source_key: str = "source_ids",
    target_key: str = "target_labels",
    vocab_cfg: InstantiableConfig,
) -> DatasetToDatasetFn:
    """Span-corrupts `source_key`: noise spans become sentinels; the target holds them.

    The target mask is the inverse of the source mask, so interleaving the two by sentinel
    gives back the original tokens.

    Args:
        noise_density: Fraction of noise tokens.
        mean_noise_span_length: Mean noise span length.
        source_key: The token field (overwritten with the corrupted source).
        target_key: The field the targets are written to.
        vocab_cfg: Config of the seqio vocabulary (its last ids are the sentinels).

    Returns:
        A DatasetToDatasetFn.
    """
    vocab = vocab_cfg.instantiate()

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ids = example[source_key]
        noise = random_spans_noise_mask(
            seq_len=tf.shape(ids)[0],
            noise_density=noise_density,
            mean_noise_span_length=mean_noise_span_length,
        )
        example[source_key] = _noise_span_to_unique_sentinel(
            input_ids=ids, noise_mask=noise, vocab=vocab
        )
        example[target_key] = _nonnoise_span_to_unique_sentinel(
            input_ids=ids, noise_mask=noise, vocab=vocab
        )
        return example

    return _map(example_fn)


def map_prefix_to_value(is_training: bool, value: int = 0) -> DatasetToDatasetFn:
    """Sets the decoder's first token to `value` (0, as T5X does). Apply after packing.

    Training examples (`{"target": {"input_ids", ["positions"]}}`) get `value` at every segment
    start (position 0) when packed, else at index 0. Evaluation examples get `"prefix": [value]`.

    Args:
        is_training: Which of the two forms the examples have.
        value: The first decoder token.

    Returns:
        A DatasetToDatasetFn.
    """

    def train_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        target = example["target"]
        ids = target["input_ids"]
        if "positions" in target:
            target["input_ids"] = tf.where(target["positions"] == 0, tf.cast(value, ids.dtype), ids)
        else:
            target["input_ids"] = tf.concat([tf.constant([value], ids.dtype), ids[1:]], axis=0)
        return example

    def eval_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        example["prefix"] = tf.constant([value])
        return example

    return _map(train_fn if is_training else eval_fn)


def _append_eos_after_trim(*, eos_id: int, lengths: dict[str, int]) -> DatasetToDatasetFn:
    """Trims each field to `length - 1` tokens and appends EOS."""

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        for key, length in lengths.items():
            ids = example[key][: length - 1]
            example[key] = tf.concat([ids, tf.constant([eos_id], ids.dtype)], axis=0)
        return example

    return _map(example_fn)


def _encoder_decoder_inputs(*, prefix_id: int) -> DatasetToDatasetFn:
    """Adds `prefix` = [prefix_id] and `target_ids` = prefix + target_labels[:-1]."""

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        labels = example["target_labels"]
        prefix = tf.constant([prefix_id], labels.dtype)
        return {
            "prefix": prefix,
            "source_ids": example["source_ids"],
            "target_ids": tf.concat([prefix, labels[:-1]], axis=0),
            "target_labels": labels,
        }

    return _map(example_fn)


def make_t5_autoregressive_inputs(
    *,
    model_type: ModelType = ModelType.ENCODER_DECODER,
    vocab_cfg: InstantiableConfig,
    max_source_length: int,
    max_target_length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    max_chunk_size: int = 65536,
    num_sequences_to_concat: int = 128,
) -> DatasetToDatasetFn:
    """T5's span-corruption pipeline from `{"source_ids": tokens}` (no BOS/EOS) examples.

    Picks a random chunk of at most `max_chunk_size` tokens per document, concatenates
    `num_sequences_to_concat` documents, splits them into pieces whose corrupted source fits
    `max_source_length` (`random_spans_helper`), corrupts, trims and appends EOS, and adds the
    decoder inputs: `prefix` [EOS] and `target_ids` = [EOS] + target_labels[:-1].

    Args:
        model_type: Must be ENCODER_DECODER.
        vocab_cfg: Config of the seqio vocabulary (with extra ids for the sentinels).
        max_source_length: Encoder input length (EOS included).
        max_target_length: Decoder length (EOS included).
        noise_density: Fraction of noise tokens.
        mean_noise_span_length: Mean noise span length.
        max_chunk_size: Longest chunk kept per document.
        num_sequences_to_concat: Documents concatenated before splitting.

    Returns:
        A DatasetToDatasetFn to `{"prefix", "source_ids", "target_ids", "target_labels"}`.

    Raises:
        NotImplementedError: If `model_type` is not ENCODER_DECODER.
        ValueError: If the noised targets would exceed `max_target_length`.
    """
    from axlearn.common.input_tf_data import chain  # pylint: disable=import-outside-toplevel

    if ModelType(model_type) != ModelType.ENCODER_DECODER:
        raise NotImplementedError(
            f"make_t5_autoregressive_inputs: Expected ENCODER_DECODER model_type, got {model_type}"
        )
    vocab = vocab_cfg.instantiate()
    raw_length, target_length = random_spans_helper(
        desired_source_length=max_source_length,
        noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
    )
    if target_length > max_target_length:
        raise ValueError(
            f"Expected target length for span corruption ({target_length}) exceeds max target "
            f"length ({max_target_length}): raise max_target_length or lower noise_density."
        )
    return chain(
        config_for_function(select_random_chunk).set(chunk_size=max_chunk_size),
        config_for_function(reduce_concat_tokens).set(batch_size=num_sequences_to_concat),
        config_for_function(split_tokens).set(max_tokens_per_segment=raw_length),
        config_for_function(apply_t5_mask).set(
            noise_density=noise_density,
            mean_noise_span_length=mean_noise_span_length,
            vocab_cfg=vocab_cfg,
        ),
        _append_eos_after_trim(
            eos_id=vocab.eos_id,
            lengths={"source_ids": max_source_length, "target_labels": max_target_length},
        ),
        _encoder_decoder_inputs(prefix_id=vocab.eos_id),
    )
