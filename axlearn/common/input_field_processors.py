"""tf.data processors that reshape or select example fields.

Part of the `axlearn.common.input_tf_data` API (re-exported there; each function's public module
is `axlearn.common.input_tf_data`): `squeeze_fields`, `ragged_to_tensor`,
`extract_from_sequence` and `preserve_element_spec`.

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn


def _map(ds: tf.data.Dataset, fn) -> tf.data.Dataset:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return ds.map(tf.autograph.experimental.do_not_convert(fn), num_parallel_calls=tf.data.AUTOTUNE)


def squeeze_fields(axis: dict[str, Optional[Union[int, Sequence[int]]]]) -> DatasetToDatasetFn:
    """Returns a processor squeezing size-1 dimensions of the given fields.

    Args:
        axis: Maps a field to the dimension(s) to squeeze: an int, a list of ints, or None for
            every size-1 dimension. Other fields are unchanged.

    Returns:
        A DatasetToDatasetFn.
    """

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        missing = [k for k in axis if k not in ds.element_spec]
        if missing:
            raise KeyError(
                f"squeeze_fields: fields {missing} are not in the examples "
                f"(fields: {sorted(ds.element_spec)})"
            )

        def squeeze(ex):
            ex = dict(ex)
            for key, dims in axis.items():
                ex[key] = tf.squeeze(ex[key], axis=dims)
            return ex

        return _map(ds, squeeze)

    return fn


def ragged_to_tensor(
    feature_shapes: dict[str, Sequence[Optional[int]]], default_value: Any = 0
) -> DatasetToDatasetFn:
    """Returns a processor converting ragged fields to dense tensors of the given shapes.

    Each ragged field in `feature_shapes` becomes `x.to_tensor(default_value, shape=shape)`:
    padded with `default_value` (or truncated) to every known dimension of `shape`. Fields that
    are already dense are left as they are.

    Args:
        feature_shapes: Maps a field to its dense shape (None: that dimension as it is).
        default_value: The padding value.

    Returns:
        A DatasetToDatasetFn.
    """

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def convert(ex):
            ex = dict(ex)
            for key, shape in feature_shapes.items():
                value = ex.get(key)
                if isinstance(value, tf.RaggedTensor):
                    ex[key] = value.to_tensor(
                        default_value=tf.cast(default_value, value.dtype), shape=list(shape)
                    )
            return ex

        return _map(ds, convert)

    return fn


def extract_from_sequence(in_key: str, out_key: str, idx: Union[int, slice]) -> DatasetToDatasetFn:
    """Returns a processor setting `ex[out_key] = ex[in_key][idx]` (an element or a slice).

    Args:
        in_key: The sequence field.
        out_key: The field written (may equal `in_key`).
        idx: An index or a slice along the first dimension.

    Returns:
        A DatasetToDatasetFn.
    """
    if not isinstance(idx, (int, slice)):
        raise TypeError(f"extract_from_sequence: idx must be an int or a slice, got {idx!r}")

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        def extract(ex):
            ex = dict(ex)
            ex[out_key] = ex[in_key][idx]
            return ex

        return _map(ds, extract)

    return fn


def preserve_element_spec(
    fn: DatasetToDatasetFn, key_map: Optional[dict[str, str]] = None
) -> DatasetToDatasetFn:
    """Wraps a processor so that its output keeps the static shapes of its input's fields.

    Mapping through `tf.py_function` loses static shapes; this restores them: every output field
    that is also an input field gets the input field's shape (checked at run time), and an output
    field `k` in `key_map` gets the shape of input field `key_map[k]`.

    Args:
        fn: The processor to wrap.
        key_map: Maps output fields to the input field whose shape they take.

    Returns:
        A DatasetToDatasetFn.
    """
    key_map = dict(key_map or {})

    def wrapped(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        in_spec = ds.element_spec
        out = fn(ds)

        def restore(ex):
            ex = dict(ex)
            for key, value in ex.items():
                source = key_map.get(key, key)
                spec = in_spec.get(source) if isinstance(in_spec, dict) else None
                if isinstance(spec, tf.TensorSpec) and isinstance(value, tf.Tensor):
                    ex[key] = tf.ensure_shape(value, spec.shape)
            return ex

        return _map(out, restore)

    return wrapped


for _fn in (squeeze_fields, ragged_to_tensor, extract_from_sequence, preserve_element_spec):
    _fn.__module__ = "axlearn.common.input_tf_data"
