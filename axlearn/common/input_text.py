"""Generic text processors for tf.data inputs: normalization, tokenization, chunking, sentences.

Each function returns a `DatasetToDatasetFn` (a `tf.data.Dataset -> tf.data.Dataset` callable,
see `axlearn.common.input_tf_data`) or is a helper used inside one:

- normalization: `strip_accents`, `roberta_normalize`, `bert_normalize` (and its mapper);
- tokenization: `tokenize` (SeqIO features), `tokenize_example`, `add_token_type_ids`,
  `num_bytes`, `infer_bos_id`;
- splitting: `preprocess_chunks` (fixed-size character chunks), `split_sentences`,
  `random_chunking` (a random window of token ids), `join_string_features`;
- strings as arrays: `pack_strings`/`unpack_strings` (UTF-8 bytes as int32, padded, so that
  strings can cross JAX collectives).

Field names of the batch contract: `INPUT_IDS`, `TOKEN_TYPE_IDS`, `TARGET_LABELS`.

TensorFlow, tensorflow_text and seqio are imported lazily: importing this module does not import
them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import numpy as np

from axlearn.common.config import ConfigOr, maybe_instantiate

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn

INPUT_IDS = "input_ids"
TOKEN_TYPE_IDS = "token_type_ids"
TARGET_LABELS = "target_labels"

# The int32 value padding a packed string's byte array (`pack_strings`): no byte has it.
STRINGS_BYTE_ARRAY_PAD_VALUE = 2**31 - 1


def _map_examples(fn: Callable[[dict], dict]) -> DatasetToDatasetFn:
    """Returns a processor that maps `fn` over each example (in parallel)."""

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)

    return process


def _as_keys(input_key: Union[str, Sequence[str]]) -> list[str]:
    return [input_key] if isinstance(input_key, str) else list(input_key)


def perplexity(targets: Sequence[str], scores: Sequence[float]) -> dict[str, Any]:
    """The perplexity of a set of scored examples, as a SeqIO score metric.

    Args:
        targets: The postprocessed targets (unused).
        scores: The model's log-likelihood of each example.

    Returns:
        {"perplexity": seqio.metrics.Scalar(exp(mean(scores)))}.
    """
    import seqio  # pylint: disable=import-outside-toplevel

    del targets
    return {"perplexity": seqio.metrics.Scalar(float(np.exp(np.mean(scores))))}


def preprocess_chunks(chunk_size: int) -> DatasetToDatasetFn:
    """Splits each document's "text" into consecutive chunks of at most `chunk_size` characters.

    Args:
        chunk_size: The chunk size in Unicode characters (the last chunk may be shorter).

    Returns:
        A DatasetToDatasetFn from `{"text": document}` examples to one `{"text": chunk}` example
        per chunk (other fields are dropped; no padding).
    """
    if chunk_size <= 0:
        raise ValueError(f"preprocess_chunks: chunk_size must be > 0, got {chunk_size}")

    def split(text) -> np.ndarray:
        value = bytes.decode(text.numpy(), "utf-8")
        return np.array(
            [value[k : k + chunk_size] for k in range(0, len(value), chunk_size)], dtype=object
        )

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def example_fn(example):
            chunks = tf.py_function(split, [example["text"]], tf.string)
            return {"text": tf.ensure_shape(chunks, [None])}

        return ds.map(example_fn, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    return process


def strip_accents(fields: Sequence[str], normalization_form: str = "NFKD") -> DatasetToDatasetFn:
    """Removes accents (combining marks) from string fields.

    Each field is Unicode-normalized (NFD or NFKD, which split an accented letter into the letter
    and its combining mark) and every non-spacing mark (`\\p{Mn}`) is then removed.

    Args:
        fields: The string fields to process.
        normalization_form: "NFD" or "NFKD".

    Returns:
        A DatasetToDatasetFn; other fields are unchanged.

    Raises:
        AssertionError: If `normalization_form` is neither "NFD" nor "NFKD".
    """
    assert normalization_form in ("NFD", "NFKD"), (
        f"strip_accents: normalization_form must be 'NFD' or 'NFKD', got {normalization_form!r}"
    )

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        import tensorflow_text as tf_text  # pylint: disable=import-outside-toplevel

        for field in fields:
            text = tf_text.normalize_utf8(example[field], normalization_form=normalization_form)
            example[field] = tf.strings.regex_replace(text, r"\p{Mn}", "")
        return example

    return _map_examples(example_fn)


def tokenize(
    output_features: ConfigOr[Any],
    copy_pretokenized: bool = True,
    with_eos: bool = False,
) -> DatasetToDatasetFn:
    """Tokenizes the fields named by `output_features` with SeqIO.

    Args:
        output_features: {field: seqio.Feature}; each feature's vocabulary tokenizes that field.
            Or a config that instantiates to such a mapping.
        copy_pretokenized: Whether to keep each original string as `<field>_pretokenized`.
        with_eos: Whether to append EOS to features whose `add_eos` is set.

    Returns:
        A DatasetToDatasetFn replacing each string field by its int token ids.
    """
    import seqio  # pylint: disable=import-outside-toplevel

    output_features = maybe_instantiate(output_features)

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        return seqio.preprocessors.tokenize(
            ds,
            output_features=output_features,
            copy_pretokenized=copy_pretokenized,
            with_eos=with_eos,
        )

    return process


def add_token_type_ids(
    input_key: Union[str, Sequence[str]],
    output_key: str = TOKEN_TYPE_IDS,
) -> DatasetToDatasetFn:
    """Adds the token type ids of one or more tokenized sequences that will be joined.

    The joined sequence is assumed to be `BOS s_0 SEP s_1 SEP ... s_{n-1} EOS`: the BOS and the
    tokens of `s_0` and the separator after it get type 0; the tokens of `s_i` and the separator
    (or EOS) after it get type `i` (as BERT's tokenizers do). So type `i` has
    `len(s_i) + 1 + (i == 0)` entries.

    Each field is a 1D tensor/ragged tensor of ids (one example) or a 2D one
    [num_examples, seq_len] (several); the last dimension holds the ids.

    Args:
        input_key: The field(s) of the sequences, in order.
        output_key: The field the token type ids are written to.

    Returns:
        A DatasetToDatasetFn adding `output_key` (int32, ragged when the inputs are).
    """
    keys = _as_keys(input_key)

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        parts = []
        for i, key in enumerate(keys):
            ids = example[key]
            extra = 1 + int(i == 0)
            if isinstance(ids, tf.RaggedTensor):
                lengths = ids.row_lengths() + extra
                values = tf.fill([tf.reduce_sum(lengths)], i)
                parts.append(tf.RaggedTensor.from_row_lengths(values, lengths))
            else:
                shape = tf.shape(ids)
                out_shape = tf.concat([shape[:-1], [shape[-1] + extra]], axis=0)
                parts.append(tf.fill(out_shape, i))
        example[output_key] = tf.concat(parts, axis=-1)
        return example

    return _map_examples(example_fn)


def tokenize_example(text: Any, sp_vocab: Any, replace_newlines_with: str) -> tf.Tensor:
    """Tokenizes one text with a SentencePiece vocabulary, after replacing its newlines.

    No padding, BOS or EOS is added.

    Args:
        text: A string (or scalar string tensor).
        sp_vocab: The seqio vocabulary (`encode_tf`).
        replace_newlines_with: What each "\\n" is replaced with before tokenizing.

    Returns:
        The int32 token ids [num_tokens].
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    text = tf.strings.regex_replace(text, "\n", replace_newlines_with)
    return sp_vocab.encode_tf(text)


def num_bytes(ids: Any, sp_vocab: Any, newlines_replaced_with: str = "\n") -> tf.Tensor:
    """The number of UTF-8 bytes that token ids stand for; each EOS counts as one byte.

    Args:
        ids: Token ids [seq_len] or [batch, seq_len].
        sp_vocab: The seqio vocabulary the ids come from.
        newlines_replaced_with: The string that newlines were replaced with before tokenizing
            (it is turned back into "\\n", one byte, before counting).

    Returns:
        int32 byte counts: a scalar for 1D `ids`, [batch] for 2D.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    # pylint: disable-next=protected-access
    text = sp_vocab._decode_tf(ids)
    text = tf.strings.regex_replace(text, re.escape(newlines_replaced_with), "\n")
    eos_count = tf.reduce_sum(tf.cast(tf.equal(ids, sp_vocab.eos_id), tf.int32), axis=-1)
    return tf.strings.length(text, unit="BYTE") + eos_count


def pack_strings(strings: Any, max_packed_byte_array_len: int) -> tf.Tensor:
    """Packs strings into an int32 array of their UTF-8 code points, padded per row.

    Each row holds one string's Unicode code points (decoded from UTF-8), padded with
    `STRINGS_BYTE_ARRAY_PAD_VALUE`, so that the strings can travel in JAX arrays.

    Args:
        strings: A 1D string tensor [num_strings].
        max_packed_byte_array_len: The row length; every string must fit.

    Returns:
        int32 [num_strings, max_packed_byte_array_len].

    Raises:
        tf.errors.InvalidArgumentError: If a string is longer than the row.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    code_points = tf.strings.unicode_decode(strings, input_encoding="UTF-8", errors="strict")
    tf.debugging.assert_less_equal(
        tf.reduce_max(code_points.row_lengths()),
        tf.constant(max_packed_byte_array_len, dtype=tf.int64),
    )
    return code_points.to_tensor(
        default_value=STRINGS_BYTE_ARRAY_PAD_VALUE,
        shape=[None, max_packed_byte_array_len],
    )


def unpack_strings(strings_byte_array: Any) -> list[str]:
    """Inverse of `pack_strings`.

    Args:
        strings_byte_array: int32 [num_strings, max_packed_byte_array_len].

    Returns:
        The strings.
    """
    out = []
    for row in np.asarray(strings_byte_array):
        row = row[row != STRINGS_BYTE_ARRAY_PAD_VALUE]
        out.append("".join(chr(int(c)) for c in row))
    return out


def infer_bos_id(vocab: Any) -> int:
    """The BOS id of a SentencePiece vocabulary; its EOS id when it has no BOS.

    Args:
        vocab: A seqio SentencePiece vocabulary.

    Returns:
        The id.

    Raises:
        ValueError: If the vocabulary has neither BOS nor EOS.
    """
    bos_id = vocab.tokenizer.bos_id()
    if bos_id == -1:
        bos_id = vocab.eos_id
    if bos_id is None or bos_id == -1:
        raise ValueError(f"infer_bos_id: vocabulary {vocab} has neither a BOS nor an EOS token")
    return bos_id


def roberta_normalize(
    cased: bool = True, input_key: Union[str, Sequence[str]] = "text"
) -> DatasetToDatasetFn:
    """Normalizes text as RoBERTa's pre-processing does: strip whitespace, optionally lowercase.

    Args:
        cased: If False, lowercases.
        input_key: The string field(s) to normalize.

    Returns:
        A DatasetToDatasetFn; other fields are unchanged.
    """
    keys = _as_keys(input_key)

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        for key in keys:
            text = example[key]
            if not cased:
                text = tf.strings.lower(text)
            example[key] = tf.strings.strip(text)
        return example

    return _map_examples(example_fn)


def bert_normalize_mapper(
    cased: bool = True,
    input_key: Union[str, Sequence[str]] = "text",
    reduce_axis: Optional[int] = None,
) -> Callable[[dict], dict]:
    """Returns a per-example mapper that normalizes text as BERT's basic tokenizer does.

    NUL, U+FFFD and non-spacing marks are removed; the text is split on whitespace and
    punctuation, CJK characters become tokens of their own (tensorflow_text's
    accent-preserving BERT basic tokenizer), optionally lowercased; the tokens are joined with
    single spaces. Usable outside tf.data (e.g. on eager tensors).

    Args:
        cased: If False, lowercases.
        input_key: The string field(s) to normalize.
        reduce_axis: The axis along which tokens are joined; None joins everything into one
            scalar string.

    Returns:
        A function from example dict to example dict.
    """
    from tensorflow_text.python.ops.bert_tokenizer import (  # pylint: disable=import-outside-toplevel
        AccentPreservingBasicTokenizer,
    )

    tokenizer = AccentPreservingBasicTokenizer(lower_case=not cased, normalization_form=None)
    keys = _as_keys(input_key)

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        for key in keys:
            text = tf.strings.regex_replace(example[key], "[\\0\\x{FFFD}\\p{Mn}]+", "")
            tokens = tokenizer.tokenize(text)
            if reduce_axis is None:
                joined = tf.strings.reduce_join(tokens.flat_values, separator=" ")
                example[key] = tf.ensure_shape(joined, [])
            else:
                example[key] = tf.strings.reduce_join(tokens, separator=" ", axis=reduce_axis)
        return example

    return example_fn


def bert_normalize(
    cased: bool = True,
    input_key: Union[str, Sequence[str]] = "text",
    reduce_axis: Optional[int] = None,
) -> DatasetToDatasetFn:
    """Normalizes text as BERT does (see `bert_normalize_mapper`).

    Args:
        cased: If False, lowercases.
        input_key: The string field(s) to normalize.
        reduce_axis: The axis along which tokens are joined; None: into one scalar string.

    Returns:
        A DatasetToDatasetFn; other fields are unchanged.
    """
    return _map_examples(
        bert_normalize_mapper(cased=cased, input_key=input_key, reduce_axis=reduce_axis)
    )


# Words ending with "." that do not end a sentence (lowercase, without the dot).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e a.m p.m u.s fig no jan feb mar apr jun jul aug "
    "sep sept oct nov dec inc ltd co corp".split()
)
# A sentence end: ".", "!" or "?" (and closing quotes/brackets), then whitespace.
_SENTENCE_END = re.compile(r"([.!?]+[\"')\]]*)\s+")


