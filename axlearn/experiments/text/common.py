"""Common pieces of text experiments: vocabularies and text sources.

Vocabulary lookup (`vocab(sentencepiece_model_name=...)`): the model file is searched, in order,
in
1. `$DATA_DIR/tokenizers/sentencepiece/` when `--data_dir` (env `DATA_DIR`) is set and not FAKE;
2. `axlearn/data/tokenizers/sentencepiece/` inside the installed package (shipped models, e.g.
   the embedded corpus's `bpe_4k_python_docs.model`).
A name found in neither is an error that lists both paths. `sentencepiece_model_name=None` gives
seqio's byte-level vocabulary (no file needed).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Optional

from axlearn.common import input_tf_data
from axlearn.common.config import InstantiableConfig, config_for_function
from axlearn.common.embedded_data import SENTENCEPIECE_DIR

if TYPE_CHECKING:  # pragma: no cover
    import seqio


@dataclasses.dataclass(frozen=True)
class DataMixtureComponent:
    """A data set in a training mixture."""

    # The TFDS name.
    name: str
    # The sampling weight.
    weight: float
    # The shuffle buffer size (examples).
    shuffle_buffer_size: int
    # The split.
    split: str = "train"
    # Free-form notes.
    info: str = ""


def vocab_search_dirs() -> list[str]:
    """Returns the directories `vocab` searches, in order (see the module docstring).

    Returns:
        The directories.
    """
    dirs = []
    data_dir = input_tf_data.get_data_dir()
    if data_dir and data_dir != "FAKE":
        dirs.append(os.path.join(data_dir, "tokenizers", "sentencepiece"))
    dirs.append(SENTENCEPIECE_DIR)
    return dirs


def vocab(
    *, sentencepiece_model_name: Optional[str], num_extra_ids: Optional[int] = None
) -> seqio.Vocabulary:
    """Returns a seqio vocabulary: a sentencepiece model by file name, or byte-level.

    Args:
        sentencepiece_model_name: The model file name (e.g. "bpe_4k_python_docs.model"), looked
            up in `vocab_search_dirs()`; None: `seqio.ByteVocabulary` (ids 0-2 are pad, EOS,
            unk; bytes follow).
        num_extra_ids: Extra sentinel ids appended to the vocabulary.

    Returns:
        The vocabulary.

    Raises:
        FileNotFoundError: If the model file is in none of the searched directories.
    """
    import seqio  # pylint: disable=import-outside-toplevel

    if sentencepiece_model_name is None:
        return seqio.ByteVocabulary(extra_ids=num_extra_ids or 0)
    searched = []
    for directory in vocab_search_dirs():
        path = os.path.join(directory, sentencepiece_model_name)
        searched.append(path)
        if os.path.exists(path):
            _check_sentencepiece_model(path)
            return seqio.SentencePieceVocabulary(
                sentencepiece_model_file=path, extra_ids=num_extra_ids or 0
            )
    raise FileNotFoundError(
        f"Sentencepiece model {sentencepiece_model_name!r} not found; looked in: {searched}. "
        f"Put it under <data_dir>/tokenizers/sentencepiece/ and pass --data_dir, or use "
        f"sentencepiece_model_name=None for a byte-level vocabulary."
    )


def _check_sentencepiece_model(path: str) -> None:
    """Raises a ValueError naming `path` if it is not a loadable sentencepiece model (seqio
    loads it lazily and would fail later with a bare protobuf DecodeError)."""
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel

    try:
        spm.SentencePieceProcessor(model_file=path)
    except Exception as e:  # pylint: disable=broad-except
        raise ValueError(
            f"{path} is not a valid sentencepiece model file ({type(e).__name__}: {e}); "
            "replace it with the tokenizer's .model file."
        ) from e


def tfds_text_source(
    *,
    is_training: bool,
    dataset_name: str,
    split: str,
    read_parallelism: int = 1,
    decode_parallelism: int = 8,
    train_shuffle_buffer_size: int = 64 * 1024,
    data_dir: Optional[str] = None,
) -> input_tf_data.BuildDatasetFn:
    """Returns a source of TFDS text examples (`{"text": ...}`), shuffled when training.

    Args:
        is_training: Whether the source is used for training.
        dataset_name: The TFDS name.
        split: The split (slicing allowed).
        read_parallelism: Files read in parallel when training.
        decode_parallelism: Parallel decodes when training.
        train_shuffle_buffer_size: Document shuffle buffer when training (0 disables).
        data_dir: The TFDS data dir; None: see `input_tf_data.tfds_dataset`.

    Returns:
        A BuildDatasetFn.
    """
    source = config_for_function(input_tf_data.tfds_dataset).set(
        dataset_name=dataset_name,
        split=split,
        is_training=is_training,
        data_dir=data_dir,
        read_config=config_for_function(input_tf_data.tfds_read_config).set(
            read_parallelism=read_parallelism, decode_parallelism=decode_parallelism
        ),
        train_shuffle_buffer_size=train_shuffle_buffer_size if is_training else 0,
    )
    return source.instantiate()


def embedded_vocab_config() -> InstantiableConfig:
    """Returns the vocab config of the embedded corpus's shipped sentencepiece model.

    Returns:
        `config_for_function(vocab).set(sentencepiece_model_name="bpe_4k_python_docs.model")`.
    """
    from axlearn.common.embedded_data import VOCAB_NAME  # pylint: disable=import-outside-toplevel

    return config_for_function(vocab).set(sentencepiece_model_name=VOCAB_NAME)
