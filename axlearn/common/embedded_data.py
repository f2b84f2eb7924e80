"""The embedded default data: English text from the Python documentation, needing no network.

The corpus ships in the repo as `axlearn/data/python_docs/corpus.jsonl.gz` (about 1.5 MB of text,
PSF License; see the README next to it): the `pydoc` topic pages and the module, class and
function docstrings of the CPython 3.11 standard library. A sentencepiece BPE vocabulary trained
on it ships as `axlearn/data/tokenizers/sentencepiece/bpe_4k_python_docs.model`.

On first use the corpus is built into a local TFDS data set named `python_docs` (splits `train`
and `validation`, features `id` and `text`) under the cache directory:
`$AXLEARN_CACHE_DIR/tensorflow_datasets` if that variable is set, else
`~/.cache/axlearn/tensorflow_datasets`. Building takes a few seconds and happens once per machine.

This module imports neither TensorFlow nor seqio; `prepare()` imports them lazily.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import io
import json
import logging
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from absl import logging as absl_logging

from axlearn.common.embedded_corpus import (  # noqa: F401  (re-exported public names)
    _PACKAGE_ROOT,
    BUILDER_NAME,
    CORPUS_PATH,
    read_corpus,
    split_of,
)

# The TFDS name (with version) of the embedded data set.
DATASET_NAME = "python_docs:1.0.0"
# The file name of the shipped vocabulary (looked up by `axlearn.experiments.text.common.vocab`).
VOCAB_NAME = "bpe_4k_python_docs.model"
# The number of ids in the shipped vocabulary.
VOCAB_SIZE = 4096
# The newline replacement piece the vocabulary reserves (see `tfds_input(replace_newlines_with)`).
NEWLINE_PIECE = "<n>"
# Environment variable overriding the cache directory.
CACHE_DIR_ENV = "AXLEARN_CACHE_DIR"

# Data dirs known to hold the built data set (in this process).
_PREPARED: set = set()

# The directory of shipped sentencepiece models.
SENTENCEPIECE_DIR = os.path.join(_PACKAGE_ROOT, "data", "tokenizers", "sentencepiece")


def cache_dir() -> str:
    """Returns the axlearn cache directory (`$AXLEARN_CACHE_DIR` or `~/.cache/axlearn`).

    Returns:
        The directory path (not created).
    """
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.path.expanduser("~"), ".cache", "axlearn"
    )


def tfds_data_dir() -> str:
    """Returns the TFDS data dir that holds the built embedded data set.

    Returns:
        `<cache_dir()>/tensorflow_datasets`.
    """
    return os.path.join(cache_dir(), "tensorflow_datasets")


def vocab_path() -> str:
    """Returns the path of the shipped sentencepiece model.

    Returns:
        The path.
    """
    return os.path.join(SENTENCEPIECE_DIR, VOCAB_NAME)


@contextlib.contextmanager
def _file_lock(path: str):
    """Holds an exclusive lock on `path` (created if needed) for the duration of the context."""
    import fcntl  # pylint: disable=import-outside-toplevel

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _builder(builder_cls: Any, data_dir: str) -> Any:
    """Returns `builder_cls(data_dir=data_dir)`; a damaged `dataset_info.json` names the file.

    TFDS reads the built data set's `dataset_info.json` when the builder is created; a garbage
    file there surfaces as a bare protobuf `ParseError` without a file name.
    """
    try:
        return builder_cls(data_dir=data_dir)
    except Exception as e:  # pylint: disable=broad-except
        if type(e).__name__ != "ParseError":
            raise
        folder = os.path.join(data_dir, BUILDER_NAME)
        raise ValueError(
            f"The embedded data set's dataset_info.json under {folder} is not valid ({e}): "
            f"delete {folder} and rerun to rebuild it (it is built from the shipped corpus)."
        ) from e


def prepare(data_dir: Optional[str] = None) -> str:
    """Builds the `python_docs` TFDS data set under `data_dir` unless it is already built.

    Safe to call from several processes at once (a file lock serializes building).

    Args:
        data_dir: The TFDS data dir; defaults to `tfds_data_dir()`.

    Returns:
        The TFDS data dir holding the data set.
    """
    data_dir = data_dir or tfds_data_dir()
    if data_dir in _PREPARED:
        return data_dir
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.embedded_data_builder import PythonDocs

    with _quiet_tfds():
        builder = _builder(PythonDocs, data_dir)
        if builder.is_prepared():
            _PREPARED.add(data_dir)
            return data_dir
        with _file_lock(os.path.join(data_dir, f".{BUILDER_NAME}.lock")):
            builder = _builder(PythonDocs, data_dir)
            if not builder.is_prepared():
                import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

                tfds.disable_progress_bar()
                absl_logging.info(
                    "Building the %s data set from the corpus shipped in the package into %s "
                    "(no download; once per data dir, about 20 s).",
                    BUILDER_NAME,
                    data_dir,
                )
                builder.download_and_prepare(
                    download_config=tfds.download.DownloadConfig(
                        compute_stats=tfds.download.ComputeStatsMode.SKIP
                    )
                )
    _PREPARED.add(data_dir)
    return data_dir


# TFDS's own lines while it builds a local data set: they speak of downloading (the data set
# downloads nothing: its source is in the package) and of an empty folder it is about to fill.
_TFDS_NOISE = (
    "Downloading and preparing dataset",
    "downloaded and prepared",
    "has no dataset_info",
)


class _DropTfdsNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in _TFDS_NOISE)


@contextlib.contextmanager
def _quiet_tfds() -> Iterator[None]:
    """Drops TFDS's download-speaking log lines and the lines it prints while building."""
    drop = _DropTfdsNoise()
    logger = logging.getLogger("absl")
    logger.addFilter(drop)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.removeFilter(drop)


