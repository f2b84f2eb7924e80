"""Batching of tf.data inputs: whole global batches split over feeds, padded for evaluation.

Part of the `axlearn.common.input_tf_data` API: that module re-exports every public name here,
and each carries `__module__ = "axlearn.common.input_tf_data"`, so configs print them as
`'axlearn.common.input_tf_data.batch'` (AXLearn's name) wherever they are defined.

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from axlearn.common.config import ConfigOr, maybe_instantiate
from axlearn.common.input_feed import current_feed
from axlearn.common.input_processors import DatasetToDatasetFn

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# The module these functions belong to publicly (their dumped module name).
PUBLIC_MODULE = "axlearn.common.input_tf_data"


# A function from a (nested) element spec to a (nested) padding example.
PadExampleFn = Callable[[Any], Any]


def default_pad_example_fn(element_spec: Any) -> Any:
    """Returns a padding example: zeros (empty strings) shaped like `element_spec`.

    For language-model examples this gives input_ids 0 and target_labels 0 (the pad id: no
    target), so padded rows contribute nothing to losses.

    Args:
        element_spec: A (nested) tf.TensorSpec.

    Returns:
        The (nested) padding tensors.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.nest.map_structure(lambda s: tf.zeros(s.shape, dtype=s.dtype), element_spec)


