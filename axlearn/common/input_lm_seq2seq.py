"""Sequence-to-sequence text inputs for language models: (source, target) pairs -> examples.

Part of the `axlearn.common.input_lm` API (every public name here is re-exported there, with
AXLearn's names). The pieces, in pipeline order:

- `augment_text_from_inputs_targets_pretokenized`: prompt, separator and newline replacement on
  the source and target texts, plus a `prefix` (the decoder's first tokens; default EOS);
- tokenization into `input_ids` (the source) and `target_labels` (the target, EOS appended);
- `joint_truncation_for_seq2seq_lm_input`: drops the oldest prefix/source tokens so that the
  whole sequence fits;
- `make_autoregressive_inputs`: one decoder stream `prefix + source + target` shifted by one,
  with -1 labels where nothing is to be predicted (the prefix; with `SEQ2SEQ_MASK` the source);
- `lm_from_seq2seq_text_preprocessor` chains them; `text2text_lm_input` builds encoder-decoder
  or decoder-only examples with positions and segment ids (padded or packed).

Label -1 means "no target" here (as in AXLearn's seq2seq inputs); input padding is 0.
TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Optional

from axlearn.common.config import ConfigOr, InstantiableConfig, maybe_instantiate
from axlearn.common.input_packing import _trim_and_pack_with_segments

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn

PUBLIC_MODULE = "axlearn.common.input_lm"
# The label of positions with nothing to predict.
IGNORE_LABEL = -1


class InputDataType(enum.Enum):
    """What an example holds.

    LM: plain text (no source); SEQ2SEQ_MASK: source and target, the source positions have no
    labels; SEQ2SEQ_NO_MASK: source and target, every position after the prefix has a label.
    """

    LM = "lm"
    SEQ2SEQ_MASK = "seq2seq_mask"
    SEQ2SEQ_NO_MASK = "seq2seq_no_mask"


class ModelType(enum.Enum):
    """The model the examples are for."""

    ENCODER_DECODER = "encoder_decoder"
    DECODER_ONLY = "decoder_only"


class PackingMethodType(enum.Enum):
    """How `text_to_lm_training_input` packs documents.

    EOS_DELIM_NO_MASK: documents concatenated with EOS between them and cut into pieces; tokens
    may attend across documents. EOS_DELIM_MASK: documents packed into pieces with segment ids
    and positions, so attention stays inside each document.
    """

    EOS_DELIM_NO_MASK = "eos_delim_no_mask"
    EOS_DELIM_MASK = "eos_delim_mask"


def _map(ds: tf.data.Dataset, fn) -> tf.data.Dataset:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return ds.map(tf.autograph.experimental.do_not_convert(fn), num_parallel_calls=tf.data.AUTOTUNE)


def _replace_newlines(text: tf.Tensor, replace_newlines_with: Optional[str]) -> tf.Tensor:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if replace_newlines_with is None or replace_newlines_with == "\n":
        return text
    return tf.strings.regex_replace(
        text, "\n", replace_newlines_with.replace("\\", "\\\\"), replace_global=True
    )


def augment_text_from_inputs_targets_pretokenized(
    *,
    replace_newlines_with: Optional[str] = "<n>",
    source_key: str = "inputs_pretokenized",
    target_key: str = "targets_pretokenized",
    eos_id: int = 1,
    prompt: str = "",
    join_with: str = "\n\n",
) -> DatasetToDatasetFn:
    """Returns a processor preparing (source, target) texts for a decoder-only model.

    The source becomes `prompt + source + join_with` and newlines in both texts are replaced by
    `replace_newlines_with` (None: kept). An example without `prefix` gets `prefix = eos_id`
    (int32 scalar: the token the decoder starts from). Other fields are kept.

    Args:
        replace_newlines_with: The newline replacement, or None.
        source_key: The source text field.
        target_key: The target text field.
        eos_id: The default prefix token.
        prompt: Text put before the source.
        join_with: Text put after the source (between source and target).

    Returns:
        A DatasetToDatasetFn.
    """

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def augment(ex):
            ex = dict(ex)
            source = tf.strings.join([prompt, ex[source_key], join_with])
            ex[source_key] = _replace_newlines(source, replace_newlines_with)
            ex[target_key] = _replace_newlines(ex[target_key], replace_newlines_with)
            if "prefix" not in ex:
                ex["prefix"] = tf.constant(eos_id, tf.int32)
            return ex

        return _map(ds, augment)

    return fn


def joint_truncation_for_seq2seq_lm_input(max_sequence_length: int) -> DatasetToDatasetFn:
    """Returns a processor truncating `prefix + input_ids + target_labels` to fit together.

    The decoder stream `prefix + input_ids (source) + target_labels (target, EOS included)` has
    `max_sequence_length + 1` tokens at most (inputs and labels are it shifted by one). The
    target is kept whole when it fits; the oldest tokens of `prefix + source` are dropped (the
    prefix first). A target longer than the whole budget is cut at its end.

    Args:
        max_sequence_length: The sequence length of the model inputs.

    Returns:
        A DatasetToDatasetFn changing `prefix`, `input_ids` and `target_labels`.
    """
    if max_sequence_length <= 0:
        raise ValueError(f"max_sequence_length must be positive, got {max_sequence_length}")
    budget = max_sequence_length + 1

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def truncate(ex):
            ex = dict(ex)
            prefix = tf.reshape(ex["prefix"], [-1])
            source, target = ex["input_ids"], ex["target_labels"][:budget]
            room = budget - tf.shape(target)[0]
            num_prefix, num_source = tf.shape(prefix)[0], tf.shape(source)[0]
            drop = tf.maximum(num_prefix + num_source - room, 0)
            ex["prefix"] = prefix[tf.minimum(drop, num_prefix) :]
            ex["input_ids"] = source[tf.maximum(drop - num_prefix, 0) :]
            ex["target_labels"] = target
            return ex

        return _map(ds, truncate)

    return fn


def _decoder_stream(prefix, source, target, *, mask_source: bool):
    """(input_ids, target_labels) of `prefix + source + target` shifted by one."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    dtype = target.dtype
    prefix = tf.cast(tf.reshape(prefix, [-1]), dtype)
    source = tf.cast(source, dtype)
    seq = tf.concat([prefix, source, target], 0)
    inputs, labels = seq[:-1], seq[1:]
    num_masked = tf.shape(prefix)[0] - 1
    if mask_source:
        num_masked += tf.shape(source)[0]
    num_masked = tf.maximum(num_masked, 0)
    labels = tf.where(tf.range(tf.shape(labels)[0]) < num_masked, IGNORE_LABEL, labels)
    return inputs, labels