def _doc_tokens(sp: Any, text: str, replace_newlines_with: str) -> list[int]:
    if replace_newlines_with != "\n":
        text = text.replace("\n", replace_newlines_with)
    return sp.encode(text)


def unigram_counts(
    split: str = "train",
    *,
    model_path: Optional[str] = None,
    replace_newlines_with: str = NEWLINE_PIECE,
    include_eos: bool = True,
) -> collections.Counter:
    """Counts token ids over a split of the corpus, as the LM processors tokenize it.

    Args:
        split: "train" or "validation".
        model_path: The sentencepiece model; defaults to the shipped one.
        replace_newlines_with: Newline replacement applied before tokenizing.
        include_eos: Whether each document contributes one EOS token (as LM targets do).

    Returns:
        A Counter {token id: count}.
    """
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel

    sp = spm.SentencePieceProcessor(model_file=model_path or vocab_path())
    counts: collections.Counter = collections.Counter()
    for doc in read_corpus(split):
        counts.update(_doc_tokens(sp, doc["text"], replace_newlines_with))
        if include_eos:
            counts[sp.eos_id()] += 1
    return counts


def corpus_unigram_entropy(
    split: str = "train",
    *,
    model_path: Optional[str] = None,
    replace_newlines_with: str = NEWLINE_PIECE,
) -> float:
    """Returns the unigram entropy of the corpus in nats per token under the vocabulary.

    This is the cross-entropy a model that ignores context entirely (and knows the exact token
    frequencies) achieves; an LM whose loss is below it has learned something from context.

    Args:
        split: "train" or "validation".
        model_path: The sentencepiece model; defaults to the shipped one.
        replace_newlines_with: Newline replacement applied before tokenizing.

    Returns:
        -sum_t p(t) log p(t), natural log.
    """
    counts = unigram_counts(
        split, model_path=model_path, replace_newlines_with=replace_newlines_with
    )
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


# ------------------------------------------------------------------------------------------------
# Regenerating the shipped files (a developer step; results are committed).
# ------------------------------------------------------------------------------------------------


