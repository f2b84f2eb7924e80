"""Language-model input processing: tokenization, concatenate-and-split, packing, eval slicing.

Every processor here emits the batch keys of the language-model contract (int32):

- `input_ids` [T]: the tokens the model reads;
- `target_labels` [T]: the next tokens to predict; the vocabulary's pad id (0) where there is
  no target;
- `target_num_bytes` []: the UTF-8 bytes the targets stand for (EOS and the newline piece count
  one byte each), for bits-per-byte metrics;
- packed examples (`packing=True`) also `input_segment_ids` [T] (1, 2, ... per document chunk,
  0 on padding) and `input_positions` [T] (0-based position inside the segment).

A document `t1 .. tn` becomes inputs `EOS t1 .. tn` and targets `t1 .. tn EOS` (EOS doubles as
the beginning-of-sequence token, as in the reference library).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from axlearn.common.config import InstantiableConfig, maybe_instantiate
from axlearn.common.input_feed import derive_seed
from axlearn.common.input_lm_seq2seq import (  # noqa: F401 (public re-exports)
    InputDataType,
    ModelType,
    PackingMethodType,
    augment_text_from_inputs_targets_pretokenized,
    joint_truncation_for_seq2seq_lm_input,
    lm_from_seq2seq_text_preprocessor,
    make_autoregressive_inputs,
    text2text_lm_input,
)
from axlearn.common.input_packing import _trim_and_pack_with_segments  # noqa: F401
from axlearn.common.input_tf_data import DatasetToDatasetFn, handle_malformed

if TYPE_CHECKING:  # pragma: no cover
    import seqio
    import tensorflow as tf


# {(id(vocab), newline_piece): (vocab, lengths)}; the vocab is kept so its id stays unique.
_BYTE_LENGTHS: dict = {}


def _byte_lengths_cached(vocab: Any, newline_piece: Optional[str]) -> np.ndarray:
    key = (id(vocab), newline_piece)
    if key not in _BYTE_LENGTHS:
        _BYTE_LENGTHS[key] = (vocab, _compute_byte_lengths(vocab, newline_piece))
    return _BYTE_LENGTHS[key][1]


def _compute_byte_lengths(vocab: Any, newline_piece: Optional[str]) -> np.ndarray:
    sp_model = getattr(vocab, "tokenizer", None)
    size = vocab.vocab_size
    lengths = np.zeros([size], dtype=np.int32)
    if sp_model is not None and hasattr(sp_model, "id_to_piece"):
        for i in range(sp_model.get_piece_size()):
            piece = sp_model.id_to_piece(i)
            if i == vocab.eos_id or (newline_piece is not None and piece == newline_piece):
                lengths[i] = 1
            elif sp_model.is_byte(i) or sp_model.is_unknown(i):
                lengths[i] = 1
            elif sp_model.is_control(i):
                lengths[i] = 0
            else:
                lengths[i] = len(piece.replace("\u2581", " ").encode("utf-8"))
        return lengths
    # Generic vocabularies (e.g. seqio.ByteVocabulary): decode each id.
    for i in range(size):
        if i == vocab.pad_id:
            continue
        if i == vocab.eos_id:
            lengths[i] = 1
            continue
        try:
            lengths[i] = len(vocab.decode([i]).encode("utf-8"))
        except Exception:  # pylint: disable=broad-except
            lengths[i] = 0
    return lengths


def vocab_byte_lengths(vocab: seqio.Vocabulary, *, newline_piece: Optional[str] = None):
    """Returns an int32 array: the UTF-8 bytes each token id stands for.

    Args:
        vocab: A seqio vocabulary.
        newline_piece: The piece newlines were replaced with (counts one byte), if any.

    Returns:
        np.ndarray of shape [vocab.vocab_size]; pad and control ids are 0, EOS is 1.
    """
    return _byte_lengths_cached(vocab, newline_piece)


def _newline_piece(replace_newlines_with: str) -> Optional[str]:
    return None if replace_newlines_with == "\n" else replace_newlines_with


def num_bytes(
    ids: tf.Tensor, *, vocab: seqio.Vocabulary, newlines_replaced_with: str = "\n"
) -> tf.Tensor:
    """Returns the UTF-8 bytes `ids` stand for, summed over the last axis (int32).

    Args:
        ids: Token ids, any shape.
        vocab: The vocabulary.
        newlines_replaced_with: The newline replacement used when tokenizing.

    Returns:
        An int32 tensor of shape `ids.shape[:-1]`.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    table = tf.constant(
        vocab_byte_lengths(vocab, newline_piece=_newline_piece(newlines_replaced_with))
    )
    return tf.reduce_sum(tf.gather(table, ids), axis=-1)


