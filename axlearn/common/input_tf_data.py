"""Input pipelines on tf.data: sources, processors, batching and the `Input` module.

An `Input` is three functions (configs that instantiate to them):

- `source`: `() -> tf.data.Dataset` of raw examples (a `BuildDatasetFn`), e.g. `tfds_dataset`;
- `processor`: `tf.data.Dataset -> tf.data.Dataset` (a `DatasetToDatasetFn`) that turns examples
  into model examples, possibly merging or splitting them (`identity`, `chain`, `shuffle`, the
  language-model processors of `axlearn.common.input_lm`, ...);
- `batcher`: batches examples (`batch`).

Iterating an `Input` yields dicts of NumPy arrays: this process's slice of each global batch.
How the global batch is split into independently read "feeds" (and so across processes) is
described in `axlearn.common.input_feed`; how an iterator is saved and restored exactly in
`axlearn.common.input_iterator`.

TensorFlow, TFDS and seqio are imported lazily: importing this module does not import them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from absl import logging

from axlearn.common.config import (
    REQUIRED,
    ConfigBase,
    InstantiableConfig,
    Required,
    config_class,
    config_for_function,
    maybe_instantiate,
    maybe_set_config,
)
from axlearn.common.input_batch_processors import (
    add_static_fields,
    pack_to_batch,
    pad_to_batch,
    trim_and_pad_tensor,
    trim_to_batch,
    unpack,
)
from axlearn.common.input_batching import (  # noqa: F401 (public re-exports)
    PadExampleFn,
    batch,
    count_examples,
    default_pad_example_fn,
    per_feed_batch,
)
from axlearn.common.input_feed import (
    DEFAULT_SEED,
    MALFORMED_FAIL,
    MALFORMED_SKIP,
    FeedContext,
    claim_shard,
    current_feed,
    derive_seed,
    feed_scope,
    local_feed_indices,
)
from axlearn.common.input_field_processors import (  # noqa: F401 (public re-exports)
    extract_from_sequence,
    preserve_element_spec,
    ragged_to_tensor,
    squeeze_fields,
)
from axlearn.common.input_iterator import Feed, InputError, InputIterator, InputStateError
from axlearn.common.input_padding import (  # noqa: F401 (AXLearn's private helpers)
    _infer_cardinality,
    _pad_for_evaluation,
    _pad_logical_to_physical,
)
from axlearn.common.input_processors import (
    BuildDatasetFn,
    DatasetToDatasetFn,
    concatenate_datasets,
    describe_source,
    disable_shuffle_recursively,
    filter_examples,
    handle_malformed,
    rekey,
    remove_fields,
    sample_from_datasets,
    select_fields,
    shuffle,
    take,
    unbatch,
    with_processor,
)
from axlearn.common.module import Module, nowrap

# The data dir (`--data_dir`, `utils.set_data_dir`): one home, in utils; re-exported here.
from axlearn.common.utils import get_data_dir  # noqa: F401

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = [
    "BuildDatasetFn",
    "DatasetToDatasetFn",
    "FeedContext",
    "Input",
    "InputError",
    "InputIterator",
    "InputStateError",
    "add_static_fields",
    "batch",
    "chain",
    "concatenate_datasets",
    "current_feed",
    "default_pad_example_fn",
    "disable_shuffle_recursively",
    "extract_from_sequence",
    "filter_examples",
    "get_data_dir",
    "handle_malformed",
    "identity",
    "pack_to_batch",
    "pad_to_batch",
    "preserve_element_spec",
    "ragged_to_tensor",
    "rekey",
    "remove_fields",
    "sample_from_datasets",
    "select_fields",
    "shuffle",
    "squeeze_fields",
    "take",
    "tfds_dataset",
    "tfds_read_config",
    "trim_and_pad_tensor",
    "trim_to_batch",
    "unbatch",
    "unpack",
    "with_processor",
]

# Environment variable holding the data dir (`--data_dir`); "FAKE" means fake inputs.
DATA_DIR_ENV = "DATA_DIR"
# TFDS builder names of data sets built locally from files in the repo (no network), mapped to
# the module that registers the builder and the function that builds the data set.
_EMBEDDED_BUILDERS = {"python_docs": "axlearn.common.embedded_data"}


# ------------------------------------------------------------------------------------------------
# Sources.
# ------------------------------------------------------------------------------------------------


def tfds_read_config(
    *,
    is_training: bool,
    num_shards: Optional[int] = None,
    shard_index: Optional[int] = None,
    read_parallelism: int = 1,
    decode_parallelism: int = 32,
) -> Any:
    """Returns a `tfds.ReadConfig` for reading one feed's shard.

    Examples are split evenly across shards (`tfds.even_splits`), independently of how many
    files the data set has; `num_shards`/`shard_index` default to the current feed.

    Args:
        is_training: Whether reading for training (parallel reads and decodes); evaluation reads
            sequentially.
        num_shards: The number of shards; defaults to the current feed's `num_feeds`.
        shard_index: This shard; defaults to the current feed's index.
        read_parallelism: Files read in parallel when training.
        decode_parallelism: Parallel decodes when training.

    Returns:
        A tfds.ReadConfig; its `input_context` names the shard (`tfds_dataset` reads it
        through the split).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    ctx = current_feed()
    parallel_read = read_parallelism if is_training else 1
    return tfds.ReadConfig(
        interleave_cycle_length=parallel_read,
        num_parallel_calls_for_interleave_files=parallel_read,
        num_parallel_calls_for_decode=decode_parallelism if is_training else 1,
        shuffle_seed=derive_seed("tfds_read_config/shuffle_files"),
        # Describes the shard (as AXLearn's read config does); `tfds_dataset` reads the shard
        # through the split and clears it, so that TFDS does not shard the files again.
        input_context=tf.distribute.InputContext(
            num_input_pipelines=ctx.num_feeds if num_shards is None else num_shards,
            input_pipeline_id=ctx.feed_index if shard_index is None else shard_index,
        ),
    )


