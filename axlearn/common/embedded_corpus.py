"""The shipped corpus of the embedded data set: where it lives, its splits, how to read it.

Kept apart from `axlearn.common.embedded_data` (which re-exports every name here) so that the
TFDS builder in `axlearn.common.embedded_data_builder` can read the corpus without importing the
module that builds it. Imports neither TensorFlow nor seqio.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from typing import Optional

# The TFDS builder name (without version).
BUILDER_NAME = "python_docs"
# One document in this many goes to the validation split (by a CRC32 of its id).
_VALIDATION_EVERY = 20

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where the shipped corpus lives.
CORPUS_PATH = os.path.join(_PACKAGE_ROOT, "data", "python_docs", "corpus.jsonl.gz")


def split_of(doc_id: str) -> str:
    """Returns the split ("train" or "validation") a document id belongs to.

    Args:
        doc_id: The document id.

    Returns:
        The split name.
    """
    crc = zlib.crc32(doc_id.encode("utf-8"))
    return "validation" if crc % _VALIDATION_EVERY == 0 else "train"


def read_corpus(split: Optional[str] = None, *, path: str = CORPUS_PATH) -> Iterator[dict]:
    """Yields the corpus documents `{"id": str, "text": str}` in file order.

    Args:
        split: "train", "validation" or None for all documents.
        path: The corpus file.

    Yields:
        Documents.

    Raises:
        FileNotFoundError: If the corpus file does not exist (names the path).
        ValueError: If `split` is unknown.
    """
    if split not in (None, "train", "validation"):
        raise ValueError(f"Unknown split {split!r} of {BUILDER_NAME}: use 'train' or 'validation'")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"The embedded corpus {path} does not exist; reinstall axlearn or regenerate it with "
            f"`python -m axlearn.common.embedded_data --regenerate`"
        )
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            doc = json.loads(line)
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise ValueError(f"{path}:{line_no}: malformed corpus record")
            if split is None or split_of(doc["id"]) == split:
                yield doc
