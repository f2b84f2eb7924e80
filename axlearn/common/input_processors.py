"""Generic tf.data sources and processors: mixtures, shuffling, field edits, malformed records.

These are part of the `axlearn.common.input_tf_data` API: that module re-exports them, and each
carries `__module__ = "axlearn.common.input_tf_data"`, so configs print them as
`'axlearn.common.input_tf_data.<name>'` wherever they are defined (as NumPy does for its API).
This file only keeps `input_tf_data.py` to one idea per file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from axlearn.common.config import (
    ConfigBase,
    FunctionConfigBase,
    InstantiableConfig,
    maybe_set_config,
)
from axlearn.common.input_feed import MALFORMED_SKIP, current_feed, derive_seed

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

# The module these functions belong to publicly.
PUBLIC_MODULE = "axlearn.common.input_tf_data"


def _public(fn: Callable) -> Callable:
    fn.__module__ = PUBLIC_MODULE
    return fn


@_public
class BuildDatasetFn(Protocol):
    """A function that creates a tf.data.Dataset (an input source)."""

    def __call__(self) -> tf.data.Dataset: ...


@_public
class DatasetToDatasetFn(Protocol):
    """A function that transforms a tf.data.Dataset (a processor or batcher)."""

    def __call__(self, ds: tf.data.Dataset) -> tf.data.Dataset: ...


@_public
def sample_from_datasets(
    is_training: bool,
    *,
    sources: Sequence[InstantiableConfig],
    weights: Sequence[float],
    seed: Optional[int] = None,
) -> BuildDatasetFn:
    """Returns a source that samples examples from several sources with the given weights.

    Every source is repeated, so the mixture is infinite; use `take` for a finite one.

    Args:
        is_training: Passed to every source.
        sources: Configs of BuildDatasetFns (use `with_processor` to process a source first).
        weights: Sampling weights (normalized), one per source.
        seed: Seed of the sampling; None: the Input's seed.

    Returns:
        A BuildDatasetFn.

    Raises:
        ValueError: If `sources` is empty, lengths differ or a weight is negative; when the
            dataset is built, if a source is known to have no examples.
    """
    if not sources:
        raise ValueError("sample_from_datasets: expected at least one source")
    if len(sources) != len(weights):
        raise ValueError(f"sample_from_datasets: {len(sources)} sources but {len(weights)} weights")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"sample_from_datasets: weights must be >= 0 with a positive sum: {weights}"
        )
    source_fns = [maybe_set_config(s, is_training=is_training).instantiate() for s in sources]

    def fn() -> tf.data.Dataset:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        datasets = [source_fn() for source_fn in source_fns]
        for i, ds in enumerate(datasets):
            if int(ds.cardinality()) == 0:
                raise ValueError(
                    f"sample_from_datasets: source {i} ({describe_source(sources[i])}) has no "
                    "examples; remove it or give it data"
                )
        datasets = [ds.repeat() for ds in datasets]
        total = float(sum(weights))
        return tf.data.Dataset.sample_from_datasets(
            datasets,
            weights=[w / total for w in weights],
            seed=derive_seed("sample_from_datasets", seed),
            stop_on_empty_dataset=True,
        )

    return fn


@_public
def concatenate_datasets(is_training: bool, *, sources: Sequence[InstantiableConfig]):
    """Returns a source that reads the given sources one after another.

    Args:
        is_training: Passed to every source.
        sources: Configs of BuildDatasetFns.

    Returns:
        A BuildDatasetFn.
    """
    if not sources:
        raise ValueError("concatenate_datasets: expected at least one source")
    source_fns = [maybe_set_config(s, is_training=is_training).instantiate() for s in sources]

    def fn() -> tf.data.Dataset:
        ds = source_fns[0]()
        for source_fn in source_fns[1:]:
            ds = ds.concatenate(source_fn())
        return ds

    return fn


@_public
def with_processor(
    source: InstantiableConfig,
    *,
    processor: InstantiableConfig,
    is_training: Optional[bool] = None,
) -> BuildDatasetFn:
    """Returns a source that applies `processor` to `source`.

    Args:
        source: Config of a BuildDatasetFn.
        processor: Config of a DatasetToDatasetFn.
        is_training: Passed to both when set.

    Returns:
        A BuildDatasetFn.
    """
    source_fn = maybe_set_config(source, is_training=is_training).instantiate()
    processor_fn = maybe_set_config(processor, is_training=is_training).instantiate()

    def fn() -> tf.data.Dataset:
        return processor_fn(source_fn())

    return fn


@_public
def shuffle(shuffle_buffer_size: int, *, seed: Optional[int] = None) -> DatasetToDatasetFn:
    """Returns a processor that shuffles examples (a no-op when the buffer size is <= 0).

    Args:
        shuffle_buffer_size: The shuffle buffer size.
        seed: Seed; None: the Input's seed.

    Returns:
        A DatasetToDatasetFn.
    """

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        if shuffle_buffer_size <= 0:
            return ds
        return ds.shuffle(
            shuffle_buffer_size, seed=derive_seed("shuffle", seed), reshuffle_each_iteration=True
        )

    return fn


@_public
def take(num_examples: int) -> DatasetToDatasetFn:
    """Returns a processor keeping the first `num_examples` examples."""
    return lambda ds: ds.take(num_examples)


@_public
def unbatch() -> DatasetToDatasetFn:
    """Returns a processor splitting each example along its first dimension (`ds.unbatch()`)."""
    return lambda ds: ds.unbatch()


@_public
def filter_examples(filter_fn: Callable) -> DatasetToDatasetFn:
    """Returns a processor keeping examples for which `filter_fn(example)` is True."""
    return lambda ds: ds.filter(filter_fn)


@_public
def select_fields(fields: Sequence[str]) -> DatasetToDatasetFn:
    """Returns a processor keeping only `fields` of each (dict) example."""
    return lambda ds: ds.map(lambda ex: {k: ex[k] for k in fields})


@_public
def remove_fields(fields: Sequence[str]) -> DatasetToDatasetFn:
    """Returns a processor dropping `fields` from each (dict) example."""
    return lambda ds: ds.map(lambda ex: {k: v for k, v in ex.items() if k not in fields})


@_public
def rekey(
    key_map: dict[str, str],
    *,
    default_value: Any = "",
    retain_original_inputs: bool = False,
    separator: Optional[str] = None,
) -> DatasetToDatasetFn:
    """Returns a processor renaming fields: `{new_key: old_key}`.

    Args:
        key_map: New key to original key; a missing or empty original key gets `default_value`
            (or is left out when `default_value` is None).
        default_value: Value for missing keys.
        retain_original_inputs: Whether to keep the fields not named in `key_map`.
        separator: If set, keys are paths into nested dicts split by it (e.g. with ".",
            "a.b" is `ex["a"]["b"]`, read or written); None: keys are literal.

    Returns:
        A DatasetToDatasetFn.
    """

    def split(key: str) -> list[str]:
        return key.split(separator) if separator else [key]

    def lookup(ex: dict, path: list[str]) -> tuple[bool, Any]:
        for part in path:
            if not isinstance(ex, dict) or part not in ex:
                return False, None
            ex = ex[part]
        return True, ex

    def assign(out: dict, path: list[str], value: Any) -> None:
        for part in path[:-1]:
            out = out.setdefault(part, {})
        out[path[-1]] = value

    def map_fn(ex: dict) -> dict:
        out = dict(ex) if retain_original_inputs else {}
        for new_key, old_key in key_map.items():
            found, value = lookup(ex, split(old_key)) if old_key else (False, None)
            if found:
                assign(out, split(new_key), value)
            elif default_value is not None:
                assign(out, split(new_key), default_value)
        return out

    return lambda ds: ds.map(map_fn) if key_map else ds


@_public
def handle_malformed(
    ds: tf.data.Dataset, *, is_valid: Callable[[Any], Any], what: str, detail: Callable
) -> tf.data.Dataset:
    """Applies the current feed's malformed-record policy to `ds`.

    With "fail" (the default), a record for which `is_valid` is False stops the pipeline with an
    error naming the source, the problem and the start of the record. With "skip", such records
    are dropped and counted (`InputIterator.num_malformed_records`, logged as they occur).

    Args:
        ds: The dataset.
        is_valid: example -> scalar bool tensor.
        what: Describes the problem, e.g. "field 'text' is not valid UTF-8".
        detail: example -> string tensor shown in the error (e.g. the first bytes of the text).

    Returns:
        The dataset with the policy applied.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ctx = current_feed()
    if ctx.malformed_records == MALFORMED_SKIP:
        counter = ctx.malformed_counter
        if counter is None:
            counter = tf.Variable(0, dtype=tf.int64, trainable=False)

        def keep(ex):
            ok = is_valid(ex)
            with tf.control_dependencies([counter.assign_add(tf.cast(~ok, tf.int64))]):
                return tf.identity(ok)

        return ds.filter(tf.autograph.experimental.do_not_convert(keep))
    message = (
        f"Malformed record in {ctx.source_description}: {what}. To count and skip such "
        f"records instead, set the Input's malformed_records to skip. Record:"
    )

    def check(ex):
        ok = is_valid(ex)
        shown = detail(ex)
        if shown.dtype == tf.string:
            # Invalid UTF-8 in an error message would hide the message itself.
            shown = tf.strings.unicode_transcode(
                shown, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
            )
        with tf.control_dependencies([tf.debugging.Assert(ok, [message, shown])]):
            return tf.nest.map_structure(tf.identity, ex)

    return ds.map(tf.autograph.experimental.do_not_convert(check))


