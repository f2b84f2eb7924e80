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
# Patterns known to match every character (Llama 3's; its last alternatives take any whitespace
# run, the ones before every letter, digit and other character).
_TOTAL_PATTERNS = frozenset({DEFAULT_PATTERN})
# The largest tokenizer file read (Llama 3's is about 9 MB).
_MAX_TOKENIZER_BYTES = 256 * 2**20
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
        if not os.path.isfile(path):  # A FIFO would block the open; a directory is no file.
            raise ValueError("not a regular file")
        if os.path.getsize(path) > _MAX_TOKENIZER_BYTES:
            raise ValueError(f"over {_MAX_TOKENIZER_BYTES} bytes")
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        token_ids = spec["model"]["vocab"]
        if not isinstance(token_ids, dict) or not token_ids:
            raise ValueError("model.vocab is not a non-empty token -> id mapping")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        detail = str(e)[:200]
        raise ValueError(
            f"{path} is not a valid tokenizer file ({type(e).__name__}: {detail}); {fix}."
        ) from None
    ranks = {_token_bytes(token, path=path): int(i) for token, i in token_ids.items()}
    return tiktoken.Encoding(
        name=os.path.basename(path),
        pat_str=_pattern(spec.get("pre_tokenizer")) or DEFAULT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=_special_tokens(spec, token_ids, path=path),
    )


def _special_tokens(spec: dict, token_ids: dict, *, path: str) -> dict[str, int]:
    """The special added tokens {content: id}: each id outside the ordinary tokens' ids.

    Args:
        spec: The parsed tokenizer.json.
        token_ids: Its `model.vocab` (ordinary token -> id).
        path: The file, for messages.

    Returns:
        The special tokens not already ordinary tokens.

    Raises:
        ValueError: If an id is not a non-negative integer, or is an ordinary token's or another
            special token's id (the message names both tokens).
    """
    by_id = {int(i): token for token, i in token_ids.items()}
    added = spec.get("added_tokens", []) or []
    if not isinstance(added, list):
        raise ValueError(f"{path}: added_tokens must be a list; fix the tokenizer file")
    specials: dict[str, int] = {}
    special_by_id: dict[int, str] = {}
    for i, t in enumerate(added):
        if not isinstance(t, dict) or not t.get("special", False):
            continue
        content, tid = t.get("content"), t.get("id")
        if not isinstance(content, str) or not isinstance(tid, int) or isinstance(tid, bool):
            raise ValueError(
                f"{path}: added_tokens[{i}] needs a string content and an integer id; fix the "
                f"tokenizer file"
            )
        if content in token_ids:
            continue  # Already an ordinary token.
        if tid < 0 or tid in by_id:
            other = f"ordinary token {by_id[tid]!r}" if tid in by_id else "no valid id"
            raise ValueError(
                f"{path}: special token {content!r} (added_tokens[{i}]) has id {tid}, which is "
                f"{other}'s; give special tokens ids outside the ordinary ids "
                f"(>= {max(by_id) + 1}) in the tokenizer file"
            )
        if tid in special_by_id:
            raise ValueError(
                f"{path}: special tokens {special_by_id[tid]!r} and {content!r} share id {tid}; "
                f"give each its own id in the tokenizer file"
            )
        specials[content], special_by_id[tid] = tid, content
    return specials


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
        # Whether the regex matches every character (then tiktoken's own encode is exact);
        # else encode() also encodes the text between matches.
        pattern = self._encoding._pat_str  # pylint: disable=protected-access
        self._total_pattern = pattern in _TOTAL_PATTERNS
        if not self._total_pattern:
            import regex  # pylint: disable=import-outside-toplevel (a tiktoken dependency)

            self._regex = regex.compile(pattern)
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
        """Token ids of text `s`.

        Text the pre-tokenization regex does not match (possible with a file's own regex) is
        not dropped: each stretch between matches is a piece of its own, encoded byte-level by
        the BPE (as a Hugging Face `Split` pre-tokenizer keeps it), so `decode(encode(s)) == s`.
        """
        if self._total_pattern:
            return self._encoding.encode(s, disallowed_special=())
        ids, end = [], 0
        for match in self._regex.finditer(s):
            if match.start() > end:
                ids += self._encoding._encode_single_piece(s[end : match.start()])  # pylint: disable=protected-access
            if match.end() > match.start():
                ids += self._encoding._encode_single_piece(match.group())  # pylint: disable=protected-access
            end = max(end, match.end())
        if end < len(s):
            ids += self._encoding._encode_single_piece(s[end:])  # pylint: disable=protected-access
        return ids

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
