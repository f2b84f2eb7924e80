"""Trim-and-pack of variable-length features into fixed-length rows with segment ids.

Part of the `axlearn.common.input_lm` API (AXLearn's `_trim_and_pack_with_segments`, re-exported
there). Examples are trimmed to each feature's length and packed in order (next fit): an
example that does not fit in the current row (in any feature) closes the row, which is padded
with zeros. Every feature `k` of a row comes with `k_positions` (0-based position inside its
example) and `k_segment_ids` (1, 2, ... per example of the row, 0 on padding); an example keeps
its segment number in every feature, even where it has no tokens.

TensorFlow is imported lazily: importing this module does not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

    from axlearn.common.input_processors import DatasetToDatasetFn

_SENTINEL = "__trim_and_pack_sentinel"


def _trim_and_pack_with_segments(feature_lengths: dict[str, int]) -> DatasetToDatasetFn:
    """Returns a processor packing the rank-1 features `feature_lengths` into fixed-length rows.

    Args:
        feature_lengths: Maps each packed feature to its row length. Other features are dropped.

    Returns:
        A DatasetToDatasetFn emitting, per feature `k`, `k` [L_k], `k_positions` [L_k] and
        `k_segment_ids` [L_k] (int32).

    Raises:
        ValueError: If a length is not positive, or a feature is missing or not rank 1.
    """
    bad = {k: v for k, v in feature_lengths.items() if not isinstance(v, int) or v <= 0}
    if bad:
        raise ValueError(f"_trim_and_pack_with_segments: lengths must be positive ints: {bad}")
    keys = list(feature_lengths)

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        spec = ds.element_spec
        for key in keys:
            if key not in spec or spec[key].shape.rank != 1:
                raise ValueError(
                    f"_trim_and_pack_with_segments: feature {key!r} must be a rank-1 tensor; "
                    f"the examples have {spec}"
                )
        dtypes = {k: spec[k].dtype for k in keys}

        def prepare(ex):
            out = {_SENTINEL: tf.constant(False)}
            for k in keys:
                size = feature_lengths[k]
                x = ex[k][:size]
                n = tf.shape(x)[0]
                out[k] = tf.pad(x, [[0, size - n]])
                out[f"{k}/len"] = n
            return out

        ds = ds.map(tf.autograph.experimental.do_not_convert(prepare))
        sentinel = {_SENTINEL: tf.constant(True)}
        for k in keys:
            sentinel[k] = tf.zeros([feature_lengths[k]], dtypes[k])
            sentinel[f"{k}/len"] = tf.constant(0, tf.int32)
        ds = ds.concatenate(tf.data.Dataset.from_tensors(sentinel))

        init = {"num_segments": tf.constant(0, tf.int32)}
        for k in keys:
            size = feature_lengths[k]
            init[k] = tf.zeros([size], dtypes[k])
            init[f"{k}_positions"] = tf.zeros([size], tf.int32)
            init[f"{k}_segment_ids"] = tf.zeros([size], tf.int32)
            init[f"{k}/fill"] = tf.constant(0, tf.int32)

        def step(state, ex):
            fits = tf.constant(True)
            for k in keys:
                fits &= state[f"{k}/fill"] + ex[f"{k}/len"] <= feature_lengths[k]
            flush = ex[_SENTINEL] | tf.logical_not(fits)
            out = {"valid": flush & (state["num_segments"] > 0)}
            seg = tf.where(flush, 1, state["num_segments"] + 1)
            new_state = {"num_segments": seg}
            for k in keys:
                size = feature_lengths[k]
                idx = tf.range(size)
                out[k] = state[k]
                out[f"{k}_positions"] = state[f"{k}_positions"]
                out[f"{k}_segment_ids"] = state[f"{k}_segment_ids"]
                start = tf.where(flush, 0, state[f"{k}/fill"])
                length = ex[f"{k}/len"]
                keep = tf.logical_not(flush) & (idx < start)
                place = (idx >= start) & (idx < start + length)
                zeros = tf.zeros([size], dtypes[k])
                base = tf.where(keep, state[k], zeros)
                new_state[k] = tf.where(place, tf.roll(ex[k], start, 0), base)
                new_state[f"{k}_positions"] = tf.where(
                    place, idx - start, tf.where(keep, state[f"{k}_positions"], 0)
                )
                new_state[f"{k}_segment_ids"] = tf.where(
                    place, seg, tf.where(keep, state[f"{k}_segment_ids"], 0)
                )
                new_state[f"{k}/fill"] = start + length
            return new_state, out

        ds = ds.scan(init, tf.autograph.experimental.do_not_convert(step))
        ds = ds.filter(tf.autograph.experimental.do_not_convert(lambda ex: ex["valid"]))

        def finish(ex):
            ex = dict(ex)
            del ex["valid"]
            return ex

        return ds.map(tf.autograph.experimental.do_not_convert(finish))

    return fn


_trim_and_pack_with_segments.__module__ = "axlearn.common.input_lm"