@_public
def disable_shuffle_recursively(cfg: ConfigBase) -> None:
    """Sets every `train_shuffle_buffer_size` field to 0 and `train_shuffle_files` to False.

    Args:
        cfg: A config tree (modified in place).
    """

    def enter_fn(_, child, default_kv):
        if isinstance(child, ConfigBase):
            for k in child.keys():
                if k.endswith("train_shuffle_buffer_size"):
                    setattr(child, k, 0)
                elif k == "train_shuffle_files":
                    setattr(child, k, False)
        return default_kv

    cfg.visit(visit_fn=lambda k, v: None, enter_fn=enter_fn)


@_public
def describe_source(cfg: ConfigBase) -> str:
    """Returns a short description of a source config for messages (its function and data set).

    Args:
        cfg: A source config.

    Returns:
        E.g. "tfds_input(dataset_name='python_docs:1.0.0', split='train')".
    """
    parts: list[str] = []

    def enter_fn(_, child, default_kv):
        if isinstance(child, ConfigBase):
            for k in ("dataset_name", "mixture_or_task_name", "split"):
                if k in child and isinstance(getattr(child, k), str):
                    parts.append(f"{k}={getattr(child, k)!r}")
        return default_kv

    cfg.visit(visit_fn=lambda k, v: None, enter_fn=enter_fn)
    fn = getattr(cfg, "fn", None) if isinstance(cfg, FunctionConfigBase) else None
    name = getattr(fn, "__name__", type(cfg).__name__)
    return f"{name}({', '.join(dict.fromkeys(parts))})"
