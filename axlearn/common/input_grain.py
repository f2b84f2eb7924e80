"""Input pipelines on Grain (AXLearn's `input_grain`).

Grain datasets are NumPy/Python pipelines whose shuffling is index arithmetic: no shuffle buffer,
and an iterator's position is a small JSON-able dict (`DatasetIterator.get_state()`), saved in
microseconds whatever the pipeline holds in flight. A pipeline is built from `grain.MapDataset`
(random access: source, shuffle, mix, shard, map) then `grain.IterDataset` (sequential: packing,
batching, multiprocess prefetch).

    def build(dispatch_config: DispatchConfig) -> Dataset:
        ds = array_record_dataset(paths, seed=1).shuffle().repeat()  # the global order
        ds = shard_dataset(ds, dispatch_config)  # this feed's positions of it
        ds = prefetch_dataset(ds.map(parse), multiprocessing_options=...)
        return per_feed_batch(ds, global_batch_size=8, dispatch_config=dispatch_config)

    cfg = Input.default_config().set(name="input", source=config_for_function(lambda: build))

`Input.config.source` is a `BuildDatasetFn` (or a config instantiating to one): it is called with
this feed's `DispatchConfig` and returns this feed's dataset of per-feed batches. Iterating the
Input yields per-feed physical batches (`input_base.Input.batches`); `iterator_state(it)` returns
the position as JSON bytes and `restore_iterator(state)` resumes it exactly (Grain restores every
transformation, multiprocess prefetch workers included).

Elastic resume (a state saved by N feeds restored on M != N feeds) follows one rule, documented
in docs/inputs.md: shards are interleaved positions of one global order (`shard_dataset`: feed s
of n reads positions start + s, start + s + n, ...), and every feed takes the same number of
positions per batch (`rows_per_batch`, one per row: no packing or filtering after the shard). A
state at batch k therefore says the first start + k * rows_per_batch * N positions of the global
order were read by the N feeds together; the M new feeds continue with the positions after them
(`DispatchConfig.start_index`). Inputs opt in with `elastic_resume=True`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional, Protocol, Union, runtime_checkable

import grain
import jax
import numpy as np
from jax.sharding import PartitionSpec

from axlearn.common import input_base, input_state_check
from axlearn.common.config import REQUIRED, ConfigOr, Required, config_class, maybe_instantiate
from axlearn.common.input_grain_transforms import (
    Dataset,
    EmptyBatchError,
    RaggedTensor,
    maybe_to_iter_dataset,
    pad_for_evaluation,
    rekey,
    shard_dataset_with_proportion,
    unbatch,
)
from axlearn.common.input_iterator import (
    GRAIN_STATE_FORMAT,
    InputError,
    InputStateError,
    foreign_state_message,
)
from axlearn.common.module import Module, nowrap
from axlearn.common.utils import Nested, Tensor

_STATE_FORMAT = GRAIN_STATE_FORMAT
# Version 2 adds "sources" (the files read, with fingerprints); version 1 states still restore.
_STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
# What to do with a Grain state that cannot be restored (appended to refusals).
_STATE_FIX = (
    "resume from a checkpoint saved with the data this run reads, or set the trainer's "
    "save_input_iterator=False to start the input from its beginning"
)

__all__ = [
    "BuildDatasetFn",
    "Dataset",
    "DispatchConfig",
    "EmptyBatchError",
    "Input",
    "InputError",
    "InputStateError",
    "RaggedTensor",
    "array_record_dataset",
    "maybe_to_iter_dataset",
    "pad_for_evaluation",
    "per_feed_batch",
    "prefetch_dataset",
    "rekey",
    "sample_from_datasets",
    "shard_dataset",
    "shard_dataset_with_proportion",
    "unbatch",
]


@dataclasses.dataclass(frozen=True)
class DispatchConfig:
    """Which part of the global order a feed reads.

    Attributes:
        shard_index: This feed's shard, in [0, num_shards).
        num_shards: The number of feeds reading disjoint shards.
        start_index: The first position of the global order read (non-zero after an elastic
            resume: the positions before it were read by the run that saved).
    """

    shard_index: int = 0
    num_shards: int = 1
    start_index: int = 0


@runtime_checkable
class BuildDatasetFn(Protocol):
    """Builds a feed's dataset of per-feed batches from its `DispatchConfig`."""

    def __call__(self, dispatch_config: DispatchConfig) -> Dataset: ...