def sentence_split(text: str) -> list[str]:
    """Splits text into sentences (rule-based).

    A sentence ends at ".", "!" or "?" (optionally followed by closing quotes or brackets) that is
    followed by whitespace, unless the word before a "." is a single letter (an initial) or a
    common abbreviation ("mr.", "e.g.", "mt.", ...). Sentences are stripped; empty ones dropped.

    Args:
        text: The text.

    Returns:
        The sentences, in order.
    """
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        end = match.end(1)
        if match.group(1).startswith(".") and len(match.group(1).rstrip("\"')]")) == 1:
            word = text[start : match.start(1)].split()
            last = word[-1].lower() if word else ""
            if len(last) == 1 and last.isalpha() or last in _ABBREVIATIONS:
                continue
        sentences.append(text[start:end])
        start = match.end()
    sentences.append(text[start:])
    return [s.strip() for s in sentences if s.strip()]


def split_sentences(
    input_key: str = "text",
    max_sentences_per_example: Optional[int] = None,
    passthrough_keys: Optional[list[str]] = None,
) -> DatasetToDatasetFn:
    """Splits each document into lowercased sentences, then an empty sentence (document end).

    Sentences are found by `sentence_split` (rule-based; no model is loaded).

    Args:
        input_key: The document field.
        max_sentences_per_example: If set (> 0) and a document has more sentences, keeps this
            many, sampled without replacement, in their original order.
        passthrough_keys: Fields copied onto every sentence of their document.

    Returns:
        A DatasetToDatasetFn from document examples to one example per sentence (plus the empty
        one per document), with `input_key` and `passthrough_keys` only.
    """
    passthrough_keys = list(passthrough_keys or [])

    def split(text):
        sentences = sentence_split(bytes.decode(text.numpy(), "utf-8").lower())
        limit = max_sentences_per_example
        if limit is not None and 0 < limit < len(sentences):
            keep = sorted(random.sample(range(len(sentences)), limit))
            sentences = [sentences[i] for i in keep]
        sentences.append("")
        return np.array(sentences, dtype=object), len(sentences)

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def example_fn(example):
            sentences, count = tf.py_function(split, [example[input_key]], (tf.string, tf.int32))
            out = {input_key: tf.ensure_shape(sentences, [None])}
            for key in passthrough_keys:
                out[key] = tf.tile([example[key]], [count])
            return out

        return ds.map(example_fn, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    return process


def random_chunking(max_len: int, input_key: str = INPUT_IDS) -> DatasetToDatasetFn:
    """Keeps a random window of `min(len, max_len)` consecutive ids of a 1D field.

    The window's start is uniform over the valid offsets.

    Args:
        max_len: The longest window.
        input_key: The field to chunk.

    Returns:
        A DatasetToDatasetFn; other fields are unchanged.
    """

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ids = example[input_key]
        max_offset = tf.maximum(0, tf.size(ids) - max_len)
        offset = tf.random.uniform([], minval=0, maxval=max_offset + 1, dtype=tf.int32)
        example[input_key] = ids[offset : offset + max_len]
        return example

    return _map_examples(example_fn)


def join_string_features(
    features: Sequence[str], key: str, separator: str = "</s>"
) -> DatasetToDatasetFn:
    """Joins string fields into one, with `separator` between them.

    Args:
        features: The fields to join, in order.
        key: The field the joined string is written to.
        separator: The string between two fields.

    Returns:
        A DatasetToDatasetFn adding `key`.
    """
    features = list(features)

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        example[key] = tf.strings.join([example[f] for f in features], separator=separator)
        return example

    return _map_examples(example_fn)