def _read_shard(read_config: Optional[InstantiableConfig], name: str) -> tuple[int, int]:
    num_shards, shard_index = claim_shard(name)
    if read_config is not None and "num_shards" in read_config:
        if read_config.num_shards is not None:
            num_shards = read_config.num_shards
        if read_config.shard_index is not None:
            shard_index = read_config.shard_index
    return num_shards, shard_index


def _resolve_tfds_data_dir(dataset_name: str, data_dir: Optional[str]) -> Optional[str]:
    """Returns the TFDS data dir for `dataset_name`, building embedded data sets if needed."""
    builder_name = dataset_name.split(":")[0].split("/")[0]
    if builder_name in _EMBEDDED_BUILDERS:
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common import embedded_data

        return embedded_data.prepare(data_dir)
    if data_dir is None:
        env = get_data_dir()
        if env and env != "FAKE":
            data_dir = env
    return data_dir


# Builders by (dataset name, data dir): building one reads metadata files, so reuse them.
_BUILDERS: dict = {}


def _tfds_builder(dataset_name: str, *, data_dir: Optional[str], download: bool) -> Any:
    key = (dataset_name, data_dir)
    if key in _BUILDERS:
        return _BUILDERS[key]
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    where = data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
    try:
        builder = tfds.builder(dataset_name, data_dir=data_dir)
    except Exception as e:  # pylint: disable=broad-except
        raise FileNotFoundError(
            f"TFDS data set '{dataset_name}' was not found: looked in data_dir {where!r} "
            f"(set tfds_dataset(data_dir=...) or --data_dir) and in the registered builders: "
            f"{type(e).__name__}: {e}"
        ) from e
    if download:
        logging.info("Downloading and preparing %s into %s", dataset_name, where)
        builder.download_and_prepare()
    elif not builder.is_prepared():
        raise FileNotFoundError(
            f"TFDS data set '{dataset_name}' is not prepared: looked in {builder.data_dir!r}. "
            f"Prepare it there, point data_dir/--data_dir at its parent, or set download=True."
        )
    _BUILDERS[key] = builder
    return builder