def make_autoregressive_inputs(
    *,
    model_type: ModelType = ModelType.DECODER_ONLY,
    input_data_type: InputDataType = InputDataType.SEQ2SEQ_MASK,
    passthrough_keys: Optional[Sequence[str]] = None,
) -> DatasetToDatasetFn:
    """Returns a processor turning (prefix, source, target) ids into model inputs and labels.

    Reads `prefix` (the first decoder tokens), `input_ids` (the source; absent or ignored for
    `InputDataType.LM`) and `target_labels` (the target, EOS included).

    DECODER_ONLY: the stream `prefix + source + target` gives `input_ids = stream[:-1]` and
    `target_labels = stream[1:]`, with -1 labels where the next token is part of the prefix
    (and, for `SEQ2SEQ_MASK`, of the source). ENCODER_DECODER: `source.input_ids` is the source,
    `target.input_ids = (prefix + target)[:-1]` and `target_labels = (prefix + target)[1:]` with
    -1 on the prefix. `prefix` is kept; other fields are dropped unless in `passthrough_keys`,
    which are also left unchanged when the processor would write them.

    Args:
        model_type: The model the inputs are for.
        input_data_type: How labels of the source are treated (see `InputDataType`).
        passthrough_keys: Fields copied unchanged from the input example (missing ones ignored).

    Returns:
        A DatasetToDatasetFn.
    """
    model_type = ModelType(model_type)
    input_data_type = InputDataType(input_data_type)
    passthrough_keys = list(passthrough_keys or [])

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def build(ex):
            target = ex["target_labels"]
            prefix = tf.reshape(ex["prefix"], [-1])
            if input_data_type == InputDataType.LM or "input_ids" not in ex:
                source = tf.zeros([0], target.dtype)
            else:
                source = ex["input_ids"]
            if model_type == ModelType.DECODER_ONLY:
                inputs, labels = _decoder_stream(
                    prefix,
                    source,
                    target,
                    mask_source=input_data_type == InputDataType.SEQ2SEQ_MASK,
                )
                out = {"prefix": ex["prefix"], "input_ids": inputs, "target_labels": labels}
            else:
                inputs, labels = _decoder_stream(
                    prefix, tf.zeros([0], target.dtype), target, mask_source=False
                )
                out = {
                    "prefix": ex["prefix"],
                    "source": {"input_ids": source},
                    "target": {"input_ids": inputs},
                    "target_labels": labels,
                }
            for key in passthrough_keys:
                if key in ex:
                    out[key] = ex[key]
            return out

        return _map(ds, build)

    return fn


