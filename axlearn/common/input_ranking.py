"""tf.data processors for ranking tasks: `rank_by_value`.

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn


def rank_by_value(
    *, input_key: str, output_key: str, ascending: bool, allow_ties: bool
) -> DatasetToDatasetFn:
    """Writes the 1-based rank of each element of a 1D field into another field.

    Without ties, equal values are ranked in their order of appearance (a stable sort): the ranks
    of [2, 2, 4] are [1, 2, 3]. With ties, equal values share the best rank among them and the
    next distinct value skips the shared places ("competition" ranking): [2, 2, 4] -> [1, 1, 3].

    Args:
        input_key: The rank-1 numeric field to rank.
        output_key: The field the int32 ranks are written to.
        ascending: True: the smallest value gets rank 1; False: the largest.
        allow_ties: Whether equal values share a rank (see above).

    Returns:
        A DatasetToDatasetFn.

    Raises:
        NotImplementedError: (when the dataset is mapped) if the field is not rank 1.
    """

    def example_fn(example: dict) -> dict:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        values = example[input_key]
        if values.shape.rank != 1:
            raise NotImplementedError(
                f"rank_by_value: Only implemented for rank-1 tensors. Got "
                f"rank-{values.shape.rank}. (field {input_key!r})"
            )
        keys = values if ascending else -values
        order = tf.argsort(keys, stable=True)
        position = tf.math.invert_permutation(order)  # 0-based stable rank of each element.
        if allow_ties:
            sorted_keys = tf.gather(keys, order)
            # For each sorted position, the first position holding the same value.
            is_new = tf.concat([[True], sorted_keys[1:] != sorted_keys[:-1]], axis=0)
            is_new = is_new[: tf.size(keys)]
            run = tf.cumsum(tf.cast(is_new, tf.int32)) - 1  # Which run of equal values.
            idx = tf.range(tf.size(keys))
            # The first sorted position of each run: the shared (best) 0-based rank.
            first_of_run = tf.gather(tf.math.segment_min(idx, run), run)
            position = tf.gather(first_of_run, position)
        example[output_key] = tf.cast(position, tf.int32) + 1
        return example

    def process(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        return ds.map(example_fn, num_parallel_calls=tf.data.AUTOTUNE)

    return process