def tfds_dataset(
    dataset_name: str,
    *,
    split: str,
    is_training: bool,
    train_shuffle_buffer_size: Optional[int] = None,
    train_shuffle_files: Optional[bool] = None,
    data_dir: Optional[str] = None,
    download: bool = False,
    read_config: Optional[InstantiableConfig] = None,
    decoders: Optional[InstantiableConfig] = None,
    seed: Optional[int] = None,
) -> BuildDatasetFn:
    """Returns a source reading one TFDS data set split (this feed's shard of it).

    Args:
        dataset_name: The TFDS name, optionally with config and version (`name/config:1.0.0`).
            `python_docs` is the embedded data set, built locally on first use.
        split: The split, with TFDS slicing allowed (`test[:5000]`, `train[:10%]`).
        is_training: Whether reading for training (shuffles if configured); evaluation reads
            in a fixed order without shuffling.
        train_shuffle_buffer_size: Examples shuffle buffer when training; required when training
            (0 disables shuffling).
        train_shuffle_files: Whether to shuffle file order when training; None: when the
            shuffle buffer is positive.
        data_dir: The TFDS data dir; None: `--data_dir` (env DATA_DIR) or TFDS's default
            (the embedded data set: the axlearn cache dir).
        download: Whether to run `download_and_prepare` (may use the network). Without it the data
            set must already be prepared under data_dir (embedded data sets are always built
            locally).
        read_config: A config of `tfds_read_config` (parallelism, explicit sharding).
        decoders: Optional config of TFDS decoders.
        seed: Seed of the shuffles; None: the Input's seed.

    Returns:
        A BuildDatasetFn.

    Raises:
        ValueError: If training and `train_shuffle_buffer_size` is None.
    """
    if is_training:
        if train_shuffle_buffer_size is None:
            raise ValueError(
                f"tfds_dataset({dataset_name!r}): train_shuffle_buffer_size is required when "
                f"is_training=True (0 disables shuffling)"
            )
        shuffle_buffer_size = train_shuffle_buffer_size
        shuffle_files = (
            shuffle_buffer_size > 0 if train_shuffle_files is None else train_shuffle_files
        )
    else:
        shuffle_buffer_size, shuffle_files = 0, False
    if read_config is None:
        read_config = config_for_function(tfds_read_config)
    read_config = read_config.clone(is_training=is_training)

    def fn() -> tf.data.Dataset:
        import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

        resolved_dir = _resolve_tfds_data_dir(dataset_name, data_dir)
        builder = _tfds_builder(dataset_name, data_dir=resolved_dir, download=download)
        num_shards, shard_index = _read_shard(read_config, f"tfds_dataset({dataset_name})")
        per_feed_split = split
        if num_shards > 1:
            per_feed_split = tfds.even_splits(split, n=num_shards, drop_remainder=False)[
                shard_index
            ]
        with feed_scope(_with_seed(current_feed(), seed)):
            ds = builder.as_dataset(
                split=per_feed_split,
                shuffle_files=shuffle_files,
                # The shard is read through the split: no file sharding by TFDS on top.
                read_config=dataclasses.replace(read_config.instantiate(), input_context=None),
                decoders=maybe_instantiate(decoders),
            )
            if shuffle_buffer_size > 0:
                # Shuffle examples before any processing merges or splits them.
                ds = ds.shuffle(
                    shuffle_buffer_size,
                    seed=derive_seed(f"tfds_dataset/shuffle/{dataset_name}/{split}"),
                    reshuffle_each_iteration=True,
                )
        return ds

    return fn


def _with_seed(ctx: FeedContext, seed: Optional[int]) -> FeedContext:
    if seed is None:
        return ctx
    return dataclasses.replace(ctx, seed=seed)


# ------------------------------------------------------------------------------------------------
# Processors.
# ------------------------------------------------------------------------------------------------


def identity() -> DatasetToDatasetFn:
    """Returns a processor that returns its input unchanged."""
    return lambda ds: ds


def chain(*args, is_training: Optional[bool] = None) -> DatasetToDatasetFn:
    """Returns a processor applying the given processors (configs or functions) in order.

    Args:
        *args: Processors or their configs.
        is_training: Passed to processor configs that have the field.

    Returns:
        A DatasetToDatasetFn.
    """
    processors = [
        maybe_instantiate(maybe_set_config(p, is_training=is_training))
        if isinstance(p, ConfigBase)
        else p
        for p in args
    ]

    def fn(ds: tf.data.Dataset) -> tf.data.Dataset:
        for processor in processors:
            ds = processor(ds)
        return ds

    return fn


