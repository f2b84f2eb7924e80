"""GLUE and SuperGLUE inputs, for encoder classifiers (RoBERTa style) and text-to-text (T5 style).

Encoder classifiers: `text_to_glue_input` tokenizes the task's text field(s), truncates them
together (`multi_sequence_truncation`), joins them with special tokens
(`add_special_tokens_for_roberta`: `<s> a </s></s> b </s>`), and pads to `max_len`; the label
becomes `target_labels`. Multiple-choice tasks: `preprocess_copa`/`postprocess_copa`; ReCoRD:
`preprocess_record`.

Text-to-text: `add_prefix_concat_sequence_pair` writes each example as
`"<task> <field1>: <text1> <field2>: <text2>"` with the label's name as target (T5's GLUE
format, including WSC and ReCoRD), and `make_glue_autoregressive_inputs` turns tokenized pairs
into encoder/decoder ids.

TensorFlow and seqio are imported lazily: importing this module does not import them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional, Union

from axlearn.common.config import InstantiableConfig
from axlearn.common.input_processors import rekey
from axlearn.common.input_text import infer_bos_id, tokenize

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn

# The label of decoder positions not trained on (AXLearn's input_lm.SEQ2SEQ_IGNORE_TARGET_LABEL).
_IGNORE_TARGET_LABEL = -1


def _as_keys(input_key: Union[str, Sequence[str]]) -> list[str]:
    return [input_key] if isinstance(input_key, str) else list(input_key)


def _map(fn):
    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)

    return process


def preprocess_copa() -> DatasetToDatasetFn:
    """Turns each COPA example into a pair of (premise + question, choice) examples.

    The premise gets "What's the CAUSE for this?" or "What happened as a RESULT?" appended
    (by `question`); both rows keep the label. Each output element holds the 2 rows (fields of
    shape [2]): unbatch, process, then regroup with `postprocess_copa`.

    Returns:
        A DatasetToDatasetFn to `{"premise", "choice", "label"}` of shape [2].
    """

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        question = tf.where(
            tf.equal(example["question"], "cause"),
            "What's the CAUSE for this?",
            "What happened as a RESULT?",
        )
        premise = tf.strings.join([example["premise"], question], separator=" ")
        return {
            "premise": tf.stack([premise, premise]),
            "choice": tf.stack([example["choice1"], example["choice2"]]),
            "label": tf.stack([example["label"], example["label"]]),
        }

    return _map(example_fn)


def postprocess_copa() -> DatasetToDatasetFn:
    """Regroups consecutive pairs of processed COPA rows into one example.

    Returns:
        A DatasetToDatasetFn from `{"input_ids": [max_len], "target_labels": []}` rows to
        `{"input_ids": [2, max_len], "target_labels": []}` (the two rows' labels must match).
    """

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def regroup(example):
            labels = example["target_labels"]
            check = tf.debugging.assert_equal(
                labels, labels[0], message="Batch has invalid targets."
            )
            with tf.control_dependencies([check]):
                label = tf.identity(labels[0])
            return {"input_ids": example["input_ids"], "target_labels": label}

        return ds.batch(2).map(regroup, num_parallel_calls=tf.data.AUTOTUNE)

    return process


def add_special_tokens_for_roberta(
    vocab_cfg: InstantiableConfig,
    input_key: Union[str, Sequence[str]],
    output_key: str = "input_ids",
    bos_token: Optional[str] = None,
) -> DatasetToDatasetFn:
    """Joins token sequences as RoBERTa does: `<s> a </s>`, `<s> a </s></s> b </s>`, ...

    Args:
        vocab_cfg: Config of the seqio vocabulary (BOS/EOS ids).
        input_key: The token field(s), in order.
        output_key: The field the joined ids are written to (other fields are kept).
        bos_token: The BOS piece; None: `infer_bos_id` (EOS when there is no BOS).

    Returns:
        A DatasetToDatasetFn.
    """
    vocab = vocab_cfg.instantiate()
    bos_id = vocab.tokenizer.piece_to_id(bos_token) if bos_token else infer_bos_id(vocab)
    eos_id = vocab.eos_id
    keys = _as_keys(input_key)

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        dtype = example[keys[0]].dtype
        bos, eos = tf.constant([bos_id], dtype), tf.constant([eos_id], dtype)
        parts = [bos, example[keys[0]], eos]
        for key in keys[1:]:
            parts += [eos, example[key], eos]
        example[output_key] = tf.concat(parts, axis=0)
        return example

    return _map(example_fn)


def preprocess_record() -> DatasetToDatasetFn:
    """Splits each ReCoRD example into one example per candidate entity.

    Each output has the passage, the query, one `entity` and `label` 1 if the entity is among
    the answers, else 0 (int64). Outputs of one input form one element (leading dim = number of
    entities; unbatch downstream).

    Returns:
        A DatasetToDatasetFn to `{"passage", "query", "entity", "label"}`.
    """

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        entities = example["entities"]
        rows = tf.maximum(tf.size(entities), 1)

        def repeat(x):
            return tf.broadcast_to(x, tf.concat([[rows], tf.shape(x)], axis=0))

        is_answer = tf.reduce_any(tf.equal(entities[:, None], example["answers"][None, :]), axis=1)
        return {
            "passage": repeat(example["passage"]),
            "query": repeat(example["query"]),
            "entity": entities,
            "label": tf.cast(is_answer, tf.int64),
        }

    return _map(example_fn)


def multi_sequence_truncation(
    max_len: int, input_key: Union[str, Sequence[str]]
) -> DatasetToDatasetFn:
    """Truncates several token sequences (from the right) so that together they fit `max_len`.

    Each of the k sequences gets a budget of `max_len // k`; what short sequences leave unused
    is shared evenly among the longer ones, the remainder one token each to the longest.

    Args:
        max_len: The total token budget.
        input_key: The token field(s).

    Returns:
        A DatasetToDatasetFn; other fields are unchanged.
    """
    keys = _as_keys(input_key)
    if not keys:
        raise ValueError("multi_sequence_truncation: input_key must name at least one field")
    base = max_len // len(keys)

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        sizes = tf.stack([tf.size(example[k]) for k in keys])
        budgets = tf.fill(tf.shape(sizes), base)
        used = tf.reduce_sum(tf.minimum(budgets, sizes))
        is_long = tf.cast(sizes > budgets, tf.int32)
        num_long = tf.maximum(1, tf.reduce_sum(is_long))
        spare = max_len - used
        budgets += is_long * (spare // num_long)
        # The remainder: one more token to each of the longest sequences.
        longest = tf.argsort(sizes, direction="DESCENDING", stable=True)[: spare % num_long]
        budgets = tf.tensor_scatter_nd_add(budgets, longest[:, None], tf.ones_like(longest))
        lengths = tf.minimum(budgets, sizes)
        for i, key in enumerate(keys):
            example[key] = example[key][: lengths[i]]
        return example

    return _map(example_fn)


def _join_fields(example, *, dataset_name: str, keys: list[str]):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    parts = [dataset_name]
    for key in sorted(keys):
        parts += [f"{key}:", example[key]]
    return tf.strings.join(parts, separator=" ")


def _label_name(label, names: Sequence[str]):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    # Test sets have no labels (-1): "<unk>".
    return tf.cond(
        tf.equal(label, -1),
        lambda: tf.constant("<unk>"),
        lambda: tf.gather(tf.constant(list(names)), tf.cast(label, tf.int32)),
    )


def _mark_span(text, span_text, span_index, mark: str):
    """Puts `mark` around the word(s) `span_text` that start at word `span_index` of `text`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    pattern = tf.strings.join(
        ["^((?:\\S+\\s){", tf.strings.as_string(span_index), "})(", span_text, ")"]
    )
    return tf.strings.regex_replace(text, pattern, f"\\1{mark} \\2 {mark}")


def add_prefix_concat_sequence_pair(
    *,
    dataset_name: str,
    label_names: Sequence[str],
    input_key: Union[str, tuple[str, str]],
    source_key: str = "source_text",
    target_key: str = "target_text",
) -> DatasetToDatasetFn:
    """Writes GLUE/SuperGLUE examples as T5's text-to-text pairs.

    Source: `"<dataset_name> <key>: <text> ..."` over the input keys in sorted order. Target: the
    label's name (`label_names[label]`, "<unk>" for label -1); for "stsb" the score rounded to
    0.2 as text ("1.8"). "wsc" marks the noun with `*` and the pronoun with `#` in the text
    (source `"wsc text: ..."`, target "True"/"False"); "record" writes
    `"record query: ... entities: a, b passage: ..."` with one example per answer.

    Args:
        dataset_name: The (Super)GLUE task name.
        label_names: Names of the classes (["none"] for regression).
        input_key: The text field(s).
        source_key: The source text field written.
        target_key: The target text field written.

    Returns:
        A DatasetToDatasetFn to `{source_key, target_key, "idx", "prefix"}` examples.
    """
    keys = _as_keys(input_key)

    def glue_fn(example):
        return {
            source_key: _join_fields(example, dataset_name=dataset_name, keys=keys),
            target_key: _label_name(example["label"], label_names),
            "idx": example["idx"],
            "prefix": example["prefix"],
        }

    def stsb_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        score = tf.round(example["label"] * 5) / 5
        return {
            source_key: _join_fields(example, dataset_name=dataset_name, keys=keys),
            target_key: tf.strings.as_string(score, precision=1),
            "idx": example["idx"],
            "prefix": example["prefix"],
        }

    def wsc_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        text = _mark_span(example["text"], example["span1_text"], example["span1_index"], "*")
        # The noun's marks add two words before the pronoun when the noun comes first.
        shift = 2 * tf.cast(example["span1_index"] < example["span2_index"], tf.int32)
        text = _mark_span(text, example["span2_text"], example["span2_index"] + shift, "#")
        return {
            source_key: tf.strings.join(["wsc", "text:", text], separator=" "),
            target_key: _label_name(example["label"], ["False", "True"]),
            "idx": example["idx"],
            "prefix": example["prefix"],
        }

    def record_fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def per_answer(example):
            answers = example["answers"]
            rows = tf.maximum(tf.size(answers), 1)

            def repeat(x):
                return tf.broadcast_to(x, tf.concat([[rows], tf.shape(x)], axis=0))

            out = {k: repeat(v) for k, v in example.items() if k != "idx"}
            out["targets"] = tf.cond(
                tf.size(answers) > 0, lambda: answers, lambda: tf.constant(["<unk>"])
            )
            out["idx"] = {k: repeat(example["idx"][k]) for k in ("passage", "query")}
            return out

        def to_text(example):
            passage = tf.strings.regex_replace(
                example["passage"], r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 "
            )
            passage = tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")
            source = tf.strings.join(
                [
                    "record query:",
                    example["query"],
                    "entities:",
                    tf.strings.reduce_join(example["entities"], separator=", "),
                    "passage:",
                    passage,
                ],
                separator=" ",
            )
            return {
                source_key: source,
                target_key: example["targets"],
                "idx": example["idx"],
                "prefix": example["prefix"],
            }

        return ds.map(per_answer).unbatch().map(to_text)

    if dataset_name == "stsb":
        return _map(stsb_fn)
    if dataset_name == "wsc":
        return _map(wsc_fn)
    if dataset_name == "record":
        return record_fn
    return _map(glue_fn)


def text_to_glue_input(
    *,
    is_training: bool,
    input_key: Union[str, Sequence[str]],
    max_len: int,
    vocab_cfg: InstantiableConfig,
    truncation: InstantiableConfig,
    concatenation: InstantiableConfig,
    normalization: Optional[InstantiableConfig] = None,
) -> DatasetToDatasetFn:
    """GLUE input for encoder classifiers: normalize, tokenize, truncate, join, pad.

    The caller sets `truncation.max_len` (it depends on how many special tokens
    `concatenation` adds); `input_key` is set here on normalization (when it has the field),
    truncation and concatenation.

    Args:
        is_training: Unused (kept for the processor signature).
        input_key: The text field(s).
        max_len: Tokens per example after padding.
        vocab_cfg: Config of the seqio vocabulary.
        truncation: Config of a multi-sequence truncation (e.g. `multi_sequence_truncation`).
        concatenation: Config of the join (e.g. `add_special_tokens_for_roberta`).
        normalization: Optional config of a text normalization applied before tokenizing.

    Returns:
        A DatasetToDatasetFn to `{"input_ids": [max_len], "target_labels": []}` examples.

    Raises:
        ValueError: If `input_key` names no field.
    """
    import seqio  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from axlearn.common.input_tf_data import chain  # pylint: disable=import-outside-toplevel

    del is_training
    keys = _as_keys(input_key)
    if not keys:
        raise ValueError("text_to_glue_input: Expected at least one input_key")
    vocab = vocab_cfg.instantiate()
    processors = []
    if normalization is not None:
        if hasattr(normalization, "input_key"):
            normalization.set(input_key=keys)
        processors.append(normalization)

    def pad(ds: tf.data.Dataset) -> tf.data.Dataset:
        return seqio.trim_and_pad_dataset(ds, feature_lengths={"input_ids": max_len})

    processors += [
        tokenize(
            output_features={k: seqio.Feature(vocab, add_eos=False, dtype=tf.int32) for k in keys},
            copy_pretokenized=False,
        ),
        truncation.set(input_key=keys),
        concatenation.set(vocab_cfg=vocab_cfg, input_key=keys, output_key="input_ids"),
        rekey({"target_labels": "label", "input_ids": "input_ids"}),
        pad,
    ]
    return chain(*processors)


def make_glue_autoregressive_inputs(
    *, vocab_cfg: InstantiableConfig, max_source_length: int, max_target_length: int
) -> DatasetToDatasetFn:
    """Encoder/decoder ids from tokenized text-to-text GLUE pairs (T5 style).

    Input `source_ids` and `target_labels` end with EOS (which is dropped and re-added after
    trimming, so outputs always end with EOS). `target_ids` = prefix + targets (trimmed to
    `max_target_length`); `target_labels` gets -1 under all prefix tokens but the last.

    Args:
        vocab_cfg: Config of the seqio vocabulary (EOS id).
        max_source_length: Longest `source_ids`.
        max_target_length: Longest `target_ids`/`target_labels`.

    Returns:
        A DatasetToDatasetFn to `{"idx", "prefix", "source_ids", "target_ids", "target_labels"}`.
    """
    vocab = vocab_cfg.instantiate()

    def example_fn(example):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        prefix = example["prefix"]
        source = example["source_ids"][:-1]
        labels = example["target_labels"][:-1]
        eos = tf.constant([vocab.eos_id], source.dtype)
        source = tf.concat([source[: max_source_length - 1], eos], axis=0)
        target_ids = tf.concat([prefix, labels], axis=0)[:max_target_length]
        ignored = tf.fill([tf.size(prefix) - 1], tf.constant(_IGNORE_TARGET_LABEL, labels.dtype))
        labels = tf.concat([ignored, labels], axis=0)
        labels = tf.concat([labels[: max_target_length - 1], eos], axis=0)
        return {
            "idx": example["idx"],
            "prefix": prefix,
            "source_ids": source,
            "target_ids": target_ids,
            "target_labels": labels,
        }

    return _map(example_fn)
