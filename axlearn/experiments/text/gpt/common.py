"""Input building blocks of GPT trainer configs (model builders live in `model_builders.py`)."""

from __future__ import annotations

from typing import Optional

from axlearn.common import input_lm, input_tf_data
from axlearn.common.config import InstantiableConfig, config_for_function
from axlearn.experiments.text.common import tfds_text_source

# Newlines are replaced with this piece for sentencepiece BPE vocabularies.
REPLACE_NEWLINES_WITH = "<n>"


def tfds_input(
    *,
    is_training: bool,
    dataset_name: str,
    split: str,
    vocab_cfg: InstantiableConfig,
    max_sequence_length: int,
    train_shuffle_buffer_size: int = 1024 * 16,
    replace_newlines_with: str = "\n",
    packing: Optional[bool] = None,
    data_dir: Optional[str] = None,
) -> input_tf_data.BuildDatasetFn:
    """Returns a source of language-model examples from a TFDS text data set.

    Training: documents are shuffled, repeated, tokenized and concatenated-and-split into
    `max_sequence_length` pieces (or packed with segment ids when `packing`), then shuffled.
    Evaluation: each document is read once in strided windows (stride `max_sequence_length // 4`),
    every token scored once (see `input_lm.text_to_lm_eval_input`).

    Args:
        is_training: Whether the input is for training.
        dataset_name: The TFDS name, e.g. "python_docs:1.0.0" (the embedded data).
        split: The split, e.g. "train" or "test[:5000]".
        vocab_cfg: Config of a seqio vocabulary (e.g. `axlearn.experiments.text.common.vocab`).
        max_sequence_length: Tokens per example.
        train_shuffle_buffer_size: Document shuffle buffer when training.
        replace_newlines_with: Newlines become this piece before tokenizing ("<n>" for the
            sentencepiece BPE vocabularies).
        packing: Training only: pack documents with `input_segment_ids`/`input_positions` instead
            of concatenating them. None means False.
        data_dir: The TFDS data dir; None: see `input_tf_data.tfds_dataset`.

    Returns:
        A BuildDatasetFn.
    """
    source = config_for_function(tfds_text_source).set(
        dataset_name=dataset_name,
        split=split,
        train_shuffle_buffer_size=train_shuffle_buffer_size,
        data_dir=data_dir,
    )
    if is_training:
        processor = config_for_function(input_lm.text_to_lm_training_input).set(
            vocab_cfg=vocab_cfg,
            max_len=max_sequence_length,
            replace_newlines_with=replace_newlines_with,
            packing=bool(packing),
        )
    else:
        processor = config_for_function(input_lm.text_to_lm_eval_input).set(
            vocab_cfg=vocab_cfg,
            max_len=max_sequence_length,
            replace_newlines_with=replace_newlines_with,
            stride=max(1, max_sequence_length // 4),
        )
    return input_tf_data.with_processor(source=source, processor=processor, is_training=is_training)