# ------------------------------------------------------------------------------------------------
# The Input module.
# ------------------------------------------------------------------------------------------------


class Input(Module):
    """A Module producing batches from tf.data: `source` -> `processor` -> `batcher`.

    Iterate it (`iter(input)`) for dicts of NumPy arrays: this process's slice of each global
    batch (the global batch itself with one process). `iterator_state`/`restore_iterator` save and
    restore an iterator's position exactly (see `axlearn.common.input_iterator`).
    """

    @config_class
    class Config(Module.Config):
        """Configures Input."""

        # Whether the input is for training (shuffled, repeated) or evaluation (one padded pass).
        is_training: Required[bool] = REQUIRED
        # A config of a BuildDatasetFn: the raw examples.
        source: Required[InstantiableConfig] = REQUIRED
        # A config of a DatasetToDatasetFn: examples -> model examples.
        processor: Required[InstantiableConfig] = REQUIRED
        # A config of a DatasetToDatasetFn that batches examples.
        batcher: InstantiableConfig = config_for_function(batch)
        # Independent pipelines the global batch is split across; None: the process count.
        # Global batches depend on it (not on the process count); keep it fixed to resume on a
        # different number of processes.
        num_feeds: Optional[int] = None
        # Base seed of shuffles and sampling; None: input_feed.DEFAULT_SEED (0).
        seed: Optional[int] = None
        # Malformed records: None or "fail" stops with an error naming the source; "skip"
        # drops and counts them.
        malformed_records: Optional[str] = None
        # Optional `input_dispatch.InputDispatcher` config: its global_logical_batch_size is the
        # global batch, split evenly over the feeds (use with the `per_feed_batch` batcher).
        input_dispatcher: Optional[InstantiableConfig] = None
        # Optional config of a function mapping an input batch to its partition specs (e.g.
        # `input_base.partition_by_path_rank`); see `Input.partition_specs`.
        input_partitioner: Optional[InstantiableConfig] = None

    def __init__(
        self,
        cfg: Config,
        *,
        parent: Optional[Module],
        process_index: Optional[int] = None,
        process_count: Optional[int] = None,
    ):
        """Builds the input.

        Args:
            cfg: The config.
            parent: The parent module.
            process_index: Overrides `jax.process_index()` (e.g. to simulate processes in tests).
            process_count: Overrides `jax.process_count()`.

        Raises:
            ValueError: On an invalid `malformed_records` or `num_feeds`.
        """
        super().__init__(cfg, parent=parent)
        cfg = self.config
        import jax  # pylint: disable=import-outside-toplevel

        self._process_count = jax.process_count() if process_count is None else process_count
        self._process_index = jax.process_index() if process_index is None else process_index
        self._num_feeds = cfg.num_feeds or self._process_count
        self._feed_indices = local_feed_indices(
            num_feeds=self._num_feeds,
            process_index=self._process_index,
            process_count=self._process_count,
        )
        policy = cfg.malformed_records or MALFORMED_FAIL
        if policy not in (MALFORMED_FAIL, MALFORMED_SKIP):
            raise ValueError(
                f"{self.path()}.malformed_records must be None, 'fail' or 'skip', got {policy!r}"
            )
        self._policy = policy
        self._seed = DEFAULT_SEED if cfg.seed is None else cfg.seed
        self._source = maybe_set_config(cfg.source, is_training=cfg.is_training).instantiate()
        self._processor = maybe_set_config(cfg.processor, is_training=cfg.is_training).instantiate()
        batcher = cfg.batcher
        self._per_feed_batch_size = None
        if cfg.input_dispatcher is not None:
            batcher = self._dispatched_batcher(batcher)
        elif "global_batch_size" in batcher and isinstance(batcher.global_batch_size, int):
            self._per_feed_batch_size = batcher.global_batch_size // self._num_feeds
        self._batcher = maybe_set_config(batcher, is_training=cfg.is_training).instantiate()
        self._description = describe_source(cfg.source)
        dump = [line for line in cfg.debug_string().splitlines() if not line.startswith("name:")]
        self._config_dump = "\n".join(dump)
        self._eval_num_batches: Optional[int] = None
        self._eval_counts: dict[int, int] = {}

    def _dispatched_batcher(self, batcher: InstantiableConfig) -> InstantiableConfig:
        """The batcher config with this feed's share of the dispatcher's logical batch."""
        cfg = self.config
        if (
            "feed_batch_size" not in batcher
            and "global_logical_batch_size" in batcher
            and "logical_feed_indices" in cfg.input_dispatcher
        ):
            return self._logical_batcher(batcher)
        logical = cfg.input_dispatcher.global_logical_batch_size
        if logical % self._num_feeds != 0:
            raise ValueError(
                f"{self.path()}.input_dispatcher.global_logical_batch_size={logical} is not "
                f"divisible by the {self._num_feeds} input feeds: use a multiple of "
                f"{self._num_feeds}"
            )
        if "feed_batch_size" not in batcher:
            raise ValueError(
                f"{self.path()}.batcher ({describe_source(batcher)}) has no feed_batch_size: "
                "use input_tf_data.per_feed_batch (or input_tf_data.batch under an InputDispatcher)"
            )
        self._per_feed_batch_size = logical // self._num_feeds
        return batcher.clone(feed_batch_size=self._per_feed_batch_size)

    def _logical_batcher(self, batcher: InstantiableConfig) -> InstantiableConfig:
        """The `batch` config of this feed under an `input_dispatch.InputDispatcher`.

        The dispatcher (a child, `self.input_dispatcher`) resolves the physical feeds, this
        feed's index and the logical feeds; `batch` pads this feed's logical examples to its
        physical batch and adds the dispatch tensor, which `input_dispatcher.
        physical_to_logical_batch` uses on the global batch.
        """
        dispatcher = self._add_child("input_dispatcher", self.config.input_dispatcher)
        dcfg = dispatcher.config
        self._per_feed_batch_size = dispatcher.feed_physical_batch_size
        return batcher.clone(
            global_batch_size=dcfg.global_physical_batch_size,
            global_logical_batch_size=dcfg.global_logical_batch_size,
            logical_feed_indices=list(dcfg.logical_feed_indices),
            num_physical_feeds=dcfg.num_physical_feeds,
            physical_feed_index=dcfg.physical_feed_index,
        )

    @nowrap
    def partition_specs(self, input_batch: Any) -> Any:
        """The partition specs of a (global) input batch from `input_partitioner`.

        Args:
            input_batch: A (nested) batch of arrays or shape structs.

        Returns:
            A tree of PartitionSpecs like `input_batch`, or None without an input_partitioner.
        """
        if self.config.input_partitioner is None:
            return None
        return maybe_instantiate(self.config.input_partitioner)(input_batch)

    @property
    def source(self) -> BuildDatasetFn:
        """The instantiated source."""
        return self._source

    @property
    def processor(self) -> DatasetToDatasetFn:
        """The instantiated processor."""
        return self._processor

    @property
    def num_feeds(self) -> int:
        """The number of feeds of the global batch."""
        return self._num_feeds

    @property
    def feed_indices(self) -> range:
        """The feeds this process runs."""
        return self._feed_indices

    def _feed_context(self, feed_index: int, counter: Any = None) -> FeedContext:
        return FeedContext(
            num_feeds=self._num_feeds,
            feed_index=feed_index,
            seed=self._seed,
            malformed_records=self._policy,
            source_description=self._description,
            malformed_counter=counter,
            eval_num_batches=self._eval_num_batches,
            eval_num_examples=self._eval_counts.get(feed_index),
        )

    def _examples(self, feed_index: int, counter: Any = None) -> tf.data.Dataset:
        with feed_scope(self._feed_context(feed_index, counter)) as ctx:
            ds = self._source()
            if not ctx.claims and ctx.num_feeds > 1:
                # The source reads everything: keep every num_feeds-th example for this feed.
                ds = ds.shard(ctx.num_feeds, ctx.feed_index)
            return self._processor(ds)

    def _compute_eval_num_batches(self) -> int:
        """Counts examples of every local feed; all feeds pad to the largest batch count."""
        per_feed = self._per_feed_batch_size
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        try:
            counts = [count_examples(self._examples(f)) for f in self._feed_indices]
        except tf.errors.OpError as e:
            raise InputError(
                f"Input '{self.path()}' (source {self._description}) failed while counting its "
                f"evaluation examples: {type(e).__name__}: {e.message}"
            ) from e
        self._eval_counts = dict(zip(self._feed_indices, counts))
        num_batches = max(-(-n // per_feed) for n in counts)
        import jax  # pylint: disable=import-outside-toplevel

        if jax.process_count() > 1 and self._process_count == jax.process_count():
            import numpy as np  # pylint: disable=import-outside-toplevel
            from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

            gathered = multihost_utils.process_allgather(np.array([num_batches]))
            num_batches = int(np.max(gathered))
        logging.info(
            "Input %s: %s eval examples per feed -> %d batches", self.path(), counts, num_batches
        )
        return num_batches

    def _feed_dataset(self, feed_index: int, counter: Any = None) -> tf.data.Dataset:
        cfg = self.config
        if (
            not cfg.is_training
            and self._eval_num_batches is None
            and self._per_feed_batch_size is not None
        ):
            self._eval_num_batches = self._compute_eval_num_batches()
        ds = self._examples(feed_index, counter)
        with feed_scope(self._feed_context(feed_index, counter)):
            return self._batcher(ds)

    def _new_feed(self, feed_index: int) -> Feed:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        counter = None
        if self._policy == MALFORMED_SKIP:
            counter = tf.Variable(0, dtype=tf.int64, trainable=False)
        return Feed(
            index=feed_index,
            dataset=self._feed_dataset(feed_index, counter),
            counter=counter,
            description=self._description,
        )

    @nowrap
    def dataset(self) -> tf.data.Dataset:
        """Returns this process's batches as one tf.data.Dataset (feeds concatenated).

        For checkpointable iteration use `iter(input)` instead.

        Returns:
            The dataset.
        """
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        datasets = [self._feed_dataset(f) for f in self._feed_indices]
        if len(datasets) == 1:
            return datasets[0]
        return tf.data.Dataset.zip(tuple(datasets)).map(
            lambda *parts: tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=0), *parts)
        )

    @nowrap
    def element_spec(self) -> Any:
        """Returns the (nested) `jax.ShapeDtypeStruct`s of this process's batches.

        Shapes and dtypes are those of the NumPy batches iteration yields (strings: dtype
        object). No data is read.
        """
        import jax  # pylint: disable=import-outside-toplevel
        import numpy as np  # pylint: disable=import-outside-toplevel
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        def to_struct(spec):
            dtype = object if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
            return jax.ShapeDtypeStruct(tuple(spec.shape), dtype)

        return tf.nest.map_structure(to_struct, self.dataset().element_spec)

    def __iter__(self) -> InputIterator:
        """Returns a new iterator from the beginning of the input."""
        return InputIterator(
            feeds=[self._new_feed(f) for f in self._feed_indices],
            num_feeds=self._num_feeds,
            process_index=self._process_index,
            process_count=self._process_count,
            config_dump=self._config_dump,
            name=self.path() or "input",
            rebuild=self._new_feed,
        )

    @nowrap
    def batches(self, it: InputIterator):
        """Yields the batches of `it` (AXLearn-style trainer loops call this).

        Args:
            it: An iterator from `iter(input)`.

        Yields:
            Batches.
        """
        yield from it

    @nowrap
    def iterator_state(self, it: InputIterator) -> bytes:
        """Returns the position of `it` as bytes for the checkpointer.

        Args:
            it: An iterator from `iter(self)`.

        Returns:
            The state bytes of this process's feeds.
        """
        return it.get_state()

    @nowrap
    def restore_iterator(
        self, states: Union[bytes, Sequence[bytes]], *, check_config: bool = True
    ) -> InputIterator:
        """Returns a new iterator positioned where the saved one was.

        Args:
            states: This process's saved state, or all processes' states (required when the
                process count changed since saving).
            check_config: Whether to refuse states saved by a differently configured input.

        Returns:
            The iterator.

        Raises:
            InputStateError: If the states cannot be restored here (the message says what to do).
        """
        it = iter(self)
        it.set_state(states, check_config=check_config)
        return it
