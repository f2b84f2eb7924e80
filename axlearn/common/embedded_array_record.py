"""The embedded corpus as ArrayRecord files, for Grain inputs (`axlearn.common.input_grain`).

`prepare_array_record(split)` writes `<cache_dir>/array_record/python_docs/<split>.array_record`
at first use (as `embedded_data.prepare` builds the TFDS copy): one record per document of the
split, in corpus order, each the document's UTF-8 text. Safe to call from several processes (a
file lock serializes writing; the file appears complete, by rename). Imports neither TensorFlow
nor seqio.
"""

from __future__ import annotations

import os
from typing import Optional

from axlearn.common.embedded_corpus import BUILDER_NAME, CORPUS_PATH, read_corpus
from axlearn.common.embedded_data import _file_lock, cache_dir

# Record format version: bump when the content of a record changes (old files are rewritten).
_FORMAT_VERSION = 1


def array_record_dir() -> str:
    """Returns the directory of the embedded corpus's ArrayRecord files.

    Returns:
        `<cache_dir()>/array_record/python_docs`.
    """
    return os.path.join(cache_dir(), "array_record", BUILDER_NAME)


def array_record_path(split: str, *, directory: Optional[str] = None) -> str:
    """Returns the path of a split's ArrayRecord file (not created).

    Args:
        split: "train" or "validation".
        directory: The directory; None: `array_record_dir()`.

    Returns:
        The path.
    """
    return os.path.join(directory or array_record_dir(), f"{split}-v{_FORMAT_VERSION}.array_record")


def prepare_array_record(
    split: str, *, directory: Optional[str] = None, corpus_path: str = CORPUS_PATH
) -> str:
    """Writes a split of the embedded corpus as an ArrayRecord file unless it exists.

    Args:
        split: "train" or "validation".
        directory: The directory; None: `array_record_dir()`.
        corpus_path: The shipped corpus.

    Returns:
        The file's path.

    Raises:
        ValueError: If `split` is unknown.
        FileNotFoundError: If the corpus is missing.
    """
    path = array_record_path(split, directory=directory)
    if os.path.exists(path):
        return path
    from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

    docs = list(read_corpus(split, path=corpus_path))  # Validates `split` before writing.
    with _file_lock(os.path.join(os.path.dirname(path), f".{split}.lock")):
        if os.path.exists(path):
            return path
        tmp = f"{path}.tmp.{os.getpid()}"
        writer = array_record_module.ArrayRecordWriter(tmp, "group_size:1")
        try:
            for doc in docs:
                writer.write(doc["text"].encode("utf-8"))
        finally:
            writer.close()
        os.replace(tmp, path)
    return path
