"""Helpers for tests of tf.data inputs: text sources and the paths of test vocabularies.

`t5_sentence_piece_vocab_file` is where AXLearn's tests look for T5's SentencePiece model
(`axlearn/data/tokenizers/sentencepiece/t5-base`). This package does not ship that file (it
cannot be downloaded at test time either); tests that need it check `os.path.exists` and skip.
`python_docs_sentence_piece_vocab_file` is the small BPE vocabulary this package does ship.

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# The folder of the SentencePiece/BPE vocabularies shipped with (or expected by) axlearn.
tokenizers_dir = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "tokenizers")
# Its SentencePiece and BPE subfolders.
SENTENCEPIECE_DIR = os.path.join(tokenizers_dir, "sentencepiece")
BPE_DIR = os.path.join(tokenizers_dir, "bpe")
# T5's SentencePiece model (32k pieces), as AXLearn's tests expect it; not shipped here.
t5_sentence_piece_vocab_file = os.path.join(SENTENCEPIECE_DIR, "t5-base")
# OPT's and RoBERTa's byte-level BPE vocabularies (AXLearn's paths); not shipped here.
opt_vocab_file = os.path.join(BPE_DIR, "opt.model")
roberta_base_vocab_file = os.path.join(BPE_DIR, "roberta-base-vocab.json")
roberta_base_merges_file = os.path.join(BPE_DIR, "roberta-base-merges.txt")
# The 4k-piece BPE model trained on Python's documentation, shipped with axlearn.
python_docs_sentence_piece_vocab_file = os.path.join(
    tokenizers_dir, "sentencepiece", "bpe_4k_python_docs.model"
)


def make_ds_fn(
    is_training: bool,
    texts: Sequence[str],
    repeat: Optional[int] = 1,
) -> Callable[[], tf.data.Dataset]:
    """Returns a BuildDatasetFn of `{"text": t}` examples, one per text, in order.

    Args:
        is_training: Unused (sources take it; repetition is set by `repeat`).
        texts: The texts.
        repeat: How many times the texts are yielded; None: forever.

    Returns:
        A BuildDatasetFn.
    """
    del is_training
    texts = list(texts)

    def fn() -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ds = tf.data.Dataset.from_tensor_slices({"text": tf.constant(texts, dtype=tf.string)})
        return ds.repeat(repeat)

    return fn