def _replace_newlines(text: tf.Tensor, replace_newlines_with: str) -> tf.Tensor:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if replace_newlines_with == "\n":
        return text
    rewrite = replace_newlines_with.replace("\\", "\\\\")
    return tf.strings.regex_replace(text, "\n", rewrite, replace_global=True)


def tokenize(
    vocab_cfg: InstantiableConfig,
    *,
    input_key: str = "text",
    output_key: str = "tokens",
    replace_newlines_with: str = "\n",
    passthrough_keys: tuple[str, ...] = (),
) -> DatasetToDatasetFn:
    """Returns a processor mapping `{input_key: text}` examples to `{output_key: int32 ids}`.

    Text must be valid UTF-8: other records are malformed (see `Input.malformed_records`).

    Args:
        vocab_cfg: Config of a seqio vocabulary.
        input_key: The text field.
        output_key: The output field.
        replace_newlines_with: Newlines are replaced with this string before tokenizing.

    Returns:
        A DatasetToDatasetFn.
    """
    vocab = maybe_instantiate(vocab_cfg)

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def is_valid(ex):
            text = ex[input_key]
            clean = tf.strings.unicode_transcode(
                text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
            )
            return tf.equal(clean, text)

        ds = handle_malformed(
            ds,
            is_valid=is_valid,
            what=f"field '{input_key}' is not valid UTF-8",
            detail=lambda ex: tf.strings.substr(ex[input_key], 0, 80),
        )

        def encode(ex):
            text = _replace_newlines(ex[input_key], replace_newlines_with)
            out = {k: ex[k] for k in passthrough_keys if k in ex}
            out[output_key] = tf.cast(vocab.encode_tf(text), tf.int32)
            return out

        return ds.map(
            tf.autograph.experimental.do_not_convert(encode), num_parallel_calls=tf.data.AUTOTUNE
        )

    return fn


def concatenate_and_split(
    max_len: int,
    *,
    vocab: seqio.Vocabulary,
    replace_newlines_with: str = "\n",
    window_size: int = 128,
    max_padding_fraction: float = 1.0,
    input_key: str = "tokens",
) -> DatasetToDatasetFn:
    """Returns a processor concatenating documents (EOS after each) and cutting `max_len` pieces.

    Windows of `window_size` documents are concatenated into one token stream; inputs are the
    stream shifted right by one (the window's last EOS first), targets the stream. A window's
    tail shorter than `max_len` is padded when it has more than
    `max_len * (1 - max_padding_fraction)` tokens, else dropped. Tokens of one window may attend
    to the previous document of the same piece (no segment ids; see `pack` for that).

    Args:
        max_len: The sequence length.
        vocab: The vocabulary (pad and EOS ids, byte lengths).
        replace_newlines_with: The newline replacement used when tokenizing (byte counts).
        window_size: Documents per window.
        max_padding_fraction: The largest padded fraction of a kept tail piece.
        input_key: The tokens field.

    Returns:
        A DatasetToDatasetFn.
    """
    if not 0 <= max_padding_fraction <= 1:
        raise ValueError(f"max_padding_fraction must be in [0, 1], got {max_padding_fraction}")
    min_tail = int(max_len * (1 - max_padding_fraction))

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        pad_id, eos_id = vocab.pad_id, vocab.eos_id

        def split(window):
            tokens = window[input_key]
            rows = tokens.nrows()
            eos = tf.fill([rows, 1], tf.constant(eos_id, tf.int32))
            stream = tf.concat([tokens, tf.RaggedTensor.from_tensor(eos)], axis=1).flat_values
            inputs = tf.roll(stream, shift=1, axis=0)
            n = tf.shape(stream)[0]
            rem = n % max_len
            keep_tail = rem > min_tail
            length = tf.where(keep_tail, n + (max_len - rem) % max_len, n - rem)

            def fit(x):
                x = tf.concat([x, tf.fill([max_len], tf.constant(pad_id, tf.int32))], 0)
                return tf.reshape(x[:length], [-1, max_len])

            targets = fit(stream)
            return {
                "input_ids": fit(inputs),
                "target_labels": targets,
                "target_num_bytes": num_bytes(
                    targets, vocab=vocab, newlines_replaced_with=replace_newlines_with
                ),
            }

        ds = ds.ragged_batch(window_size, drop_remainder=False)
        ds = ds.map(
            tf.autograph.experimental.do_not_convert(split), num_parallel_calls=tf.data.AUTOTUNE
        )
        return ds.unbatch()

    return fn


