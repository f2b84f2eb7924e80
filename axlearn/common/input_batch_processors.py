"""tf.data processors on batch and length axes: padding, packing, trimming, unpacking fields.

Part of the `axlearn.common.input_tf_data` API (re-exported there, with that `__module__`):

- `trim_and_pad_tensor(t, max_len, pad_id)`: a tensor (or ragged tensor) to last-axis length
  `max_len`.
- `pad_to_batch(batch_size, pad_value)` / `trim_to_batch(batch_size)`: the leading axis of every
  field padded / cut to `batch_size`.
- `pack_to_batch(batch_size, pad_value)`: consecutive elements (each with a leading axis of at
  most `batch_size`, never split) stacked into batches of exactly `batch_size` rows, the last
  rows padded. Fields may have different leading sizes per element.
- `add_static_fields(key_map)`, `unpack(key_map)`: fields set to constants / to nested values.

TensorFlow is imported when a processor runs, not on import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

from axlearn.common.input_processors import DatasetToDatasetFn, _public

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf


@_public
def trim_and_pad_tensor(
    t: Union[tf.Tensor, tf.RaggedTensor], max_len: int, pad_id: int = 0
) -> tf.Tensor:
    """Trims or right-pads (with `pad_id`) the last axis of `t` to `max_len`.

    Args:
        t: A tensor or ragged tensor (ragged rows are padded with `pad_id` first).
        max_len: The last-axis length of the result.
        pad_id: The padding value.

    Returns:
        A dense tensor with last axis `max_len`.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if isinstance(t, tf.RaggedTensor):
        t = t.to_tensor(default_value=pad_id)
    t = t[..., :max_len]
    pad = max_len - tf.shape(t)[-1]
    paddings = tf.concat([tf.zeros([tf.rank(t) - 1, 2], tf.int32), [[0, pad]]], axis=0)
    t = tf.pad(t, paddings, constant_values=tf.cast(pad_id, t.dtype))
    return tf.ensure_shape(t, t.shape[:-1].concatenate([max_len]))


@_public
def pad_to_batch(batch_size: int, pad_value: Any = 0) -> DatasetToDatasetFn:
    """Pads the leading axis of every field to `batch_size` with `pad_value`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def pad(v):
        paddings = tf.concat(
            [[[0, batch_size - tf.shape(v)[0]]], tf.zeros([tf.rank(v) - 1, 2], tf.int32)], 0
        )
        return tf.pad(v, paddings, constant_values=tf.cast(pad_value, v.dtype))

    return lambda ds: ds.map(lambda ex: tf.nest.map_structure(pad, ex))


@_public
def trim_to_batch(batch_size: int) -> DatasetToDatasetFn:
    """Keeps the first `batch_size` rows (leading axis) of every field."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return lambda ds: ds.map(lambda ex: tf.nest.map_structure(lambda v: v[:batch_size], ex))


