"""Fake tf.data sources for tests and examples: in-memory examples, texts and JSON records.

Part of `axlearn.common.input_fake` (which re-exports every name here, AXLearn's module for
them). Each function returns a `BuildDatasetFn` (`() -> tf.data.Dataset`), so it can be the
`source` of an `input_tf_data.Input` through `config_for_function`.

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# The module these functions belong to publicly (their dumped module name).
PUBLIC_MODULE = "axlearn.common.input_fake"


def _relax(value: Any, spec: Any) -> Any:
    """Gives `value` (a tensor inside a tf.data function) the looser static shape of `spec`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if isinstance(spec, tf.TensorSpec):
        value = tf.cast(value, spec.dtype) if value.dtype != spec.dtype else value
        return tf.compat.v1.placeholder_with_default(value, shape=spec.shape)
    return value


def _empty_as(value: Any, spec: Any) -> Any:
    """An empty `value` (e.g. `tf.constant([])`, float32) becomes an empty tensor of spec's dtype.

    Other values are returned unchanged (cast later, in `_relax`).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if isinstance(spec, dict) and isinstance(value, dict):
        return {k: _empty_as(v, spec[k]) if k in spec else v for k, v in value.items()}
    if isinstance(spec, tf.TensorSpec):
        tensor = tf.convert_to_tensor(value)
        if tensor.dtype != spec.dtype and tensor.shape.num_elements() == 0:
            default = "" if spec.dtype == tf.string else 0
            return tf.fill(tf.shape(tensor), tf.constant(default, spec.dtype))
    return value


def _examples_dataset(examples: Sequence[Any], spec: Optional[Any]) -> tf.data.Dataset:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if not examples:
        raise ValueError("fake_source: examples must not be empty")
    datasets = []
    for example in examples:
        if spec is not None:
            example = _empty_as(example, spec)
        ds = tf.data.Dataset.from_tensors(example)
        if spec is not None:
            relax = tf.autograph.experimental.do_not_convert(
                lambda ex: tf.nest.map_structure(_relax, ex, spec)
            )
            ds = ds.map(relax)
        datasets.append(ds)
    ds = datasets[0]
    for i, other in enumerate(datasets[1:], start=1):
        # Concatenation relaxes differing shapes to their common (partially known) shape.
        try:
            ds = ds.concatenate(other)
        except TypeError as e:
            raise ValueError(
                f"fake_source: example {i} ({other.element_spec}) does not match the examples "
                f"before it ({ds.element_spec}): give every example the same fields and dtypes"
            ) from e
    return ds


def fake_source(
    is_training: bool,
    examples: Sequence[Any],
    *,
    repeat: int = 1,
    spec: Optional[Any] = None,
    shuffle_buffer_size: Optional[int] = None,
    seed: Optional[int] = None,
) -> Callable[[], tf.data.Dataset]:
    """Returns a BuildDatasetFn yielding the given in-memory examples.

    Examples may differ in shape (even ragged tensors do); the dataset's element spec is their
    common spec, or `spec` where given (e.g. `tf.TensorSpec([None, 3], tf.int32)` for examples of
    varying length). Evaluation sources yield the examples once, in order; training sources
    repeat them forever, shuffled with `shuffle_buffer_size` when it is positive.

    Args:
        is_training: Whether the source is for training (repeats, optionally shuffles).
        examples: The examples (nested dicts of tensors, arrays, numbers or strings).
        repeat: How many times the examples are yielded per pass (>= 1); training sources then
            repeat that forever.
        spec: Optional (nested) tf.TensorSpec giving the examples' dtypes and static shapes.
        shuffle_buffer_size: Shuffle buffer when training; None or 0: no shuffling.
        seed: Shuffle seed.

    Returns:
        A BuildDatasetFn.

    Raises:
        ValueError: If `examples` is empty.
    """
    if not examples:
        raise ValueError("fake_source: examples must not be empty")
    if repeat < 1:
        raise ValueError(f"fake_source: repeat must be >= 1, got {repeat}")
    examples = list(examples)

    def fn() -> tf.data.Dataset:
        ds = _examples_dataset(examples, spec)
        if repeat > 1:
            ds = ds.repeat(repeat)
        if is_training:
            if shuffle_buffer_size:
                ds = ds.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
            ds = ds.repeat()
        return ds

    return fn


def fake_text_source(
    *,
    is_training: bool,
    text_field_name: str = "text",
    batch_size: int = 2,
    shuffle_buffer_size: Optional[int] = None,
) -> Callable[[], tf.data.Dataset]:
    """Returns a BuildDatasetFn of short texts: `{text_field_name: "<train|eval> text <i>"}`.

    Evaluation sources hold `batch_size` texts ("eval text 0", "eval text 1", ...) yielded once;
    training sources hold `10 * batch_size` texts ("train text 0", ...) repeated forever.

    Args:
        is_training: Whether the source is for training.
        text_field_name: The field holding the text.
        batch_size: Evaluation texts (training: ten times as many).
        shuffle_buffer_size: Shuffle buffer when training; None or 0: no shuffling.

    Returns:
        A BuildDatasetFn.
    """
    if batch_size <= 0:
        raise ValueError(f"fake_text_source: batch_size must be positive, got {batch_size}")
    kind = "train" if is_training else "eval"
    count = batch_size * (10 if is_training else 1)
    return fake_source(
        is_training=is_training,
        examples=[{text_field_name: f"{kind} text {i}"} for i in range(count)],
        shuffle_buffer_size=shuffle_buffer_size,
    )


def fake_serialized_json_source(
    examples: Sequence[dict[str, Any]],
) -> Callable[[], tf.data.Dataset]:
    """Returns a BuildDatasetFn yielding each example as a JSON string (a scalar tf.string).

    The examples may have different fields; parse them with `json.loads` (e.g. in a
    `tf.py_function`). The source takes no `is_training`, so it is yielded once.

    Args:
        examples: JSON-serializable dicts.

    Returns:
        A BuildDatasetFn.
    """
    texts = [json.dumps(example) for example in examples]

    def fn() -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return tf.data.Dataset.from_tensor_slices(tf.constant(texts, dtype=tf.string))

    return fn


for _fn in (fake_source, fake_text_source, fake_serialized_json_source):
    _fn.__module__ = PUBLIC_MODULE
