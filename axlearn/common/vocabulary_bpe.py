"""Byte-level BPE (GPT-2 / RoBERTa style) as a seqio vocabulary (AXLearn's `vocabulary_bpe`).

`BPEVocabulary` reads a SentencePiece model of type BPE whose pieces are byte-level BPE tokens
(bytes shown as printable unicode characters, GPT-2's `bytes_to_unicode` table). Encoding:
1. split the text into pre-tokens with GPT-2's pattern (user-defined pieces such as `<s>` are
   kept whole);
2. map each pre-token's UTF-8 bytes to the printable characters;
3. let SentencePiece apply the BPE merges within each pre-token;
4. remap ids with `id_map` (e.g. to put the pad token at id 0, as seqio wants).
Decoding undoes these steps. Everything runs in TensorFlow (so it works inside `tf.data`).

Known differences from GPT-2's Python encoder: TensorFlow text truncates strings at a null
character, and the unknown piece in the input is split like ordinary text.
"""

from collections.abc import Sequence
from typing import Any, Optional

import regex
import seqio
import tensorflow as tf
import tensorflow_text as tft
from sentencepiece import sentencepiece_model_pb2

# Whitespace as Python's `regex` sees it (RE2's \s is only [\t\n\f\r ]).
_SPACE = r"\s\p{Z}\x0b\x85"
# GPT-2's pre-token pattern without its `\s+(?!\S)` lookahead (RE2 has none); see
# `BPEVocabulary._regex_split_tf` for how the lookahead is emulated.
_PRETOKEN = (
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?\p{{L}}+| ?\p{{N}}+| ?[^{_SPACE}\p{{L}}\p{{N}}]+|[{_SPACE}]+"
)
# A whitespace character that starts a word: GPT-2 gives it to the word, not to the run of
# whitespace before it.
_WORD_START = rf"[{_SPACE}][^{_SPACE}]+"
# Keep every delimiter (`(?s)`: `.` also matches newlines).
_KEEP_ALL = "(?s).*"
# The id a lookup table returns for a missing key.
_MISSING_ID = -100


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from byte values to printable unicode characters.

    Printable Latin-1 bytes map to themselves; the others (controls, space, ...) map to
    characters from U+0100 up, in byte order.

    Returns:
        {byte value: one-character string} for all 256 bytes.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def _lookup_table(mapping: dict[Any, Any], default: Any) -> tf.lookup.StaticHashTable:
    """A TensorFlow hash table of `mapping`, `default` for missing keys."""
    keys, values = zip(*mapping.items())
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant(values)),
        default_value=tf.constant(default),
    )