@_public
def pack_to_batch(batch_size: int, pad_value: Any = 0) -> DatasetToDatasetFn:
    """Stacks consecutive elements along the leading axis into batches of `batch_size` rows.

    A new batch starts when some field of the next element no longer fits; the rows left over
    are `pad_value`. Elements are never split, and one with more than `batch_size` rows is an
    error (trim it first with `trim_to_batch`). Fields form a flat dict; trailing dimensions
    unknown statically must be equal across elements (checked while packing).

    Args:
        batch_size: Rows per batch.
        pad_value: Value of the padding rows.

    Returns:
        A DatasetToDatasetFn.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        spec = ds.element_spec
        if not all(s.shape[1:].is_fully_defined() for s in spec.values()):
            return _pack_to_batch_dynamic(ds, batch_size=batch_size, pad_value=pad_value)

        def empty(s):
            return tf.fill([batch_size, *s.shape[1:]], tf.cast(pad_value, s.dtype))

        init = {k: (empty(s), tf.constant(0)) for k, s in spec.items()}
        end = {k: tf.zeros([0, *s.shape[1:]], s.dtype) for k, s in spec.items()}
        tagged = ds.map(lambda ex: (ex, False)).concatenate(
            tf.data.Dataset.from_tensors((end, True))
        )

        def write(buffer, fill, x):
            rows = tf.shape(x)[0]
            indices = (fill + tf.range(rows))[:, None]
            return tf.tensor_scatter_nd_update(buffer, indices, x), fill + rows

        def scan_fn(state, inp):
            ex, is_end = inp
            checks = [
                tf.debugging.assert_less_equal(
                    tf.shape(x)[0], batch_size, message=f"pack_to_batch: {k} exceeds batch_size"
                )
                for k, x in ex.items()
            ]
            with tf.control_dependencies(checks):
                overflow = tf.reduce_any(
                    tf.stack([state[k][1] + tf.shape(x)[0] > batch_size for k, x in ex.items()])
                )
            flush = tf.logical_or(is_end, overflow)
            nonempty = tf.reduce_any(tf.stack([fill > 0 for _, fill in state.values()]))
            emitted = {k: buffer for k, (buffer, _) in state.items()}
            new_state = {}
            for k, x in ex.items():
                buffer, fill = state[k]
                buffer = tf.where(flush, empty(spec[k]), buffer)
                fill = tf.where(flush, 0, fill)
                new_state[k] = write(buffer, fill, x)
            return new_state, (emitted, tf.logical_and(flush, nonempty))

        out = tagged.scan(init, scan_fn)
        return out.filter(lambda batch, emit: emit).map(lambda batch, emit: batch)

    return fn


def _pack_to_batch_dynamic(ds: tf.data.Dataset, *, batch_size: int, pad_value: Any):
    """pack_to_batch for fields whose trailing dimensions are known only at run time.

    The buffers grow by concatenation (the scan state's shape is relaxed to unknown dimensions)
    and are padded to `batch_size` rows when emitted.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    spec = ds.element_spec

    def zeros(s):
        return tf.zeros([0] + [d if d is not None else 0 for d in s.shape.as_list()[1:]], s.dtype)

    init = {k: zeros(s) for k, s in spec.items()}
    tagged = ds.map(lambda ex: (ex, False)).concatenate(
        tf.data.Dataset.from_tensors(({k: zeros(s) for k, s in spec.items()}, True))
    )

    def scan_fn(state, inp):
        ex, is_end = inp
        checks = [
            tf.debugging.assert_less_equal(
                tf.shape(x)[0], batch_size, message=f"pack_to_batch: {k} exceeds batch_size"
            )
            for k, x in ex.items()
        ]
        with tf.control_dependencies(checks):
            overflow = tf.reduce_any(
                tf.stack(
                    [tf.shape(state[k])[0] + tf.shape(x)[0] > batch_size for k, x in ex.items()]
                )
            )
        flush = tf.logical_or(is_end, overflow)
        nonempty = tf.reduce_any(tf.stack([tf.shape(b)[0] > 0 for b in state.values()]))
        emitted, new_state = {}, {}
        for k, x in ex.items():
            buffer = state[k]
            rows = tf.shape(buffer)[0]
            paddings = tf.concat(
                [[[0, batch_size - rows]], tf.zeros([tf.rank(buffer) - 1, 2], tf.int32)], 0
            )
            emitted[k] = tf.pad(buffer, paddings, constant_values=tf.cast(pad_value, buffer.dtype))
            new_state[k] = tf.cond(
                tf.logical_or(flush, rows == 0),
                lambda x=x: x,
                lambda x=x, buffer=buffer: tf.concat([buffer, x], 0),
            )
        return new_state, (emitted, tf.logical_and(flush, nonempty))

    out = tagged.scan(init, scan_fn)
    return out.filter(lambda batch, emit: emit).map(lambda batch, emit: batch)


@_public
def add_static_fields(key_map: dict[str, Any]) -> DatasetToDatasetFn:
    """Sets fields to constant values: `{key: value}` on every example."""

    def map_fn(ex: dict) -> dict:
        return {**ex, **key_map}

    return lambda ds: ds.map(map_fn)


@_public
def unpack(key_map: dict[str, tuple[str, ...]]) -> DatasetToDatasetFn:
    """Adds fields holding nested values: `{new_key: (key1, key2, ...)}` -> ex[key1][key2]...

    Other fields are kept.

    Raises:
        KeyError: (when run) naming a path that does not exist.
    """

    def map_fn(ex: dict) -> dict:
        out = dict(ex)
        for new_key, path in key_map.items():
            value = ex
            for i, step in enumerate(path):
                if not isinstance(value, dict) or step not in value:
                    raise KeyError(f"unpack: no {tuple(path[: i + 1])} in the example")
                value = value[step]
            out[new_key] = value
        return out

    return lambda ds: ds.map(map_fn)
