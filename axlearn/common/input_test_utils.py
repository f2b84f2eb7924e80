"""Helpers for tests of tf.data inputs: text sources and the paths of test vocabularies.

The vocabulary paths are those AXLearn's tests use (`axlearn/data/tokenizers/...`):
`t5_sentence_piece_vocab_file` (T5's 32k SentencePiece model), `opt_vocab_file` (OPT's BPE
model), `roberta_base_vocab_file`/`roberta_base_merges_file`. This package ships only
`python_docs_sentence_piece_vocab_file` (a 4k BPE model); tests that need another one check
`os.path.exists` and skip. To run them, point `AXLEARN_TEST_TOKENIZERS_DIR` at a folder laid out
as `sentencepiece/t5-base`, `bpe/opt.model`, ... (read once, when this module is imported).

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# The folder of the vocabularies shipped with axlearn.
_SHIPPED_TOKENIZERS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "data", "tokenizers"
)
# Environment variable naming another folder of test vocabularies (same layout).
TOKENIZERS_DIR_ENV = "AXLEARN_TEST_TOKENIZERS_DIR"
# The folder the test vocabulary paths below are read from.
tokenizers_dir = os.environ.get(TOKENIZERS_DIR_ENV) or _SHIPPED_TOKENIZERS_DIR
SENTENCEPIECE_DIR = os.path.join(tokenizers_dir, "sentencepiece")
BPE_DIR = os.path.join(tokenizers_dir, "bpe")
# T5's SentencePiece model (32k pieces), as AXLearn's tests expect it; not shipped here.
t5_sentence_piece_vocab_file = os.path.join(SENTENCEPIECE_DIR, "t5-base")
# OPT's byte-level BPE model (SentencePiece format); not shipped here.
opt_vocab_file = os.path.join(BPE_DIR, "opt.model")
# RoBERTa's BPE vocabulary and merges (Hugging Face format); not shipped here.
roberta_base_vocab_file = os.path.join(BPE_DIR, "roberta-base-vocab.json")
roberta_base_merges_file = os.path.join(BPE_DIR, "roberta-base-merges.txt")
# The 4k-piece BPE model trained on Python's documentation, shipped with axlearn.
python_docs_sentence_piece_vocab_file = os.path.join(
    _SHIPPED_TOKENIZERS_DIR, "sentencepiece", "bpe_4k_python_docs.model"
)


def count_batches(dataset: Any, max_batches: int = 100) -> int:
    """Counts the elements of `dataset`, up to `max_batches`.

    Args:
        dataset: Any iterable.
        max_batches: The most elements counted.

    Returns:
        The number of elements, or -1 when there are more than `max_batches`.
    """
    count = 0
    for _ in dataset:
        if count >= max_batches:
            return -1
        count += 1
    return count


def make_ds_fn(
    is_training: bool,
    texts: Sequence[str],
    repeat: Optional[int] = 100,
) -> Callable[[], tf.data.Dataset]:
    """Returns a BuildDatasetFn of `{"text": t, "index": i}` examples, one per text, in order.

    Args:
        is_training: Unused (sources take it; repetition is set by `repeat`).
        texts: The texts.
        repeat: How many times the texts are yielded; None: forever.

    Returns:
        A BuildDatasetFn; "index" (uint32) is the text's position in `texts`.
    """
    del is_training
    texts = list(texts)

    def fn() -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ds = tf.data.Dataset.from_tensor_slices(
            {
                "text": tf.constant(texts, dtype=tf.string, shape=[len(texts)]),
                "index": tf.constant(list(range(len(texts))), dtype=tf.uint32, shape=[len(texts)]),
            }
        )
        return ds.repeat(-1 if repeat is None else repeat)

    return fn


def make_ragged_ds_fn(
    is_training: bool, texts: Sequence[dict], repeat: Optional[int] = 100
) -> Callable[[], tf.data.Dataset]:
    """Returns a BuildDatasetFn of `{"text": ragged [rows, None] strings, "index": i}` examples.

    Args:
        is_training: Unused.
        texts: Dicts whose "text" is a list of lists of strings.
        repeat: How many times the examples are yielded; None: forever.

    Returns:
        A BuildDatasetFn; "index" (int32) is the example's position in `texts`.
    """
    del is_training
    items = [list(map(list, item["text"])) for item in texts]

    def fn() -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def gen():
            for _ in range(repeat) if repeat is not None else iter(int, 1):
                for index, rows in enumerate(items):
                    yield {"text": tf.ragged.constant(rows, dtype=tf.string), "index": index}

        return tf.data.Dataset.from_generator(
            gen,
            output_signature={
                "text": tf.RaggedTensorSpec(shape=[None, None], dtype=tf.string),
                "index": tf.TensorSpec(shape=(), dtype=tf.int32),
            },
        )

    return fn


def make_seq2seq_ds_fn(
    is_training: bool,
    sources: Sequence[str],
    targets: Sequence[str],
    repeat: Optional[int] = 100,
    source_key: str = "source",
    target_key: str = "target",
) -> Callable[[], tf.data.Dataset]:
    """Returns a BuildDatasetFn of `{source_key: s, target_key: t, "index": i}` examples.

    Args:
        is_training: Unused.
        sources: The source texts.
        targets: The target texts (paired with `sources` by position).
        repeat: How many times the pairs are yielded; None: forever.
        source_key: The source field's name.
        target_key: The target field's name.

    Returns:
        A BuildDatasetFn; "index" (int32) is the pair's position.
    """
    del is_training
    pairs = list(zip(sources, targets))

    def fn() -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ds = tf.data.Dataset.from_tensor_slices(
            {
                source_key: tf.constant([s for s, _ in pairs], dtype=tf.string, shape=[len(pairs)]),
                target_key: tf.constant([t for _, t in pairs], dtype=tf.string, shape=[len(pairs)]),
                "index": tf.constant(list(range(len(pairs))), dtype=tf.int32, shape=[len(pairs)]),
            }
        )
        return ds.repeat(-1 if repeat is None else repeat)

    return fn


def extract_text(example: dict[str, Any], input_key: str = "text") -> str:
    """Returns the UTF-8 string of `example[input_key]` (a scalar string tensor)."""
    return bytes.decode(example[input_key].numpy(), "utf-8")


def extract_text_ragged(example: dict[str, Any], input_key: str = "text") -> list[list[str]]:
    """Returns `example[input_key]` (a 2D ragged string tensor) as lists of Python strings."""
    return [[bytes.decode(s, "utf-8") for s in row] for row in example[input_key].numpy()]


def assert_oneof(test_case: Any, actual: Any, candidates: Sequence[Any]) -> None:
    """Asserts that `actual` equals (`assertAllEqual`) one of `candidates`.

    Args:
        test_case: A `tf.test.TestCase`.
        actual: The value.
        candidates: The accepted values.

    Raises:
        ValueError: If `test_case` is not a `tf.test.TestCase`.
        AssertionError: If `actual` equals none of the candidates.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if not isinstance(test_case, tf.test.TestCase):
        raise ValueError("assert_oneof: test_case must be a tf.test.TestCase")
    for candidate in candidates:
        try:
            test_case.assertAllEqual(actual, candidate)
            return
        except AssertionError:
            pass
    raise AssertionError(f"Expected {actual} to equal one of {candidates}")
