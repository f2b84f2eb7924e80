"""Padding of tf.data feeds: whole evaluation batches, and logical batches inside physical ones.

Part of the `axlearn.common.input_tf_data` API (AXLearn's private helpers `_infer_cardinality`,
`_pad_for_evaluation` and `_pad_logical_to_physical`, re-exported there under those names).

A *physical* batch is what each feed (process) must hand to the devices; a *logical* batch holds
only the examples actually read. When only some feeds read data (`logical_feed_indices`), every
feed still yields physical batches: a logical feed puts its examples first and pads the rest, a
non-logical feed yields padding only. Each example carries
`utils.PHYSICAL_TO_LOGICAL_DISPATCH_KEY`, a bool row of length `global_logical_batch_size` that
is one-hot at the example's place in the global logical batch (all False on padding), from which
`utils.dispatch_input_batch` rebuilds the logical batch.

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from axlearn.common.utils import PHYSICAL_TO_LOGICAL_DISPATCH_KEY

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# A function from a (nested) element spec to a (nested) padding example
# (`input_tf_data.PadExampleFn`).
PadExampleFn = Callable[[Any], Any]


def _infer_cardinality(ds: tf.data.Dataset) -> int:
    """Returns the number of elements of `ds`, counting them when TensorFlow does not know it.

    Args:
        ds: The dataset.

    Returns:
        The count, or `tf.data.INFINITE_CARDINALITY` (-1) for an infinite dataset.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    n = int(ds.cardinality())
    if n == tf.data.UNKNOWN_CARDINALITY:
        n = int(
            ds.reduce(
                tf.constant(0, tf.int64),
                tf.autograph.experimental.do_not_convert(lambda c, _: c + 1),
            )
        )
    return n


def _pad_for_evaluation(
    ds: tf.data.Dataset, *, per_feed_batch_size: int, pad_example_fn: PadExampleFn
) -> tf.data.Dataset:
    """Appends padding examples so that the example count is a multiple of the batch size.

    Args:
        ds: A finite dataset of examples.
        per_feed_batch_size: The batch size of this feed.
        pad_example_fn: Makes one padding example from `ds.element_spec`.

    Returns:
        `ds` followed by `(-n) % per_feed_batch_size` padding examples.

    Raises:
        ValueError: If `ds` is infinite or the batch size is not positive.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if per_feed_batch_size <= 0:
        raise ValueError(f"per_feed_batch_size must be positive, got {per_feed_batch_size}")
    n = _infer_cardinality(ds)
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError(f"An evaluation input must be finite; got an infinite dataset {ds}")
    num_pad = (-n) % per_feed_batch_size
    if num_pad:
        pad = tf.data.Dataset.from_tensors(pad_example_fn(ds.element_spec)).repeat(num_pad)
        ds = ds.concatenate(pad)
    return ds


def _pad_logical_to_physical(
    ds: tf.data.Dataset,
    *,
    global_batch_size: int,
    global_logical_batch_size: int,
    num_logical_feeds: int,
    logical_feed_index: Optional[int],
    pad_example_fn: PadExampleFn,
    num_physical_feeds: Optional[int] = None,
) -> tf.data.Dataset:
    """Turns this feed's examples into the examples of its physical batches (still unbatched).

    Every `global_logical_batch_size // num_logical_feeds` examples of `ds` (an incomplete last
    group is dropped) become one physical batch of `global_batch_size // num_physical_feeds`
    examples: a logical feed's examples first, then padding; a non-logical feed
    (`logical_feed_index=None`) yields padding only, one physical batch per group of `ds`. Each
    example gets `PHYSICAL_TO_LOGICAL_DISPATCH_KEY` (see the module docstring). Batch the result
    with `.batch(global_batch_size // num_physical_feeds)`.

    Args:
        ds: This feed's examples.
        global_batch_size: The global physical batch size.
        global_logical_batch_size: The global logical batch size.
        num_logical_feeds: The number of feeds that read data.
        logical_feed_index: This feed's index among the logical feeds, or None if it reads none.
        pad_example_fn: Makes one padding example from `ds.element_spec`.
        num_physical_feeds: The number of feeds; None: `jax.process_count()`.

    Returns:
        The dataset of physical examples.

    Raises:
        ValueError: If the sizes do not divide or a logical batch exceeds the physical one.
    """
    import jax  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if num_physical_feeds is None:
        num_physical_feeds = jax.process_count()
    if global_batch_size % num_physical_feeds:
        raise ValueError(
            f"global_batch_size ({global_batch_size}) must be divisible by the number of "
            f"physical feeds ({num_physical_feeds})"
        )
    if num_logical_feeds <= 0 or global_logical_batch_size % num_logical_feeds:
        raise ValueError(
            f"global_logical_batch_size ({global_logical_batch_size}) must be divisible by "
            f"num_logical_feeds ({num_logical_feeds})"
        )
    per_feed_physical = global_batch_size // num_physical_feeds
    per_feed_logical = global_logical_batch_size // num_logical_feeds
    if logical_feed_index is not None and per_feed_logical > per_feed_physical:
        raise ValueError(
            f"A feed's logical batch ({per_feed_logical}) exceeds its physical batch "
            f"({per_feed_physical}): global_logical_batch_size={global_logical_batch_size}, "
            f"global_batch_size={global_batch_size}"
        )
    if logical_feed_index is not None and not 0 <= logical_feed_index < num_logical_feeds:
        raise ValueError(
            f"logical_feed_index ({logical_feed_index}) must be None or in [0, {num_logical_feeds})"
        )

    pad_example = pad_example_fn(ds.element_spec)

    def pad_rows(count: int):
        return tf.nest.map_structure(
            lambda x: tf.repeat(tf.expand_dims(x, 0), count, axis=0), pad_example
        )

    def dispatch_rows() -> tf.Tensor:
        rows = tf.zeros([per_feed_physical, global_logical_batch_size], dtype=tf.bool)
        if logical_feed_index is None:
            return rows
        start = logical_feed_index * per_feed_logical
        eye = tf.eye(per_feed_logical, global_logical_batch_size - start, dtype=tf.bool)
        eye = tf.pad(eye, [[0, per_feed_physical - per_feed_logical], [start, 0]])
        return eye

    def to_physical(group):
        if logical_feed_index is None:
            rows = pad_rows(per_feed_physical)
        else:
            num_pad = per_feed_physical - per_feed_logical
            padding = pad_rows(num_pad)
            rows = tf.nest.map_structure(
                lambda x, p: tf.concat([x, tf.cast(p, x.dtype)], 0), group, padding
            )
        if not isinstance(rows, dict):
            raise ValueError(
                f"_pad_logical_to_physical needs dict examples (to add "
                f"{PHYSICAL_TO_LOGICAL_DISPATCH_KEY!r}); got {ds.element_spec}"
            )
        rows = dict(rows)
        rows[PHYSICAL_TO_LOGICAL_DISPATCH_KEY] = dispatch_rows()
        return tf.data.Dataset.from_tensor_slices(rows)

    ds = ds.batch(per_feed_logical, drop_remainder=True)
    return ds.flat_map(tf.autograph.experimental.do_not_convert(to_physical))


for _fn in (_infer_cardinality, _pad_for_evaluation, _pad_logical_to_physical):
    _fn.__module__ = "axlearn.common.input_tf_data"