def count_examples(ds: tf.data.Dataset) -> int:
    """Returns the number of elements of a finite dataset (counting them when unknown).

    Args:
        ds: The dataset.

    Returns:
        The count.

    Raises:
        ValueError: If the dataset is infinite.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    n = int(ds.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError(f"An evaluation input must be finite; got an infinite dataset {ds}")
    if n == tf.data.UNKNOWN_CARDINALITY:
        n = int(
            ds.reduce(
                tf.constant(0, tf.int64),
                tf.autograph.experimental.do_not_convert(lambda c, _: c + 1),
            )
        )
    return n


def batch(
    global_batch_size: int,
    *,
    is_training: bool,
    pad_example_fn: PadExampleFn,
    prefetch_buffer_size: Optional[int] = -1,
    post_batch_processor: Optional[ConfigOr[DatasetToDatasetFn]] = None,
    repeat: Optional[int] = None,
    global_logical_batch_size: Optional[int] = None,
    logical_feed_indices: Optional[Sequence[int]] = None,
    num_physical_feeds: Optional[int] = None,
    physical_feed_index: Optional[int] = None,
) -> DatasetToDatasetFn:
    """Returns a batcher producing this feed's `global_batch_size // num_feeds` examples per batch.

    Training batches drop the incomplete last batch and repeat forever (unless `repeat` is set).
    Evaluation inputs are padded with `pad_example_fn` examples to whole batches (to the same
    number of batches on every feed), so every example is evaluated exactly once.

    Args:
        global_batch_size: Examples per global batch; divisible by the number of feeds.
        is_training: Whether the input is for training (set by Input).
        pad_example_fn: Creates a padding example from the element spec.
        prefetch_buffer_size: Batches prefetched; -1 (tf.data.AUTOTUNE) or None autotune, 0
            disables prefetching.
        post_batch_processor: Optional processor applied to batches.
        repeat: Times to repeat the batches; None: forever when training, once otherwise.
        global_logical_batch_size: If set and different from `global_batch_size` (then the
            physical batch size), only the feeds in `logical_feed_indices` read examples,
            `global_logical_batch_size // len(logical_feed_indices)` per batch, padded to the
            physical batch; every example gets the dispatch tensor
            `utils.PHYSICAL_TO_LOGICAL_DISPATCH_KEY` (see `axlearn.common.input_padding`).
            Evaluation inputs are padded to whole logical batches per feed.
        logical_feed_indices: The feeds that read examples; None: the first
            `min(global_logical_batch_size, num_physical_feeds)` feeds.
        num_physical_feeds: The number of feeds; None: the current feed context's (the process
            count outside an Input).
        physical_feed_index: This feed's index; None: the current feed context's.

    Returns:
        A DatasetToDatasetFn.

    Raises:
        ValueError: If `repeat` is not a positive integer.
    """
    if repeat is not None and (not isinstance(repeat, int) or repeat <= 0):
        raise ValueError(f"batch: repeat must be a positive integer or None, got {repeat!r}")
    if global_batch_size <= 0:
        raise ValueError(f"batch: global_batch_size must be positive, got {global_batch_size}")

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ctx = current_feed()
        if global_logical_batch_size is not None and global_logical_batch_size != (
            global_batch_size
        ):
            return _finish(_logical_feed(ds, ctx))
        if num_physical_feeds is not None:
            # Set by an InputDispatcher: its physical feeds split the batch.
            ctx = dataclasses.replace(ctx, num_feeds=num_physical_feeds)
        if global_batch_size % ctx.num_feeds != 0:
            raise ValueError(
                f"batch: global_batch_size ({global_batch_size}) must be divisible by the number "
                f"of input feeds ({ctx.num_feeds}: input.num_feeds, default the process count)"
            )
        per_feed = global_batch_size // ctx.num_feeds
        if not is_training:
            num_batches = ctx.eval_num_batches
            n = ctx.eval_num_examples
            if n is None:
                n = count_examples(ds)
            if num_batches is None:
                num_batches = -(-n // per_feed)
            num_pad = num_batches * per_feed - n
            if num_pad < 0:
                raise ValueError(f"batch: {n} examples do not fit in {num_batches} batches")
            if num_pad > 0:
                pad = tf.data.Dataset.from_tensors(pad_example_fn(ds.element_spec))
                ds = ds.concatenate(pad.repeat(num_pad))
        return _finish(ds.batch(per_feed, drop_remainder=True))

    def _logical_feed(ds: tf.data.Dataset, ctx: Any) -> tf.data.Dataset:
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.input_padding import _pad_for_evaluation, _pad_logical_to_physical

        num_feeds = ctx.num_feeds if num_physical_feeds is None else num_physical_feeds
        feed_index = ctx.feed_index if physical_feed_index is None else physical_feed_index
        indices = logical_feed_indices
        if indices is None:
            indices = range(min(global_logical_batch_size, num_feeds))
        indices = list(indices)
        if not indices or global_logical_batch_size % len(indices):
            raise ValueError(
                f"batch: global_logical_batch_size ({global_logical_batch_size}) must be "
                f"divisible by the number of logical feeds ({len(indices)}: "
                f"logical_feed_indices={indices})"
            )
        if global_batch_size % num_feeds:
            raise ValueError(
                f"batch: global_batch_size ({global_batch_size}) must be divisible by the number "
                f"of physical feeds ({num_feeds})"
            )
        logical_index = indices.index(feed_index) if feed_index in indices else None
        if not is_training:
            ds = _pad_for_evaluation(
                ds,
                per_feed_batch_size=global_logical_batch_size // len(indices),
                pad_example_fn=pad_example_fn,
            )
        ds = _pad_logical_to_physical(
            ds,
            global_batch_size=global_batch_size,
            global_logical_batch_size=global_logical_batch_size,
            num_logical_feeds=len(indices),
            logical_feed_index=logical_index,
            pad_example_fn=pad_example_fn,
            num_physical_feeds=num_feeds,
        )
        return ds.batch(global_batch_size // num_feeds, drop_remainder=True)

    def _finish(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if post_batch_processor is not None:
            ds = maybe_instantiate(post_batch_processor)(ds)
        if repeat is not None:
            ds = ds.repeat(repeat)
        elif is_training:
            ds = ds.repeat()
        if prefetch_buffer_size is None or prefetch_buffer_size < 0:
            ds = ds.prefetch(tf.data.AUTOTUNE)
        elif prefetch_buffer_size > 0:
            ds = ds.prefetch(prefetch_buffer_size)
        return ds

    return fn


def per_feed_batch(
    feed_batch_size: int,
    *,
    is_training: bool,
    pad_example_fn: PadExampleFn,
    prefetch_buffer_size: Optional[int] = -1,
    post_batch_processor: Optional[ConfigOr[DatasetToDatasetFn]] = None,
    repeat: Optional[int] = None,
) -> DatasetToDatasetFn:
    """Like `batch`, but sized per feed: each feed batches `feed_batch_size` examples.

    AXLearn's per-feed batcher, used with `Input.input_dispatcher`: the Input sets
    `feed_batch_size` to the dispatcher's `global_logical_batch_size // num_feeds`.

    Args:
        feed_batch_size: Examples per batch of this feed.
        is_training: Whether the input is for training (set by Input).
        pad_example_fn: Creates a padding example from the element spec.
        prefetch_buffer_size: See `batch`.
        post_batch_processor: See `batch`.
        repeat: See `batch`.

    Returns:
        A DatasetToDatasetFn.

    Raises:
        ValueError: If feed_batch_size is not positive.
    """
    if feed_batch_size <= 0:
        raise ValueError(f"per_feed_batch: feed_batch_size must be positive, got {feed_batch_size}")

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        global_batch_size = feed_batch_size * current_feed().num_feeds
        return batch(
            global_batch_size,
            is_training=is_training,
            pad_example_fn=pad_example_fn,
            prefetch_buffer_size=prefetch_buffer_size,
            post_batch_processor=post_batch_processor,
            repeat=repeat,
        )(ds)

    return fn


for _fn in (default_pad_example_fn, count_examples, batch, per_feed_batch):
    _fn.__module__ = PUBLIC_MODULE
