"""Text utilities for Grain pipelines (AXLearn's `input_grain_text`), in NumPy.

- `Vocabulary`: the vocabulary interface these functions use (a subset of `seqio.Vocabulary`:
  `pad_id`, `eos_id`, `bos_id`, `encode`, `_decode` and `decode`).
- `with_regex_mapping`: a vocabulary class that rewrites text by regexes before encoding and after
  decoding (e.g. newlines to "<n>" and back).
- `tokenize`: string fields -> int arrays (optionally with BOS/EOS).
- `num_bytes` / `count_num_bytes`: the UTF-8 bytes token ids stand for, an EOS counting one byte
  (the denominator of bits per byte).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Protocol, TypeVar, Union, runtime_checkable

import numpy as np

from axlearn.common.config import ConfigOr, maybe_instantiate
from axlearn.common.input_grain_transforms import Dataset

_T = TypeVar("_T")


@runtime_checkable
class Vocabulary(Protocol):
    """The text vocabulary interface (as `seqio.Vocabulary` has it)."""

    @property
    def pad_id(self) -> int:
        """The padding id."""

    @property
    def eos_id(self) -> Optional[int]:
        """The end-of-sequence id (None: none)."""

    @property
    def bos_id(self) -> Optional[int]:
        """The beginning-of-sequence id (None: none)."""

    def encode(self, s: str) -> Sequence[int]:
        """Returns the ids of `s`."""
        raise NotImplementedError(type(self))

    def _decode(self, ids: Sequence[int]) -> str:
        """Returns the text of all of `ids` (EOS ids included, not only up to the first)."""
        raise NotImplementedError(type(self))

    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of `ids` up to the first EOS."""
        raise NotImplementedError(type(self))


def _compile(mapping: Sequence[tuple[str, str]], what: str) -> list[tuple[re.Pattern, str]]:
    compiled = []
    for i, pair in enumerate(mapping):
        if len(pair) != 2:
            raise ValueError(
                f"with_regex_mapping: {what}[{i}]={pair!r} is not a (pattern, replacement) pair"
            )
        compiled.append((re.compile(pair[0]), pair[1]))
    return compiled


def with_regex_mapping(
    vocab_cls: _T,
    *,
    encode_mapping: Sequence[tuple[str, str]],
    decode_mapping: Sequence[tuple[str, str]],
) -> _T:
    """Returns a subclass of `vocab_cls` that rewrites text by regexes around the vocabulary.

    `encode(s)` first applies `re.sub(pattern, replacement, s)` for each pair of
    `encode_mapping` in order; `_decode` (and so `decode`, which calls it in seqio and in
    `Vocabulary` implementations) applies `decode_mapping` in order to the decoded text. To undo
    an encode mapping, list the decode pairs in the reverse order.

    Args:
        vocab_cls: The vocabulary class (e.g. `seqio.SentencePieceVocabulary`).
        encode_mapping: (pattern, replacement) pairs applied before encoding.
        decode_mapping: (pattern, replacement) pairs applied after decoding.

    Returns:
        The subclass (construct it with `vocab_cls`'s arguments).

    Raises:
        ValueError: If a mapping entry is not a pair (or a pattern does not compile: re.error).
    """
    encode_rules = _compile(encode_mapping, "encode_mapping")
    decode_rules = _compile(decode_mapping, "decode_mapping")

    def rewrite(text: str, rules: list[tuple[re.Pattern, str]]) -> str:
        for pattern, replacement in rules:
            text = pattern.sub(replacement, text)
        return text

    class _RegexMappedVocabulary(vocab_cls):  # type: ignore[misc,valid-type]
        """`vocab_cls` with regex rewriting before encoding and after decoding."""

        def encode(self, s: str) -> Sequence[int]:
            return super().encode(rewrite(s, encode_rules))

        def _decode(self, ids: Sequence[int]) -> str:
            return rewrite(super()._decode(ids), decode_rules)

    _RegexMappedVocabulary.__name__ = f"{getattr(vocab_cls, '__name__', 'Vocab')}WithRegexMapping"
    _RegexMappedVocabulary.__qualname__ = _RegexMappedVocabulary.__name__
    return _RegexMappedVocabulary