def pack(
    max_len: int,
    *,
    vocab: seqio.Vocabulary,
    replace_newlines_with: str = "\n",
    input_key: str = "tokens",
) -> DatasetToDatasetFn:
    """Returns a processor packing documents into `max_len` sequences with segment ids.

    Each document becomes (inputs `EOS t1..tn`, targets `t1..tn EOS`); documents longer than
    `max_len` are cut into `max_len` chunks (each its own segment). Chunks are packed in order
    (next fit): a chunk that does not fit in the current sequence closes it (padded) and starts
    the next. Every token of every document appears exactly once.

    Args:
        max_len: The sequence length.
        vocab: The vocabulary (pad and EOS ids, byte lengths).
        replace_newlines_with: The newline replacement used when tokenizing (byte counts).
        input_key: The tokens field.

    Returns:
        A DatasetToDatasetFn emitting input_ids, target_labels, input_segment_ids,
        input_positions and target_num_bytes.
    """

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        pad_id, eos_id = vocab.pad_id, vocab.eos_id
        pad = tf.constant(pad_id, tf.int32)

        def chunks(ex):
            tokens = ex[input_key]
            eos = tf.constant([eos_id], tf.int32)
            inputs = tf.concat([eos, tokens], 0)
            targets = tf.concat([tokens, eos], 0)
            n = tf.shape(inputs)[0]
            num_chunks = (n + max_len - 1) // max_len
            total = num_chunks * max_len
            lengths = tf.minimum(max_len, n - tf.range(num_chunks) * max_len)

            def shape(x):
                return tf.reshape(tf.concat([x, tf.fill([total - n], pad)], 0), [-1, max_len])

            return tf.data.Dataset.from_tensor_slices(
                {"inputs": shape(inputs), "targets": shape(targets), "length": lengths}
            )

        ds = ds.flat_map(tf.autograph.experimental.do_not_convert(chunks))
        # A sentinel longer than any chunk flushes the last sequence at the end of the data.
        sentinel = {
            "inputs": tf.fill([max_len], pad),
            "targets": tf.fill([max_len], pad),
            "length": tf.constant(max_len + 1, tf.int32),
        }
        ds = ds.concatenate(tf.data.Dataset.from_tensors(sentinel))
        idx = tf.range(max_len)
        zeros = tf.zeros([max_len], tf.int32)
        init = {
            "inputs": tf.fill([max_len], pad),
            "targets": tf.fill([max_len], pad),
            "segments": zeros,
            "positions": zeros,
            "fill": tf.constant(0, tf.int32),
            "num_segments": tf.constant(0, tf.int32),
        }

        def step(state, chunk):
            length = chunk["length"]
            flush = state["fill"] + length > max_len
            out = {
                "input_ids": state["inputs"],
                "target_labels": state["targets"],
                "input_segment_ids": state["segments"],
                "input_positions": state["positions"],
                "valid": tf.logical_and(flush, state["fill"] > 0),
            }
            # Where the chunk goes: after the current content, or at 0 in a fresh sequence.
            start = tf.where(flush, 0, state["fill"])
            seg = tf.where(flush, 1, state["num_segments"] + 1)
            place = (idx >= start) & (idx < start + length)
            keep = tf.logical_not(flush) & (idx < start)
            base = {
                "inputs": tf.where(keep, state["inputs"], pad),
                "targets": tf.where(keep, state["targets"], pad),
                "segments": tf.where(keep, state["segments"], 0),
                "positions": tf.where(keep, state["positions"], 0),
            }
            new_state = {
                "inputs": tf.where(place, tf.roll(chunk["inputs"], start, 0), base["inputs"]),
                "targets": tf.where(place, tf.roll(chunk["targets"], start, 0), base["targets"]),
                "segments": tf.where(place, seg, base["segments"]),
                "positions": tf.where(place, idx - start, base["positions"]),
                "fill": start + length,
                "num_segments": seg,
            }
            return new_state, out

        ds = ds.scan(init, tf.autograph.experimental.do_not_convert(step))
        ds = ds.filter(tf.autograph.experimental.do_not_convert(lambda ex: ex["valid"]))

        def finish(ex):
            del ex["valid"]
            ex["target_num_bytes"] = num_bytes(
                ex["target_labels"], vocab=vocab, newlines_replaced_with=replace_newlines_with
            )
            return ex

        return ds.map(
            tf.autograph.experimental.do_not_convert(finish), num_parallel_calls=tf.data.AUTOTUNE
        )

    return fn