class _ArrayRecordSource:
    """`ArrayRecordDataSource` whose read errors name the file, the record and the fix."""

    def __init__(self, paths: Sequence[str]):
        self._paths = list(paths)
        self._source = grain.sources.ArrayRecordDataSource(self._paths)

    @property
    def source_paths(self) -> list[str]:
        """The files read, in order (recorded with fingerprints in the input's state)."""
        return list(self._paths)

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> bytes:
        try:
            return self._source[index]
        except Exception as e:  # pylint: disable=broad-except
            raise InputError(
                f"ArrayRecord source {self._paths}: record {index} cannot be read "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); the file is "
                f"corrupt or truncated: rewrite it (e.g. delete it to rebuild a cached corpus)"
            ) from None

    def __repr__(self) -> str:
        return f"_ArrayRecordSource({self._paths})"


def array_record_dataset(
    paths: Union[str, Sequence[str]], *, seed: Optional[int] = None
) -> grain.MapDataset:
    """Returns a MapDataset of the serialized records of ArrayRecord files (in file order).

    Args:
        paths: One path or a list of paths.
        seed: If not None, the dataset's seed (used by later `shuffle()`/`random_map` calls).

    Returns:
        A MapDataset of bytes.

    Raises:
        FileNotFoundError: Naming a missing file.
        InputError: If a file is not an ArrayRecord file.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ValueError("array_record_dataset: paths is empty; pass the ArrayRecord files")
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"array_record_dataset: no ArrayRecord file {path}; fix the path (or build the "
                f"files first)"
            )
        if not os.path.isfile(path):
            raise InputError(
                f"array_record_dataset: {path} is not a regular file (a FIFO, device or "
                f"directory); point the input at ArrayRecord files"
            )
    try:
        source = _ArrayRecordSource([os.fspath(p) for p in paths])
    except Exception as e:  # pylint: disable=broad-except
        raise InputError(
            f"array_record_dataset: cannot open {paths} as ArrayRecord files "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); rewrite them"
        ) from None
    ds = grain.MapDataset.source(source)
    if seed is not None:
        ds = ds.seed(seed)
    return ds


def sample_from_datasets(
    *, sources: Sequence[grain.MapDataset], weights: Sequence[float]
) -> grain.MapDataset:
    """Mixes MapDatasets by weight into one infinite MapDataset (each source repeats).

    Element i of the result is a deterministic function of i, so the mixture shards, shuffles and
    resumes like any MapDataset. Over n elements source j contributes n * weights[j] / sum(weights)
    elements up to rounding.

    Args:
        sources: The datasets (MapDatasets, finite or repeated).
        weights: One non-negative weight per source, with a positive sum.

    Returns:
        The mixed MapDataset.

    Raises:
        ValueError: If a source is not a MapDataset or the weights are invalid.
    """
    if len(sources) != len(weights) or not sources:
        raise ValueError(
            f"sample_from_datasets: got {len(sources)} sources and {len(weights)} weights; pass "
            f"one weight per source"
        )
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(
            f"sample_from_datasets: weights {list(weights)} must be finite, non-negative and sum "
            f"to a positive number; fix the mixture weights"
        )
    for i, ds in enumerate(sources):
        if not isinstance(ds, grain.MapDataset):
            raise ValueError(
                f"sample_from_datasets: sources[{i}] is a {type(ds).__name__}, not a MapDataset; "
                f"mix before maybe_to_iter_dataset/prefetch_dataset"
            )
    repeated = [ds if len(ds) >= np.iinfo(np.int32).max else ds.repeat() for ds in sources]
    return grain.MapDataset.mix(repeated, [float(x) for x in w])


def shard_dataset(
    ds: grain.MapDataset, dispatch_config: Optional[DispatchConfig] = None
) -> grain.MapDataset:
    """Returns this feed's interleaved shard: positions start + s, start + s + n, ... of `ds`.

    Feeds' shards are disjoint and together cover every position from `start_index` on.

    Args:
        ds: The global order (a MapDataset, typically shuffled and repeated).
        dispatch_config: The feed's dispatch; None: one shard (the whole dataset).

    Returns:
        The shard.

    Raises:
        ValueError: If `ds` is not a MapDataset or the dispatch is invalid.
    """
    dc = dispatch_config or DispatchConfig()
    if not isinstance(ds, grain.MapDataset):
        raise ValueError(
            f"shard_dataset: got a {type(ds).__name__}; shard a MapDataset (before "
            f"maybe_to_iter_dataset/prefetch_dataset)"
        )
    if not 0 <= dc.shard_index < dc.num_shards or dc.start_index < 0:
        raise ValueError(f"shard_dataset: invalid {dc}")
    return ds.slice(slice(dc.start_index + dc.shard_index, None, dc.num_shards))


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS)
        return os.cpu_count() or 1


def _ensure_absl_flags_parsed():
    # Grain's workers read absl flags; a library user (or pytest) may not have parsed them.
    from absl import flags  # pylint: disable=import-outside-toplevel

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def prefetch_dataset(
    ds: Dataset,
    *,
    multiprocessing_options: Optional[grain.MultiprocessingOptions] = None,
) -> grain.IterDataset:
    """Runs the pipeline so far in worker processes (Grain's `mp_prefetch`).

    The iterator state covers every worker's position, so resuming stays exact.

    Args:
        ds: The dataset (a MapDataset is converted first).
        multiprocessing_options: Worker count and buffer sizes; None or num_workers=0: no
            workers (the dataset is returned as an IterDataset).

    Returns:
        The prefetching IterDataset.

    Raises:
        ValueError: If num_workers exceeds the CPUs this process may use.
    """
    ds = maybe_to_iter_dataset(ds)
    if multiprocessing_options is None or multiprocessing_options.num_workers <= 0:
        return ds
    cpus = _usable_cpus()
    if multiprocessing_options.num_workers > cpus:
        raise ValueError(
            f"prefetch_dataset: multiprocessing_options.num_workers="
            f"{multiprocessing_options.num_workers} exceeds the {cpus} CPUs this process may use; "
            f"set num_workers <= {cpus}"
        )
    _ensure_absl_flags_parsed()
    return ds.mp_prefetch(multiprocessing_options)


def per_feed_batch(
    ds: Dataset,
    *,
    global_batch_size: int,
    dispatch_config: DispatchConfig,
    drop_remainder: bool = True,
) -> grain.IterDataset:
    """Batches a feed's examples into its share of the global batch.

    Args:
        ds: This feed's examples.
        global_batch_size: The global (logical) batch size.
        dispatch_config: The feed's dispatch (its num_shards divides the global batch).
        drop_remainder: Whether a last, smaller batch is dropped.

    Returns:
        An IterDataset of per-feed batches (leaves stacked along a new leading axis).

    Raises:
        ValueError: If num_shards does not divide global_batch_size.
    """
    if global_batch_size % dispatch_config.num_shards:
        raise ValueError(
            f"per_feed_batch: global_batch_size={global_batch_size} is not divisible by the "
            f"{dispatch_config.num_shards} feeds; set it to a multiple of the feed count"
        )
    size = global_batch_size // dispatch_config.num_shards
    return maybe_to_iter_dataset(ds).batch(size, drop_remainder=drop_remainder)


def dataset_source_paths(ds: Any) -> list[str]:
    """The files a Grain pipeline reads: `source_paths` of every source in its graph.

    Sources exposing `source_paths` (as `array_record_dataset`'s does) are found through the
    datasets' parents (mixtures and multiprocess prefetch included), in graph order.

    Args:
        ds: A MapDataset or IterDataset.

    Returns:
        The paths, each once, in the order found.
    """
    paths, seen, stack = [], set(), [ds]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        source = getattr(node, "_source", None)
        for path in getattr(source, "source_paths", None) or []:
            if path not in paths:
                paths.append(path)
        children = list(getattr(node, "_parents", None) or [])
        children += list(getattr(node, "_datasets", None) or [])
        stack.extend(reversed(children))
    return paths


class GrainInputIterator:
    """An iterator of per-feed logical batches with a JSON position (see `Input`)."""

    def __init__(self, owner: Input, *, dispatch_config: DispatchConfig, num_batches: int = 0):
        self._owner = owner
        self._dispatch_config = dispatch_config
        dataset = owner.build_dataset(dispatch_config)
        # The files this iterator reads, fingerprinted when it was built (saved with the state).
        self.sources = input_state_check.source_fingerprints(dataset_source_paths(dataset))
        self._iterator = iter(dataset)
        # Batches read since the dispatch's start_index (for the elastic rule) and in all.
        self._batches_since_start = 0
        self._num_batches = num_batches
        self._rows_per_batch: Optional[int] = None

    def __iter__(self) -> GrainInputIterator:
        return self

    @property
    def num_batches(self) -> int:
        """The number of batches yielded so far (restored with the state)."""
        return self._num_batches

    def __next__(self) -> Nested[np.ndarray]:
        try:
            batch = next(self._iterator)
        except StopIteration:
            raise
        except InputError as e:
            raise InputError(f"Input '{self._owner.path()}': {e}") from None
        except Exception as e:  # pylint: disable=broad-except
            lines = [line for line in str(e).splitlines() if line.strip()]
            detail = next((line for line in reversed(lines) if "InputError" in line), None)
            detail = detail or (lines[0] if lines else "")
            raise InputError(
                f"Input '{self._owner.path()}' failed after {self._num_batches} batches: "
                f"{type(e).__name__}: {detail}"
            ) from None
        if self._rows_per_batch is None:
            leaves = jax.tree.leaves(batch)
            self._rows_per_batch = int(np.shape(leaves[0])[0]) if leaves else 0
        self._batches_since_start += 1
        self._num_batches += 1
        return batch

    def get_state(self) -> bytes:
        """Returns the position as JSON bytes (format in `Input.iterator_state`)."""
        dc = self._dispatch_config
        state = {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "signature": self._owner.signature(),
            "shard_index": dc.shard_index,
            "num_shards": dc.num_shards,
            "start_index": dc.start_index,
            "num_batches": self._num_batches,
            "batches_since_start": self._batches_since_start,
            "rows_per_batch": self._rows_per_batch,
            "sources": self.sources,
            "grain": self._iterator.get_state(),
        }
        return json.dumps(state, sort_keys=True).encode("utf-8")

    def set_grain_state(self, state: dict):
        """Restores the saved counters and Grain position of this dispatch (same shard)."""
        saved, expected = _structure(state["grain"]), _structure(self._iterator.get_state())
        try:
            if saved != expected:
                raise ValueError(f"saved structure {saved} != this pipeline's {expected}")
            self._iterator.set_state(state["grain"])
        except Exception as e:  # pylint: disable=broad-except
            raise InputStateError(
                f"Input '{self._owner.path()}': the saved Grain state does not fit this "
                f"pipeline ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); it "
                f"was saved by a pipeline of another shape. Restore it with the input config "
                f"that saved it, or start the input from the beginning."
            ) from None
        self._num_batches = state["num_batches"]
        self._batches_since_start = state["batches_since_start"]
        self._rows_per_batch = state["rows_per_batch"]


def _structure(state: Any) -> Any:
    """The shape of a Grain state: dict keys, list lengths and leaf types, recursively."""
    if isinstance(state, dict):
        return {k: _structure(v) for k, v in sorted(state.items()) if not k.isdigit()} | {
            "#keys": len(state)
        }
    if isinstance(state, (list, tuple)):
        return [_structure(v) for v in state]
    if isinstance(state, bool) or state is None:
        return type(state).__name__
    return "number" if isinstance(state, (int, float)) else type(state).__name__


def decode_state(
    state: bytes, *, what: str = "The saved Grain input state", name: str = "input"
) -> dict:
    """Parses and validates Grain input state bytes (bounded; every field typed).

    Args:
        state: Bytes from `Input.iterator_state`.
        what: Names the state in messages (e.g. with the input's path).
        name: The restoring input's path, for the message about a state another input wrote.

    Returns:
        The state dict: its counters are integers in range, "rows_per_batch" is null only
        when no batch was read since "start_index", "grain" is an object.

    Raises:
        InputStateError: One line naming the field and the fix if `state` is not a valid Grain
            input state.
    """
    state = bytes(state)
    if not state.lstrip().startswith(b"{"):
        raise InputStateError(
            foreign_state_message(state, name=name, reader="a Grain input of real data")
        )
    parsed = input_state_check.parse_state_json(state, what=what, fix=_STATE_FIX)
    if not isinstance(parsed, dict) or parsed.get("format") != _STATE_FORMAT:
        raise InputStateError(
            foreign_state_message(state, name=name, reader="a Grain input of real data")
        )
    version = parsed.get("version")
    if isinstance(version, bool) or version not in _READABLE_VERSIONS:
        raise InputStateError(
            f"{what}: unsupported version {str(version)[:20]!r} (this code reads "
            f"{list(_READABLE_VERSIONS)}); {_STATE_FIX}"
        )
    fields = dict(what=what, fix=_STATE_FIX)
    num_shards = input_state_check.require_int(parsed, "num_shards", minimum=1, **fields)
    shard = input_state_check.require_int(parsed, "shard_index", **fields)
    if shard >= num_shards:
        raise InputStateError(
            f"{what}: field 'shard_index' is {shard}, not below num_shards={num_shards}; the "
            f"state is corrupt: {_STATE_FIX}"
        )
    for field in ("start_index", "num_batches", "batches_since_start"):
        input_state_check.require_int(parsed, field, **fields)
    rows = input_state_check.require_int(
        parsed, "rows_per_batch", minimum=1, allow_none=True, **fields
    )
    if rows is None and parsed["batches_since_start"] > 0:
        raise InputStateError(
            f"{what}: field 'rows_per_batch' is null after {parsed['batches_since_start']} "
            f"batches, so the position cannot be computed; the state is corrupt: {_STATE_FIX}"
        )
    if not isinstance(parsed.get("signature"), str):
        raise InputStateError(
            f"{what}: field 'signature' must be a string, got "
            f"{type(parsed.get('signature')).__name__}; the state is corrupt: {_STATE_FIX}"
        )
    if not isinstance(parsed.get("grain"), dict):
        raise InputStateError(
            f"{what}: field 'grain' must be an object, got "
            f"{type(parsed.get('grain')).__name__}; the state is corrupt: {_STATE_FIX}"
        )
    if version >= 2 and "sources" not in parsed:
        raise InputStateError(f"{what} has no field 'sources'; the state is corrupt: {_STATE_FIX}")
    return parsed


class Input(input_base.Input):
    """A Grain input: `source` builds each feed's dataset of per-feed batches.

    State (`iterator_state`): UTF-8 JSON, one per process (no pickle):
    {"format", "version", "signature" (hash of the config), "shard_index", "num_shards"
    (the feed count), "start_index", "num_batches", "batches_since_start", "rows_per_batch"
    (null until a batch is read), "sources" (each file read: path, size, mtime_ns and a
    fingerprint, see `axlearn.common.input_state_check`), "grain" (Grain's own iterator state)}.

    A restore validates every field (one line naming the field otherwise), refuses a state whose
    source files changed since it was saved, and computes an elastic position only from integer
    counters. Version 1 states (no "sources") restore with every check but the source one.
    """

    @config_class
    class Config(input_base.Input.Config):
        """Configures Input."""

        # A BuildDatasetFn (or a config instantiating to one): called with this feed's
        # DispatchConfig, returns its dataset of per-feed logical batches.
        source: Required[ConfigOr[BuildDatasetFn]] = REQUIRED
        # Partition spec of the global batch's leading axis; None: the trainer's batch axes.
        partition_spec: Optional[PartitionSpec] = None
        # Optional fn(input_batch) -> partition specs per leaf (e.g. partition_by_path_rank);
        # None: every leaf is sharded along its batch axis.
        input_partitioner: Optional[ConfigOr[Callable]] = None
        # Whether a state saved with a different feed count may be restored (the elastic rule
        # of the module docstring; only for pipelines taking one shard position per batch row).
        elastic_resume: bool = False

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._source: BuildDatasetFn = maybe_instantiate(cfg.source)
        if not callable(self._source):
            raise ValueError(
                f"{self.path()}.source must be a BuildDatasetFn (a callable of DispatchConfig) "
                f"or a config instantiating to one, got {type(self._source).__name__}"
            )
        # The feed layout (input_dispatcher) may change across an elastic resume.
        dump = [
            line
            for line in cfg.debug_string().splitlines()
            if not line.startswith(("name:", "input_dispatcher"))
        ]
        self._signature = hashlib.sha256("\n".join(dump).encode("utf-8")).hexdigest()[:16]

    @nowrap
    def signature(self) -> str:
        """A hash of this input's config (states from other configs are refused)."""
        return self._signature

    @nowrap
    def partition_specs(self, input_batch: Any) -> Any:
        """The partition specs of a (global) input batch.

        Args:
            input_batch: A (nested) batch of arrays or shape structs.

        Returns:
            `input_partitioner(input_batch)`; else every leaf gets `partition_spec` (None without
            either: the trainer shards batches over its batch axes).
        """
        cfg = self.config
        if cfg.input_partitioner is not None:
            return maybe_instantiate(cfg.input_partitioner)(input_batch)
        if cfg.partition_spec is None:
            return None
        return jax.tree.map(lambda _: cfg.partition_spec, input_batch)

    @nowrap
    def dispatch_config(self) -> DispatchConfig:
        """This feed's DispatchConfig: from `input_dispatcher`, else from the JAX processes."""
        if "input_dispatcher" in self.children:
            dispatcher = self.input_dispatcher
            index = dispatcher.logical_feed_index
            return DispatchConfig(
                shard_index=0 if index is None else index,
                num_shards=dispatcher.num_logical_feeds,
            )
        return DispatchConfig(shard_index=jax.process_index(), num_shards=jax.process_count())

    @nowrap
    def build_dataset(self, dispatch_config: DispatchConfig) -> Dataset:
        """Calls `source` with `dispatch_config`; returns its dataset."""
        return self._source(dispatch_config)

    @nowrap
    def dataset(self) -> Dataset:
        """Returns this feed's dataset of per-feed logical batches."""
        return self.build_dataset(self.dispatch_config())

    @nowrap
    def element_spec(self) -> Nested[jax.ShapeDtypeStruct]:
        """Returns the per-feed logical batch's shapes and dtypes (reads the first batch).

        To read no real data, build the source from `input_fake.fake_grain_source`.

        Raises:
            ValueError: If a leaf of the batch is not array-like (has no shape and dtype).
        """
        ds = self.dataset()
        batch = ds[0] if isinstance(ds, grain.MapDataset) else next(iter(ds))

        def spec(x: Any) -> jax.ShapeDtypeStruct:
            if not (hasattr(x, "shape") and hasattr(x, "dtype")):
                raise ValueError(
                    f"{self.path()}: element_spec() requires Tensor-like leaves (with shape and "
                    f"dtype), got {type(x).__name__} {x!r}; make the source yield NumPy arrays"
                )
            return jax.ShapeDtypeStruct(x.shape, x.dtype)

        return jax.tree.map(spec, batch)

    def __iter__(self) -> Iterator[Nested[Tensor]]:
        """Returns a checkpointable iterator of per-feed physical batches from the start."""
        return self._physical(GrainInputIterator(self, dispatch_config=self.dispatch_config()))

    @nowrap
    def batches(self, it: Iterator[Nested[Tensor]]) -> Iterator[Nested[Tensor]]:
        """Yields per-feed physical batches of `it` (`iter(self)` already yields them).

        Args:
            it: An iterator from `iter(self)`/`restore_iterator`, or of logical batches.

        Yields:
            Per-feed physical batches.
        """
        if isinstance(it, _PhysicalIterator):
            yield from it
        else:
            yield from super().batches(it)

    @nowrap
    def _physical(self, it: GrainInputIterator) -> Iterator[Nested[Tensor]]:
        return _PhysicalIterator(it, super().batches(it))

    @nowrap
    def iterator_state(self, it: Iterator[Nested[Tensor]]) -> bytes:
        """Returns the position of `it` (from `iter(self)`) as JSON bytes.

        Args:
            it: An iterator from `iter(self)` or `restore_iterator`.

        Returns:
            UTF-8 JSON (see the class docstring); Grain's state costs microseconds to take.
        """
        return it.logical.get_state()

    @nowrap
    def restore_iterator(
        self, states: Union[bytes, Sequence[bytes]], *, check_config: bool = True
    ) -> Iterator[Nested[Tensor]]:
        """Returns an iterator positioned where the saved one was.

        Args:
            states: This process's state (or a list of states; the first is used: any feed's
                state carries the global position used by an elastic resume).
            check_config: Whether to refuse a state saved by a differently configured input.

        Returns:
            The iterator (of per-feed physical batches).

        Raises:
            InputStateError: If the state cannot be restored here; the message says what to do.
        """
        what = f"Input '{self.path()}': the saved Grain state"
        if not isinstance(states, (bytes, bytearray, memoryview)):
            decoded = [decode_state(s, what=f"{what} {i}") for i, s in enumerate(states)]
            if not decoded:
                raise InputStateError(f"{what}: no states given; pass the saved states")
            keys = ("num_shards", "start_index", "batches_since_start", "rows_per_batch")
            positions = {tuple(d[k] for k in keys) for d in decoded}
            if len(positions) > 1:  # The global position would depend on which one is used.
                raise InputStateError(
                    f"{what}s disagree on the global position ({dict(zip(keys, zip(*positions)))});"
                    f" they were not saved at one step: {_STATE_FIX}"
                )
            states = states[0]
        state = decode_state(states, what=what, name=self.path())
        if check_config and state["signature"] != self._signature:
            raise InputStateError(
                f"Input '{self.path()}': the saved Grain state belongs to a differently "
                f"configured input (signature {state['signature']} != {self._signature}); "
                f"restore it with the config that saved it, pass check_config=False, or start "
                f"the input from the beginning"
            )
        dc = self.dispatch_config()
        if state["num_shards"] == dc.num_shards:
            if state["shard_index"] != dc.shard_index:
                raise InputStateError(
                    f"Input '{self.path()}': the state is feed {state['shard_index']}'s but this "
                    f"is feed {dc.shard_index} of {dc.num_shards}; restore each process from its "
                    f"own state"
                )
            dc = dataclasses.replace(dc, start_index=state["start_index"])
            it = GrainInputIterator(self, dispatch_config=dc)
            self._check_sources(state, it, what=what)
            it.set_grain_state(state)
            return self._physical(it)
        if not self.config.elastic_resume:
            raise InputStateError(
                f"Input '{self.path()}': the state was saved by {state['num_shards']} feeds but "
                f"this run has {dc.num_shards}; set {self.path()}.elastic_resume=True if each "
                f"batch row is one position of shard_dataset (see docs/inputs.md), or resume "
                f"with {state['num_shards']} feeds"
            )
        # decode_state guarantees rows_per_batch is an integer once a batch was read.
        rows = state["rows_per_batch"] if state["batches_since_start"] else 0
        start = state["start_index"] + state["batches_since_start"] * rows * state["num_shards"]
        dc = dataclasses.replace(dc, start_index=start)
        it = GrainInputIterator(self, dispatch_config=dc, num_batches=state["num_batches"])
        self._check_sources(state, it, what=what)
        return self._physical(it)

    @nowrap
    def _check_sources(self, state: dict, it: GrainInputIterator, *, what: str) -> None:
        """Refuses a state saved reading other files than `it` reads (version 1: unchecked)."""
        input_state_check.check_sources(state.get("sources"), it.sources, what=what, fix=_STATE_FIX)


class _PhysicalIterator:
    """Per-feed physical batches of a GrainInputIterator (`logical` holds the position)."""

    def __init__(self, logical: GrainInputIterator, physical: Iterator[Nested[Tensor]]):
        self.logical = logical
        self._physical = physical

    def __iter__(self) -> _PhysicalIterator:
        return self

    @property
    def num_batches(self) -> int:
        """The number of batches yielded so far."""
        return self.logical.num_batches

    def __next__(self) -> Nested[Tensor]:
        return next(self._physical)