class _Tokenize:
    """Tokenizes the string fields of an example (picklable for prefetch workers)."""

    def __init__(self, vocab: Union[Vocabulary, dict[str, Vocabulary]], *, with_eos, with_bos):
        self._vocab, self._with_eos, self._with_bos = vocab, with_eos, with_bos

    def _encode(self, vocab: Vocabulary, text: Any) -> np.ndarray:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        ids = list(vocab.encode(text))
        if self._with_bos:
            ids.insert(0, vocab.bos_id)
        if self._with_eos:
            ids.append(vocab.eos_id)
        if any(i is None for i in ids):
            raise ValueError(
                "tokenize: with_bos/with_eos need a vocabulary with bos_id/eos_id, got None"
            )
        return np.asarray(ids, dtype=int)

    def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
        out = dict(example)  # The input example is not modified.
        if isinstance(self._vocab, dict):
            for key, vocab in self._vocab.items():
                out[key] = self._encode(vocab, example[key])
        else:
            for key, value in example.items():
                out[key] = self._encode(self._vocab, value)
        return out


def tokenize(
    ds: Dataset,
    *,
    vocab: Union[ConfigOr[Vocabulary], Mapping[str, ConfigOr[Vocabulary]]],
    with_eos: bool = False,
    with_bos: bool = False,
) -> Dataset:
    """Tokenizes string fields into int arrays.

    Args:
        ds: A dataset of dicts of strings (or UTF-8 bytes).
        vocab: One vocabulary (or config) for every field, or {field: vocabulary}: only those
            fields are tokenized (other fields pass through).
        with_eos: Whether to append `eos_id` to each field's ids.
        with_bos: Whether to prepend `bos_id` to each field's ids.

    Returns:
        The dataset with the fields as int arrays [num_ids].
    """
    if isinstance(vocab, Mapping):
        vocab = {key: maybe_instantiate(v) for key, v in vocab.items()}
    else:
        vocab = maybe_instantiate(vocab)
    return ds.map(_Tokenize(vocab, with_eos=with_eos, with_bos=with_bos))


def num_bytes(ids: np.ndarray, *, vocab: Vocabulary, eos_id: int) -> np.ndarray:
    """The UTF-8 bytes of the text of `ids`, each EOS counting one byte.

    The text is `vocab._decode(row)` (any text normalization, e.g. `with_regex_mapping`, is the
    vocabulary's); `_decode` is expected to leave EOS out of the text.

    Args:
        ids: Token ids [n] or [batch, n].
        vocab: The vocabulary.
        eos_id: The EOS id (keep it distinct from padding, which must count no bytes).

    Returns:
        A scalar for [n] ids, else [batch] counts (the dtype of `ids`).

    Raises:
        ValueError: If `ids` is not rank 1 or 2.
    """
    ids = np.asarray(ids)
    if ids.ndim not in (1, 2):
        raise ValueError(f"num_bytes: expected ids of rank 1 or 2, got shape {ids.shape}")
    rows = ids[None] if ids.ndim == 1 else ids
    counts = np.asarray(
        [
            len(vocab._decode(row).encode("utf-8"))  # pylint: disable=protected-access
            + int(np.sum(row == eos_id))
            for row in rows
        ],
        dtype=ids.dtype,
    )
    return counts[0] if ids.ndim == 1 else counts


class _CountNumBytes:
    def __init__(self, *, input_key: str, vocab: Vocabulary, eos_id: int, output_key: str):
        self._input_key, self._vocab = input_key, vocab
        self._eos_id, self._output_key = eos_id, output_key

    def __call__(self, example: dict[str, Any]) -> dict[str, Any]:
        count = num_bytes(example[self._input_key], vocab=self._vocab, eos_id=self._eos_id)
        return {**example, self._output_key: count}


def count_num_bytes(
    ds: Dataset,
    *,
    input_key: str,
    vocab: Vocabulary,
    eos_id: Optional[int] = None,
    output_key: Optional[str] = None,
) -> Dataset:
    """Adds the byte count (`num_bytes`) of `example[input_key]` to each example.

    Args:
        ds: A dataset of dicts with int ids [n] or [batch, n] under `input_key`.
        input_key: The key of the ids.
        vocab: The vocabulary decoding them.
        eos_id: The EOS id; None: `vocab.eos_id`.
        output_key: The key of the count; None: f"{input_key}_num_bytes".

    Returns:
        The dataset with `output_key` added.

    Raises:
        ValueError: If neither `eos_id` nor `vocab.eos_id` is set.
    """
    eos_id = vocab.eos_id if eos_id is None else eos_id
    if eos_id is None:
        raise ValueError(
            "count_num_bytes: the vocabulary has no eos_id; pass eos_id (an id distinct from "
            "padding)"
        )
    return ds.map(
        _CountNumBytes(
            input_key=input_key,
            vocab=vocab,
            eos_id=eos_id,
            output_key=output_key or f"{input_key}_num_bytes",
        )
    )