def text_to_lm_training_input(
    vocab_cfg: InstantiableConfig,
    max_len: int,
    replace_newlines_with: str = "\n",
    window_size: int = 128,
    max_padding_fraction: float = 1,
    shuffle_buffer_size: int = 1024,
    is_training: bool = True,
    packing: bool = False,
    packing_method: Optional[PackingMethodType] = None,
) -> DatasetToDatasetFn:
    """Returns a processor turning `{"text"}` documents into training examples of `max_len`.

    Steps: repeat the documents (when training), tokenize, then concatenate-and-split
    (`concatenate_and_split`) or pack with segment ids (`packing=True`, see `pack`), then shuffle
    the pieces with a `shuffle_buffer_size` buffer.

    Args:
        vocab_cfg: Config of a seqio vocabulary.
        max_len: The sequence length.
        replace_newlines_with: Newlines are replaced with this string before tokenizing.
        window_size: Documents concatenated per window (concatenate-and-split only).
        max_padding_fraction: See `concatenate_and_split`.
        shuffle_buffer_size: Shuffle buffer of the produced pieces (0: no shuffling).
        is_training: Whether for training (repeats the data).
        packing: Pack documents with segment ids and positions instead of concatenating.
        packing_method: AXLearn's name for the choice: `EOS_DELIM_NO_MASK` concatenates
            (packing=False), `EOS_DELIM_MASK` packs with segment ids (packing=True); None:
            `packing` decides.

    Returns:
        A DatasetToDatasetFn.

    Raises:
        ValueError: If packing_method contradicts packing=True.
    """
    if packing_method is not None:
        packing_method = PackingMethodType(packing_method)
        if packing and packing_method == PackingMethodType.EOS_DELIM_NO_MASK:
            raise ValueError(
                "text_to_lm_training_input: packing=True contradicts "
                "packing_method=EOS_DELIM_NO_MASK; set only one of them"
            )
        packing = packing_method == PackingMethodType.EOS_DELIM_MASK
    vocab = maybe_instantiate(vocab_cfg)
    tokenizer = tokenize(vocab, replace_newlines_with=replace_newlines_with)
    if packing:
        splitter = pack(max_len, vocab=vocab, replace_newlines_with=replace_newlines_with)
    else:
        splitter = concatenate_and_split(
            max_len,
            vocab=vocab,
            replace_newlines_with=replace_newlines_with,
            window_size=window_size,
            max_padding_fraction=max_padding_fraction,
        )

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        if is_training:
            ds = ds.repeat()
        ds = splitter(tokenizer(ds))
        if shuffle_buffer_size > 0:
            ds = ds.shuffle(
                shuffle_buffer_size,
                seed=derive_seed("text_to_lm_training_input/shuffle"),
                reshuffle_each_iteration=True,
            )
        return ds

    return fn


def lm_text_preprocessor(
    *,
    vocab_cfg: InstantiableConfig,
    max_sequence_length: int,
    replace_newlines_with: str,
    window_size: int = 128,
    max_padding_fraction: float = 1,
    shuffle_buffer_size: int = 1024 * 8,
    is_training: Optional[bool] = None,
) -> DatasetToDatasetFn:
    """AXLearn's LM text preprocessor: `{"text"}` documents -> training examples.

    Tokenizes (newlines replaced by `replace_newlines_with`), concatenates windows of
    `window_size` documents (EOS after each) and cuts them into `max_sequence_length` pieces,
    keeping a padded tail only when at most `max_padding_fraction` of it is padding (see
    `concatenate_and_split`), then shuffles the pieces (`shuffle_buffer_size`; 0: no shuffle).
    The data are not repeated here (a mixture source repeats its sources).

    Args:
        vocab_cfg: Config of a seqio vocabulary.
        max_sequence_length: The sequence length.
        replace_newlines_with: Newlines are replaced with this string before tokenizing.
        window_size: Documents concatenated per window.
        max_padding_fraction: The largest padded fraction of a kept tail piece.
        shuffle_buffer_size: Shuffle buffer of the pieces (0: no shuffling).
        is_training: Unused (accepted so an Input can set it).

    Returns:
        A DatasetToDatasetFn.
    """
    del is_training
    return text_to_lm_training_input(
        vocab_cfg=vocab_cfg,
        max_len=max_sequence_length,
        replace_newlines_with=replace_newlines_with,
        window_size=window_size,
        max_padding_fraction=max_padding_fraction,
        shuffle_buffer_size=shuffle_buffer_size,
        is_training=False,
    )


