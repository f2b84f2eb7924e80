"""Fuji v3's tiktoken vocabulary (AXLearn's `vocabulary_fuji_v3.FujiV3Vocabulary`).

A seqio vocabulary over a byte-level BPE tokenizer file in the Hugging Face `tokenizer.json` format
(e.g. Llama 3's `Llama-3-tokenizer.json`, 128256 ids), encoded and decoded by the `tiktoken`
package. The file's `model.vocab` gives every token's id (its merge rank; token strings use the
GPT-2 byte-to-unicode alphabet), `added_tokens` the special tokens (`<|end_of_text|>` is EOS,
`<|finetune_right_pad_id|>` padding) and its `pre_tokenizer` split regex the pre-tokenization.

The file is looked up like a sentencepiece model (`axlearn.experiments.text.common.vocab`):
an absolute path as given, else `$DATA_DIR/tokenizers/sentencepiece/<filename>` and then the
package's tokenizer directory. Nothing is downloaded.

    config_for_class(FujiV3Vocabulary).set(filename="Llama-3-tokenizer.json")
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Optional

import numpy as np

from axlearn.experiments.text.common import vocab_search_dirs

# Llama 3's pre-tokenization regex (used when the file's pre_tokenizer states none).
DEFAULT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS_TOKEN = "<|end_of_text|>"  # The end-of-sequence special token.
PAD_TOKEN = "<|finetune_right_pad_id|>"  # The padding special token.
BOS_TOKEN = "<|begin_of_text|>"  # The beginning-of-sequence special token.


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode alphabet (printable stand-ins for all 256 bytes)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _token_bytes(token: str, *, path: str) -> bytes:
    table = _unicode_to_byte()
    try:
        return bytes(table[ch] for ch in token)
    except KeyError as e:
        raise ValueError(
            f"{path}: token {token!r} is not in the byte-level BPE alphabet; "
            "vocab_cfg.filename must name a byte-level BPE tokenizer.json (e.g. Llama 3's)."
        ) from e


def _pattern(spec: Any) -> Optional[str]:
    """The first Split regex of a tokenizer.json pre_tokenizer, or None."""
    if not isinstance(spec, dict):
        return None
    if spec.get("type") == "Split" and isinstance(spec.get("pattern"), dict):
        return spec["pattern"].get("Regex")
    for child in spec.get("pretokenizers", []) or []:
        found = _pattern(child)
        if found:
            return found
    return None


def resolve_tokenizer_file(filename: str) -> str:
    """The path of tokenizer file `filename` (see the module docstring for the lookup).

    Args:
        filename: A file name or absolute path.

    Returns:
        The path.

    Raises:
        FileNotFoundError: If it is in none of the searched places (the message lists them).
    """
    if os.path.isabs(filename):
        candidates = [filename]
    else:
        candidates = [os.path.join(d, filename) for d in vocab_search_dirs()]
    for path in candidates:
        if os.path.exists(path):
            return path
    raise FileNotFoundError(
        f"vocab_cfg.filename={filename!r}: tokenizer file not found; looked in: {candidates}. "
        "Put it under <data_dir>/tokenizers/sentencepiece/ and pass --data_dir, or set an "
        "absolute path."
    )


def load_tiktoken_encoding(path: str) -> Any:
    """A `tiktoken.Encoding` from a byte-level BPE tokenizer.json.

    Args:
        path: The file.

    Returns:
        The encoding (special tokens allowed in encode as plain text: see FujiV3Vocabulary).

    Raises:
        ValueError: If the file is not a JSON byte-level BPE tokenizer (names the file and fix).
    """
    import tiktoken  # pylint: disable=import-outside-toplevel

    fix = "vocab_cfg.filename must name a byte-level BPE tokenizer.json (e.g. Llama 3's)"
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        token_ids = spec["model"]["vocab"]
        if not isinstance(token_ids, dict) or not token_ids:
            raise ValueError("model.vocab is not a non-empty token -> id mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path} is not a valid tokenizer file ({type(e).__name__}: {e}); {fix}."
        ) from e
    ranks = {_token_bytes(token, path=path): int(i) for token, i in token_ids.items()}
    specials = {
        t["content"]: int(t["id"])
        for t in spec.get("added_tokens", []) or []
        if t.get("special", False) and t["content"] not in token_ids
    }
    return tiktoken.Encoding(
        name=os.path.basename(path),
        pat_str=_pattern(spec.get("pre_tokenizer")) or DEFAULT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=specials,
    )


class FujiV3Vocabulary:
    """A seqio vocabulary over a tokenizer.json, encoded by tiktoken (see the module docstring).

    It implements `seqio.Vocabulary`'s interface and is registered as one (a virtual subclass)
    when first instantiated, so importing this module (and the experiments naming it) imports
    neither seqio nor TensorFlow.

    Special tokens in the text are encoded as plain text (never as their special ids); decoding
    drops ids outside the vocabulary (e.g. padding beyond it) and keeps special tokens' text.
    """

    def __init__(self, filename: str):
        """Loads the tokenizer.

        Args:
            filename: The tokenizer.json file name or path (see `resolve_tokenizer_file`).
        """
        self._filename = filename
        self._encoding = load_tiktoken_encoding(resolve_tokenizer_file(filename))
        specials = self._encoding._special_tokens  # pylint: disable=protected-access
        self._eos_id = specials.get(EOS_TOKEN, 1)
        self._pad_id = specials.get(PAD_TOKEN, 0)
        self._bos_id = specials.get(BOS_TOKEN)
        self._extra_ids = 0
        import seqio  # pylint: disable=import-outside-toplevel

        seqio.Vocabulary.register(FujiV3Vocabulary)

    @property
    def encoding(self) -> Any:
        """The tiktoken Encoding."""
        return self._encoding

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def eos_id(self) -> Optional[int]:
        return self._eos_id

    @property
    def bos_id(self) -> Optional[int]:
        return self._bos_id

    @property
    def unk_id(self) -> Optional[int]:
        return None  # Byte-level BPE encodes every text.

    @property
    def extra_ids(self) -> int:
        """seqio extra ids after the vocabulary (none)."""
        return self._extra_ids

    @property
    def vocab_size(self) -> int:
        """Ids in all (tokens, special tokens and extra ids)."""
        return self._encoding.n_vocab + self._extra_ids

    def encode(self, s: str) -> list[int]:
        """Token ids of text `s`."""
        return self._encoding.encode(s, disallowed_special=())

    def decode(self, ids) -> str:
        """The text of `ids` (ids outside the vocabulary are dropped)."""
        ids = [int(i) for i in ids if 0 <= int(i) < self._encoding.n_vocab]
        return self._encoding.decode(ids)

    def encode_tf(self, s: Any) -> Any:
        """`encode` of a scalar string tensor, as an int32 tensor (inside tf.data)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def encode(x: np.ndarray) -> np.ndarray:
            x = x.item() if isinstance(x, np.ndarray) else x
            text = x.decode("utf-8") if isinstance(x, bytes) else str(x)
            return np.asarray(self.encode(text), dtype=np.int32)

        ids = tf.numpy_function(encode, [s], tf.int32, stateful=False)
        ids.set_shape([None])
        return ids

    def decode_tf(self, ids: Any) -> Any:
        """`decode` of an int tensor, as a scalar string tensor."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def decode(x: np.ndarray) -> bytes:
            return self.decode(x.tolist()).encode("utf-8")

        text = tf.numpy_function(decode, [ids], tf.string, stateful=False)
        text.set_shape([])
        return text

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, FujiV3Vocabulary) and self._filename == other._filename

    def __hash__(self) -> int:
        return hash((FujiV3Vocabulary, self._filename))