def _trim_and_pad(x, length: int, pad_value: int):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    x = x[:length]
    return tf.pad(x, [[0, length - tf.shape(x)[0]]], constant_values=pad_value)


def lm_from_seq2seq_text_preprocessor(
    *,
    is_training: bool,
    vocab_cfg: InstantiableConfig,
    max_sequence_length: int,
    input_data_type: InputDataType = InputDataType.SEQ2SEQ_MASK,
    replace_newlines_with: Optional[str] = "<n>",
    source_key: str = "inputs_pretokenized",
    target_key: str = "targets_pretokenized",
    prompt: str = "",
    join_with: str = "\n\n",
    autoregressive_processor_cfg: Optional[ConfigOr[DatasetToDatasetFn]] = None,
) -> DatasetToDatasetFn:
    """Returns a processor turning (source, target) texts into decoder-only LM examples.

    Steps: `augment_text_from_inputs_targets_pretokenized` (prompt, `join_with`, newlines,
    default prefix EOS); tokenize the source into `input_ids` and the target, EOS appended,
    into `target_labels`; the autoregressive processor (default
    `make_autoregressive_inputs(DECODER_ONLY, input_data_type)` then dropping `prefix`); finally
    `input_ids` (padded with 0) and `target_labels` (padded with -1) are cut or padded to
    `max_sequence_length`. The text fields are dropped.

    Args:
        is_training: Unused (accepted so an Input can set it).
        vocab_cfg: Config of a seqio vocabulary.
        max_sequence_length: The sequence length.
        input_data_type: SEQ2SEQ_MASK (no labels on the source) or SEQ2SEQ_NO_MASK.
        replace_newlines_with: The newline replacement, or None to keep newlines.
        source_key: The source text field.
        target_key: The target text field.
        prompt: Text put before each source.
        join_with: Text put between source and target.
        autoregressive_processor_cfg: Optional replacement of the autoregressive step, e.g.
            `chain(joint_truncation_for_seq2seq_lm_input(...), make_autoregressive_inputs(...),
            remove_fields(["prefix"]))`.

    Returns:
        A DatasetToDatasetFn.
    """
    del is_training
    vocab = maybe_instantiate(vocab_cfg)
    augment = augment_text_from_inputs_targets_pretokenized(
        replace_newlines_with=replace_newlines_with,
        source_key=source_key,
        target_key=target_key,
        eos_id=vocab.eos_id,
        prompt=prompt,
        join_with=join_with,
    )
    if autoregressive_processor_cfg is None:
        autoregressive = make_autoregressive_inputs(
            model_type=ModelType.DECODER_ONLY, input_data_type=input_data_type
        )
        drop_prefix = True
    else:
        autoregressive = maybe_instantiate(autoregressive_processor_cfg)
        drop_prefix = False

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def tokenize(ex):
            out = {k: v for k, v in ex.items() if k not in (source_key, target_key)}
            out["prefix"] = tf.cast(tf.reshape(ex["prefix"], [-1]), tf.int32)
            out["input_ids"] = tf.cast(vocab.encode_tf(ex[source_key]), tf.int32)
            target = tf.cast(vocab.encode_tf(ex[target_key]), tf.int32)
            out["target_labels"] = tf.concat([target, [vocab.eos_id]], 0)
            return out

        ds = _map(augment(ds), tokenize)
        ds = autoregressive(ds)

        def finish(ex):
            ex = dict(ex)
            if drop_prefix:
                ex.pop("prefix", None)
            ex["input_ids"] = _trim_and_pad(ex["input_ids"], max_sequence_length, 0)
            ex["target_labels"] = _trim_and_pad(
                ex["target_labels"], max_sequence_length, IGNORE_LABEL
            )
            return ex

        return _map(ds, finish)

    return fn