class BPEVocabulary(seqio.SentencePieceVocabulary):
    """A GPT-2 style byte-level BPE vocabulary on a SentencePiece BPE model.

    Args:
        sentencepiece_model_file: The SentencePiece model (BPE over byte-level pieces).
        extra_ids: The number of extra (sentinel) ids seqio appends.
        decode_errors: How UTF-8 errors are handled when decoding to Python strings (see
            `bytes.decode`).
        id_map: Optional bijective {model id: id}; ids are mapped after encoding and mapped back
            before decoding. The pad token must end up at id 0 (`seqio.PAD_ID`).
        decode_as_control: Ids (after `id_map`) that decoding drops, like control tokens.

    Raises:
        ValueError: If `id_map` is not bijective, `decode_as_control` repeats an id, or the pad
            token is not at `seqio.PAD_ID`.
    """

    def __init__(
        self,
        sentencepiece_model_file: str,
        extra_ids: int = 0,
        decode_errors: str = "replace",
        id_map: Optional[dict[int, int]] = None,
        decode_as_control: Optional[Sequence[int]] = None,
    ):
        super().__init__(sentencepiece_model_file, extra_ids=extra_ids)
        self._decode_errors = decode_errors
        id_map = dict(id_map or {})
        if set(id_map) != set(id_map.values()):
            raise ValueError(f"id_map must be bijective (a permutation of its keys): {id_map}.")
        self._id_map = id_map
        self._inv_id_map = {v: k for k, v in id_map.items()}
        self._id_map_tf = _lookup_table(id_map, _MISSING_ID) if id_map else None
        self._inv_id_map_tf = _lookup_table(self._inv_id_map, _MISSING_ID) if id_map else None

        self._model_proto = sentencepiece_model_pb2.ModelProto.FromString(self.sp_model)
        user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
        self._ud_pieces = {p.piece for p in self._model_proto.pieces if p.type == user_defined}
        # Longest first, so that a piece that prefixes another does not win.
        ud_sorted = sorted(self._ud_pieces, key=lambda p: (-len(p), p))
        self._ud_pat = "(" + "|".join(regex.escape(p) for p in ud_sorted) + ")"

        self._decode_as_control_map_tf = None
        if decode_as_control:
            if len(set(decode_as_control)) != len(decode_as_control):
                raise ValueError(f"decode_as_control must be unique: {decode_as_control}.")
            self._decode_as_control_map_tf = _lookup_table(
                {i: i for i in decode_as_control}, _MISSING_ID
            )

        if self.pad_id != seqio.PAD_ID:
            raise ValueError(
                f"Tokenizer uses pad_id {self.pad_id}, but seqio expects pad_id {seqio.PAD_ID}: "
                "set id_map to move the pad token."
            )

        table = _bytes_to_unicode()
        self._byte_encoder = _lookup_table({bytes([b]): c for b, c in table.items()}, "")
        self._byte_decoder = _lookup_table({c: bytes([b]) for b, c in table.items()}, "")
        # Kept for callers that read them.
        self._spc = _SPACE
        self._pat = _PRETOKEN

    @property
    def id_map(self) -> dict[int, int]:
        """The {model id: id} remapping (empty: none)."""
        return self._id_map

    def _mapped_piece_id(self, piece: str) -> int:
        """The id (after id_map) of `piece`."""
        model_id = self.tokenizer.PieceToId(piece)
        return self._id_map.get(model_id, model_id)

    @property
    def eos_id(self) -> Optional[int]:
        """The id of the trainer spec's eos piece (after id_map)."""
        return self._mapped_piece_id(self._model_proto.trainer_spec.eos_piece)

    @property
    def pad_id(self) -> Optional[int]:
        """The id of the trainer spec's pad piece (after id_map)."""
        return self._mapped_piece_id(self._model_proto.trainer_spec.pad_piece)

    @property
    def unk_id(self) -> Optional[int]:
        """The id of the trainer spec's unk piece (after id_map)."""
        return self._mapped_piece_id(self._model_proto.trainer_spec.unk_piece)

    @staticmethod
    def _remap_tf(table: Optional[tf.lookup.StaticHashTable], ids: tf.Tensor) -> tf.Tensor:
        """Ids through `table`; ids it lacks stay as they are."""
        if table is None:
            return ids
        ids = tf.convert_to_tensor(ids, dtype_hint=tf.int32)
        mapped = table.lookup(ids)
        return tf.where(mapped == _MISSING_ID, ids, mapped)

    def apply_id_map_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """Maps model ids to ids with id_map (`encode_tf` does this).

        Args:
            ids: An int32 tensor of any shape.

        Returns:
            The mapped ids, same shape.
        """
        return self._remap_tf(self._id_map_tf, ids)

    def apply_inv_id_map_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """Maps ids back to model ids (the inverse of `apply_id_map_tf`).

        Args:
            ids: An int32 tensor of any shape.

        Returns:
            The model ids, same shape.
        """
        return self._remap_tf(self._inv_id_map_tf, ids)

    def _encode(self, s: str) -> Sequence[int]:
        """Encodes a Python string to a list of ids (through `_encode_tf`)."""
        return self._encode_tf(tf.constant(s, dtype=tf.string)).numpy().tolist()

    def _decode(self, ids: Sequence[int]) -> str:
        """Decodes a list of ids to a Python string (through `_decode_tf`)."""
        text = self._decode_tf(tf.constant(list(ids), dtype=tf.int32)).numpy()
        return text.decode("utf-8", errors=self._decode_errors)

    def _regex_split_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Splits text into GPT-2 pre-tokens.

        GPT-2's `\\s+(?!\\S)` gives a run of whitespace all but its last character when a word
        follows; RE2 has no lookahead, so the text is first cut before each "whitespace + word",
        then each cut is split with the pattern (where a whitespace run takes all of itself).

        Args:
            s: A string scalar, or a 1-D string tensor (each element split on its own).

        Returns:
            A 1-D string tensor of the pre-tokens, in order.
        """
        cuts = tft.regex_split(s, _WORD_START, keep_delim_regex_pattern=_KEEP_ALL)
        return tft.regex_split(cuts, _PRETOKEN, keep_delim_regex_pattern=_KEEP_ALL).flat_values

    def _regex_split_with_ud_tokens_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Like `_regex_split_tf`, but user-defined pieces (e.g. `<s>`) stay whole tokens.

        As in Hugging Face tokenizers, the text between user-defined pieces is pre-tokenized
        segment by segment.

        Args:
            s: A string scalar.

        Returns:
            A 1-D string tensor of the pre-tokens, in order.
        """
        if not self._ud_pieces:
            return self._regex_split_tf(s)
        segments = tft.regex_split(s, self._ud_pat, keep_delim_regex_pattern=self._ud_pat)
        segments = tf.reshape(segments, [-1])  # The segments of the one input string.
        is_ud = tf.strings.regex_full_match(segments, self._ud_pat)
        # Pre-tokens of the other segments ([num_segments, None]; none for user-defined ones).
        plain = tf.where(is_ud, "", segments)
        cuts = tft.regex_split(plain, _WORD_START, keep_delim_regex_pattern=_KEEP_ALL)
        split = tft.regex_split(cuts.flat_values, _PRETOKEN, keep_delim_regex_pattern=_KEEP_ALL)
        split = cuts.with_flat_values(split).merge_dims(1, 2)
        # The user-defined segments themselves ([num_segments, 0 or 1]).
        whole = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(segments, is_ud), tf.cast(is_ud, tf.int64)
        )
        return tf.concat([split, whole], axis=1).flat_values

    @staticmethod
    def _lookup_or_keep(table: tf.lookup.StaticHashTable, keys: tf.Tensor) -> tf.Tensor:
        """`table[key]`, or the key itself where the table has none ("")."""
        values = table.lookup(keys)
        return tf.where(values == "", keys, values)

    def _byte_encode_tf(self, tokens: tf.Tensor) -> tf.Tensor:
        """Replaces each byte of each token by its printable character (GPT-2's table).

        Args:
            tokens: A 1-D string tensor.

        Returns:
            A 1-D string tensor of the same size.
        """
        single_bytes = tf.strings.bytes_split(tokens)
        return tf.strings.reduce_join(
            tf.ragged.map_flat_values(self._lookup_or_keep, self._byte_encoder, single_bytes),
            axis=-1,
        )

    def _chunk_byte_encode_tf(self, tokens: tf.Tensor, *, chunk_size: int) -> tf.Tensor:
        """`_byte_encode_tf` on groups of at most `chunk_size` tokens.

        Keeps each `reduce_join` small (one over a huge batch can overflow its int32 shape).

        Args:
            tokens: A 1-D string tensor.
            chunk_size: The most tokens per group (>= 1; a Python or tensor int).

        Returns:
            Same as `_byte_encode_tf(tokens)`.
        """
        num = tf.shape(tokens)[0]
        num_chunks = (num + chunk_size - 1) // chunk_size
        padded = tf.concat([tokens, tf.fill([num_chunks * chunk_size - num], "")], axis=0)
        groups = tf.reshape(padded, [num_chunks, chunk_size])
        encoded = tf.map_fn(
            self._byte_encode_tf, groups, fn_output_signature=tf.TensorSpec([None], tf.string)
        )
        return tf.reshape(encoded, [-1])[:num]

    def _byte_decode_tf(self, tokens: tf.Tensor) -> tf.Tensor:
        """Replaces each printable character by its byte (the inverse of `_byte_encode_tf`).

        Characters outside GPT-2's table (e.g. of user-defined pieces) stay as they are.

        Args:
            tokens: A string tensor of any shape.

        Returns:
            A string tensor of the same shape.
        """
        chars = tf.strings.unicode_split(tokens, "UTF-8")
        return tf.strings.reduce_join(
            tf.ragged.map_flat_values(self._lookup_or_keep, self._byte_decoder, chars), axis=-1
        )

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Encodes one string to ids (after id_map).

        Args:
            s: A string scalar.

        Returns:
            A 1-D int32 tensor.
        """
        tokens = self._regex_split_with_ud_tokens_tf(s)
        # Byte-encode in groups when one join over all tokens could pass INT32_MAX bytes.
        # (The max of no tokens is INT32_MIN, hence the floor of 1.)
        longest = tf.maximum(tf.reduce_max(tf.strings.length(tokens, unit="BYTE")), 1)
        longest = tf.cast(longest, tf.int64)
        too_big = tf.cast(tf.size(tokens), tf.int64) * longest >= tf.int32.max
        tokens = tf.cond(
            too_big,
            lambda: self._chunk_byte_encode_tf(
                tokens, chunk_size=tf.cast(tf.int32.max // longest, tf.int32)
            ),
            lambda: self._byte_encode_tf(tokens),
        )
        ids = super()._encode_tf(tokens).flat_values
        return self.apply_id_map_tf(ids)

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """Decodes ids (after id_map) to text, dropping the `decode_as_control` ids.

        Args:
            ids: An int32 tensor [num_tokens] or [batch, num_tokens].

        Returns:
            A string scalar, or [batch] strings.
        """
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.convert_to_tensor(ids, dtype_hint=tf.int32)
        if self._decode_as_control_map_tf is not None:
            dropped = self._decode_as_control_map_tf.lookup(ids) != _MISSING_ID
            ids = tf.ragged.boolean_mask(ids, ~dropped)
            if isinstance(ids, tf.RaggedTensor) and ids.shape.rank == 1:
                ids = ids.flat_values
        if isinstance(ids, tf.RaggedTensor):
            ids = tf.ragged.map_flat_values(self.apply_inv_id_map_tf, ids)
        else:
            ids = self.apply_inv_id_map_tf(ids)
        return self._byte_decode_tf(super()._decode_tf(ids))