def _stdlib_docstrings(min_chars: int) -> Iterator[tuple[str, str]]:
    """Yields (id, docstring) for module/class/function docstrings of the stdlib sources."""
    import ast  # pylint: disable=import-outside-toplevel
    import sysconfig  # pylint: disable=import-outside-toplevel

    root = sysconfig.get_paths()["stdlib"]
    skip_dirs = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            try:
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            for node in ast.walk(tree):
                if not isinstance(node, nodes):
                    continue
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    qual = getattr(node, "name", "")
                    yield f"stdlib/{rel}:{qual}:{getattr(node, 'lineno', 0)}", doc


def regenerate_corpus(path: str = CORPUS_PATH, *, min_chars: int = 300) -> int:
    """Rewrites the shipped corpus from this interpreter's documentation (developer step).

    Args:
        path: Output path.
        min_chars: Docstrings shorter than this are skipped.

    Returns:
        The number of documents written.
    """
    import pydoc_data.topics  # pylint: disable=import-outside-toplevel

    docs: dict[str, str] = {}
    for key in sorted(pydoc_data.topics.topics):
        docs[f"pydoc/{key}"] = pydoc_data.topics.topics[key].strip()
    seen = set(docs.values())
    for doc_id, text in _stdlib_docstrings(min_chars):
        text = text.strip()
        if text not in seen:
            seen.add(text)
            docs[doc_id] = text
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # mtime=0 keeps the file byte-identical across regenerations.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for doc_id in sorted(docs):
            line = json.dumps({"id": doc_id, "text": docs[doc_id]}, ensure_ascii=False)
            gz.write((line + "\n").encode("utf-8"))
    return len(docs)


def _training_sentences(max_bytes: int = 4000) -> Iterator[str]:
    """Yields train-split text chunks with newlines replaced, as the vocabulary will see them."""
    for doc in read_corpus("train"):
        text = doc["text"].replace("\n", NEWLINE_PIECE)
        while text:
            chunk = text[:max_bytes]
            # Cut at a space when possible so words are not split by chunking.
            cut = chunk.rfind(" ") if len(text) > max_bytes else -1
            if cut > max_bytes // 2:
                chunk = chunk[:cut]
            yield chunk
            text = text[len(chunk) :]


def train_vocab(
    output_path: Optional[str] = None,
    *,
    vocab_size: int = VOCAB_SIZE,
    user_defined_symbols: Sequence[str] = (NEWLINE_PIECE,),
) -> str:
    """Trains the sentencepiece BPE vocabulary on the train split (developer step).

    Ids follow seqio's convention: pad=0, eos=1, unk=2, no bos. Byte fallback makes every text
    encodable; normalization is the identity so decoding returns the input text.

    Args:
        output_path: The `.model` path; defaults to the shipped location.
        vocab_size: The number of ids.
        user_defined_symbols: Pieces always kept whole (the newline replacement).

    Returns:
        The written model path.
    """
    import io  # pylint: disable=import-outside-toplevel

    import sentencepiece as spm  # pylint: disable=import-outside-toplevel

    output_path = output_path or vocab_path()
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=_training_sentences(),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=0.9995,
        byte_fallback=True,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        user_defined_symbols=list(user_defined_symbols),
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        max_sentence_length=8192,
        num_threads=1,
        minloglevel=2,
    )
    os.makedirs(os.path.dirname(output_path), exist_ok=True)
    with open(output_path, "wb") as f:
        f.write(model.getvalue())
    return output_path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regenerate", action="store_true", help="Rewrite corpus and vocab.")
    parser.add_argument("--prepare", action="store_true", help="Build the TFDS data set.")
    args = parser.parse_args()
    if args.regenerate:
        print("documents:", regenerate_corpus())
        print("vocab:", train_vocab())
    if args.prepare:
        print("data_dir:", prepare())
    print("unigram entropy (nats/token, train):", corpus_unigram_entropy("train"))