def text2text_lm_input(
    *,
    is_training: bool,
    target_sentence_piece_vocab: InstantiableConfig,
    max_target_length: int,
    model_type: ModelType = ModelType.ENCODER_DECODER,
    source_sentence_piece_vocab: Optional[InstantiableConfig] = None,
    max_source_length: Optional[int] = None,
    source_key: str = "source",
    target_key: str = "target",
    packing_mode: Literal["pack", "pad", "none"] = "pad",
) -> DatasetToDatasetFn:
    """Returns a processor turning (source, target) texts into text-to-text model examples.

    The source is tokenized with EOS appended (encoder-decoder) or without (decoder-only); the
    target always with EOS. `prefix` (default `[EOS]`) starts the decoder.

    ENCODER_DECODER: `source` = {input_ids, input_segment_ids, positions} (the source ids, cut to
    `max_source_length`, default `max_target_length`), `target` = the same of
    `(prefix + target)[:-1]`, and `target_labels = (prefix + target)[1:]` with -1 on the prefix,
    cut to `max_target_length`.
    DECODER_ONLY: `make_autoregressive_inputs(SEQ2SEQ_MASK)` of `prefix + source + target`, with
    `input_segment_ids` and `input_positions`, cut to `max_target_length`.

    packing_mode "pad": every example padded (inputs 0, labels -1); "pack": examples packed in
    order into rows (`_trim_and_pack_with_segments`: segment ids 1, 2, ..., positions restart;
    `prefix` is dropped); "none": cut, not padded. Fields other than `source_key`/`target_key`
    are kept (not when packing).

    Args:
        is_training: Unused (accepted so an Input can set it).
        target_sentence_piece_vocab: Config of the target's seqio vocabulary.
        max_target_length: The target (decoder) length.
        model_type: ENCODER_DECODER or DECODER_ONLY.
        source_sentence_piece_vocab: The source's vocabulary; None: the target's.
        max_source_length: The source length (encoder-decoder); None: `max_target_length`.
        source_key: The source text field.
        target_key: The target text field.
        packing_mode: "pad", "pack" or "none".

    Returns:
        A DatasetToDatasetFn.

    Raises:
        ValueError: On an unknown packing_mode or a non-positive length.
    """
    del is_training
    model_type = ModelType(model_type)
    if packing_mode not in ("pack", "pad", "none"):
        raise ValueError(f"packing_mode must be 'pack', 'pad' or 'none', got {packing_mode!r}")
    if max_target_length <= 0:
        raise ValueError(f"max_target_length must be positive, got {max_target_length}")
    target_vocab = maybe_instantiate(target_sentence_piece_vocab)
    source_vocab = (
        target_vocab
        if source_sentence_piece_vocab is None
        else maybe_instantiate(source_sentence_piece_vocab)
    )
    max_source_length = max_source_length or max_target_length
    eos_id = target_vocab.eos_id

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def build(ex):
            out = {k: v for k, v in ex.items() if k not in (source_key, target_key)}
            prefix = ex.get("prefix", tf.constant([eos_id], tf.int32))
            prefix = tf.cast(tf.reshape(prefix, [-1]), tf.int32)
            out["prefix"] = prefix
            source = tf.cast(source_vocab.encode_tf(ex[source_key]), tf.int32)
            target = tf.cast(target_vocab.encode_tf(ex[target_key]), tf.int32)
            target = tf.concat([target, [eos_id]], 0)
            if model_type == ModelType.ENCODER_DECODER:
                source = tf.concat([source, [source_vocab.eos_id]], 0)[:max_source_length]
                inputs, labels = _decoder_stream(
                    prefix, tf.zeros([0], tf.int32), target, mask_source=False
                )
                out["source"] = source
                out["target"] = inputs[:max_target_length]
            else:
                inputs, labels = _decoder_stream(prefix, source, target, mask_source=True)
                out["input_ids"] = inputs[:max_target_length]
            out["target_labels"] = labels[:max_target_length]
            return out

        ds = _map(ds, build)
        if model_type == ModelType.ENCODER_DECODER:
            fields = {"source": max_source_length, "target": max_target_length}
        else:
            fields = {"input_ids": max_target_length}
        if packing_mode == "pack":
            return _pack(ds, fields, model_type)

        def pad(ex):
            ex = dict(ex)
            if packing_mode == "none":
                length = {k: tf.shape(ex[k])[0] for k in fields}
            else:
                length = fields
            for key in fields:
                ids = ex.pop(key) if key != "input_ids" else ex["input_ids"]
                n = tf.shape(ids)[0]
                size = length[key]
                live = tf.range(size) < n
                padded = tf.pad(ids, [[0, size - n]])
                segs = tf.cast(live, tf.int32)
                pos = tf.where(live, tf.range(size), 0)
                if model_type == ModelType.ENCODER_DECODER:
                    ex[key] = {"input_ids": padded, "input_segment_ids": segs, "positions": pos}
                else:
                    ex.update(input_ids=padded, input_segment_ids=segs, input_positions=pos)
            labels = ex["target_labels"]
            n = tf.shape(labels)[0]
            size = length["target" if "target" in fields else "input_ids"]
            ex["target_labels"] = tf.pad(labels, [[0, size - n]], constant_values=IGNORE_LABEL)
            return ex

        return _map(ds, pad)

    return fn