def text_to_lm_eval_input(
    vocab_cfg: InstantiableConfig,
    max_len: int,
    replace_newlines_with: str = "\n",
    stride: Optional[int] = None,
    is_training: bool = False,
    index_key: Optional[str] = None,
) -> DatasetToDatasetFn:
    """Returns a processor turning each document into strided `max_len` eval windows.

    A document (inputs `EOS t1..tn`, targets `t1..tn EOS`, padded to a multiple of `max_len`) is
    read by windows starting at 0, stride, 2 * stride, ... (and a last one ending at the padded
    end); each target position is scored by exactly one window (the first that covers it), the
    others have it replaced by the pad id. Windows with no target bytes are dropped. So every
    token of every document is scored once, with at least `max_len - stride` tokens of context
    after the first window.

    Args:
        vocab_cfg: Config of a seqio vocabulary.
        max_len: The sequence length.
        replace_newlines_with: Newlines are replaced with this string before tokenizing.
        stride: Window stride in (0, max_len]; None: max_len (disjoint windows).
        is_training: Must be False (kept for config compatibility).
        index_key: If set, every window carries this field: the document's own value of it, or
            else the document's 0-based position in the input (to group windows by document).

    Returns:
        A DatasetToDatasetFn.
    """
    del is_training
    stride = max_len if stride is None else stride
    if not 0 < stride <= max_len:
        raise ValueError(f"stride must be in (0, max_len={max_len}], got {stride}")
    vocab = maybe_instantiate(vocab_cfg)
    tokenizer = tokenize(
        vocab,
        replace_newlines_with=replace_newlines_with,
        passthrough_keys=(index_key,) if index_key else (),
    )

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        pad_id, eos_id = vocab.pad_id, vocab.eos_id
        if index_key and index_key not in ds.element_spec:
            ds = ds.enumerate().map(
                tf.autograph.experimental.do_not_convert(lambda i, ex: {**ex, index_key: i})
            )

        def windows(ex):
            tokens = ex["tokens"]
            eos = tf.constant([eos_id], tf.int32)
            inputs = tf.concat([eos, tokens], 0)
            targets = tf.concat([tokens, eos], 0)
            n = tf.shape(inputs)[0]
            total = ((n + max_len - 1) // max_len) * max_len
            padding = tf.fill([total - n], tf.constant(pad_id, tf.int32))
            inputs, targets = tf.concat([inputs, padding], 0), tf.concat([targets, padding], 0)
            starts = tf.range(0, total - max_len + 1, stride)
            last = total - max_len
            starts = tf.cond(
                starts[-1] < last, lambda: tf.concat([starts, [last]], 0), lambda: starts
            )
            prev_end = tf.concat([[0], starts[:-1] + max_len], 0)
            pos = starts[:, None] + tf.range(max_len)[None, :]
            scored = pos >= prev_end[:, None]
            window_targets = tf.where(scored, tf.gather(targets, pos), pad_id)
            nbytes = num_bytes(
                window_targets, vocab=vocab, newlines_replaced_with=replace_newlines_with
            )
            keep = nbytes > 0
            out = {
                "input_ids": tf.boolean_mask(tf.gather(inputs, pos), keep),
                "target_labels": tf.boolean_mask(window_targets, keep),
                "target_num_bytes": tf.boolean_mask(nbytes, keep),
            }
            if index_key:
                num = tf.shape(out["input_ids"])[0]
                index = ex[index_key]
                out[index_key] = tf.repeat(tf.expand_dims(index, 0), num, axis=0)
            return tf.data.Dataset.from_tensor_slices(out)

        return tokenizer(ds).flat_map(tf.autograph.experimental.do_not_convert(windows))

    return fn