def _pack(ds: tf.data.Dataset, fields: dict[str, int], model_type: ModelType) -> tf.data.Dataset:
    """Packs built text2text examples (see text2text_lm_input) into rows."""
    target_key = "target" if model_type == ModelType.ENCODER_DECODER else "input_ids"

    def select(ex):
        out = {k: ex[k] for k in fields}
        # Labels are shifted by one so that the packer's zero padding reads as -1.
        out["labels"] = ex["target_labels"] - IGNORE_LABEL
        return out

    lengths = dict(fields, labels=fields[target_key])
    ds = _trim_and_pack_with_segments(lengths)(_map(ds, select))

    def rename(ex):
        out = {"target_labels": ex["labels"] + IGNORE_LABEL}
        for key in fields:
            if model_type == ModelType.ENCODER_DECODER:
                out[key] = {
                    "input_ids": ex[key],
                    "positions": ex[f"{key}_positions"],
                    "input_segment_ids": ex[f"{key}_segment_ids"],
                }
            else:
                out.update(
                    input_ids=ex[key],
                    input_positions=ex[f"{key}_positions"],
                    input_segment_ids=ex[f"{key}_segment_ids"],
                )
        return out

    return _map(ds, rename)


for _obj in (
    InputDataType,
    ModelType,
    PackingMethodType,
    augment_text_from_inputs_targets_pretokenized,
    joint_truncation_for_seq2seq_lm_input,
    make_autoregressive_inputs,
    lm_from_seq2seq_text_preprocessor,
    text2text_lm_input,
):
    _obj.__module__ = PUBLIC_MODULE
