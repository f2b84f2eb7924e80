"""Grain dataset transformations of `axlearn.common.input_grain` (re-exported there).

`maybe_to_iter_dataset`, `rekey`, `unbatch` (with `RaggedTensor` leaves) and
`pad_for_evaluation`: each keeps Grain's checkpointing (an iterator's `get_state()`/`set_state()`
covers the transformation's position).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import grain
import jax
import numpy as np

Dataset = Union[grain.MapDataset, grain.IterDataset]


def maybe_to_iter_dataset(
    ds: Dataset, *, read_options: Optional[grain.ReadOptions] = None
) -> grain.IterDataset:
    """Converts a MapDataset to an IterDataset (an IterDataset is returned as is).

    Args:
        ds: The dataset.
        read_options: Grain's read options (threads reading ahead) for the conversion.

    Returns:
        An IterDataset.
    """
    if isinstance(ds, grain.MapDataset):
        return ds.to_iter_dataset(read_options)
    return ds


def _get_path(x: Any, path: str, separator: Optional[str]) -> Any:
    keys = path.split(separator) if separator else [path]
    for key in keys:
        x = x[key]
    return x


def _set_path(x: dict, path: str, value: Any, separator: Optional[str]):
    keys = path.split(separator) if separator else [path]
    for key in keys[:-1]:
        x = x.setdefault(key, {})
    x[keys[-1]] = value


def _copy_dicts(x: Any) -> Any:
    return {k: _copy_dicts(v) for k, v in x.items()} if isinstance(x, dict) else x


def rekey(
    ds: Dataset,
    *,
    key_map: Mapping[str, str],
    default_value: Any = "",
    retain_original_inputs: bool = False,
    separator: Optional[str] = None,
) -> Dataset:
    """Renames keys of every example: output key `k` takes the input's `key_map[k]`.

    Args:
        ds: A dataset of dicts.
        key_map: {new key: old key}; an empty or None old key yields `default_value`.
        default_value: The value of new keys whose old key is empty.
        retain_original_inputs: Whether to keep the original keys too.
        separator: If set, keys are paths into nested dicts split by it (e.g. "/").

    Returns:
        The re-keyed dataset (the input examples are not modified).
    """
    key_map = dict(key_map)

    def fn(example: dict) -> dict:
        out = _copy_dicts(example) if retain_original_inputs else {}
        for new, old in key_map.items():
            value = _get_path(example, old, separator) if old else default_value
            _set_path(out, new, value, separator)
        return out

    return ds.map(fn)


class RaggedTensor(list):
    """A batch of arrays of different shapes (a list of them), one per row, for `unbatch`.

    It is a pytree leaf (JAX does not flatten list subclasses): its batch size is its length,
    and `unbatch` yields its items as they are.
    """


class EmptyBatchError(ValueError, AssertionError):
    """`unbatch` met a batch of zero rows and `skip_empty_batch` is False."""


def _leaf_batch_size(leaf: Any) -> int:
    if isinstance(leaf, RaggedTensor):
        return len(leaf)
    shape = np.shape(leaf)
    if not shape:
        raise ValueError(
            f"unbatch: a leaf of shape () has no batch axis; every leaf needs a leading batch "
            f"axis (got {type(leaf).__name__})"
        )
    return shape[0]


def _batch_size_of(batch: Any) -> int:
    sizes = {_leaf_batch_size(leaf) for leaf in jax.tree.leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"unbatch: leaves have different batch sizes {sorted(sizes)}")
    return sizes.pop()


class _UnbatchIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, *, skip_empty_batch: bool):
        super().__init__(parent)
        self._skip_empty_batch = skip_empty_batch
        self._parent_state = parent.get_state()
        self._batch = None
        self._index = 0
        self._size = 0

    def __next__(self):
        while self._index >= self._size:
            self._parent_state = self._parent.get_state()
            self._batch = next(self._parent)
            self._index = 0
            if not jax.tree.leaves(self._batch):
                self._size = 0  # A batch without leaves (e.g. {}) has no rows.
                continue
            self._size = _batch_size_of(self._batch)
            if self._size == 0 and not self._skip_empty_batch:
                raise EmptyBatchError(
                    "unbatch: got a batch of 0 rows, (index, batch size) = (0, 0); pass "
                    "skip_empty_batch=True to skip empty batches"
                )
        i = self._index
        self._index += 1
        return jax.tree.map(lambda x: x[i], self._batch)

    def get_state(self) -> dict:
        if self._index >= self._size:
            return {"parent": self._parent.get_state(), "index": 0}
        return {"parent": self._parent_state, "index": self._index}

    def set_state(self, state: dict):
        self._parent.set_state(state["parent"])
        self._parent_state = state["parent"]
        self._batch, self._size, self._index = None, 0, 0
        if state["index"]:
            self._batch = next(self._parent)
            self._size = _batch_size_of(self._batch)
            self._index = state["index"]


class _UnbatchIterDataset(grain.IterDataset):
    def __init__(self, parent: grain.IterDataset, *, skip_empty_batch: bool):
        super().__init__(parent)
        self._skip_empty_batch = skip_empty_batch

    def __iter__(self) -> grain.DatasetIterator:
        return _UnbatchIterator(self._parent.__iter__(), skip_empty_batch=self._skip_empty_batch)


def unbatch(ds: Dataset, *, skip_empty_batch: bool = False) -> grain.IterDataset:
    """Splits each batch (leading axis of every leaf) into examples.

    A leaf may be a `RaggedTensor` (a list of per-row arrays of any shapes). A batch without
    leaves (e.g. `{}`) yields nothing.

    Args:
        ds: A dataset of batches (a MapDataset is converted to an IterDataset).
        skip_empty_batch: Whether a batch of 0 rows yields nothing; if False, it raises.

    Returns:
        An IterDataset of examples (checkpointable mid-batch).

    Raises:
        EmptyBatchError: (when iterated; a ValueError) On a batch of 0 rows, unless
            `skip_empty_batch`.
        ValueError: (when iterated) If a batch's leaves have different batch sizes.
    """
    return _UnbatchIterDataset(maybe_to_iter_dataset(ds), skip_empty_batch=skip_empty_batch)


class _AppendIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, extra: list):
        super().__init__(parent)
        self._extra = extra
        self._num_extra = 0

    def __next__(self):
        if self._num_extra == 0:
            try:
                return next(self._parent)
            except StopIteration:
                pass
        if self._num_extra >= len(self._extra):
            raise StopIteration
        self._num_extra += 1
        return self._extra[self._num_extra - 1]

    def get_state(self) -> dict:
        return {"parent": self._parent.get_state(), "num_extra": self._num_extra}

    def set_state(self, state: dict):
        self._parent.set_state(state["parent"])
        self._num_extra = state["num_extra"]


class _AppendIterDataset(grain.IterDataset):
    def __init__(self, parent: grain.IterDataset, extra: list):
        super().__init__(parent)
        self._extra = extra

    def __iter__(self) -> grain.DatasetIterator:
        return _AppendIterator(self._parent.__iter__(), self._extra)


def _zeros_like(example: Any) -> Any:
    return jax.tree.map(lambda x: np.zeros_like(np.asarray(x)), example)


def pad_for_evaluation(
    ds: Dataset,
    *,
    per_feed_batch_size: int,
    pad_example_fn: Callable[[Any], Any] = _zeros_like,
    max_num_examples: int = 64_000,
) -> Dataset:
    """Appends padding examples so the number of examples is a multiple of the batch size.

    Args:
        ds: A finite dataset of examples.
        per_feed_batch_size: The batch size to pad to a multiple of.
        pad_example_fn: Maps the first example to a padding example (default: zeros like it).
        max_num_examples: An IterDataset is counted by iterating it; more examples than this
            raise (an infinite dataset cannot be padded).

    Returns:
        The padded dataset (a MapDataset stays one).

    Raises:
        ValueError: If counting exceeds `max_num_examples`.
    """
    if isinstance(ds, grain.MapDataset):
        n = len(ds)
        first = ds[0] if n else None
    else:
        n, first = 0, None
        for example in ds:
            if n == 0:
                first = example
            n += 1
            if n > max_num_examples:
                raise ValueError(
                    f"pad_for_evaluation: stopped counting after {max_num_examples} examples "
                    f"(max_num_examples); an evaluation dataset must be finite, or raise "
                    f"max_num_examples"
                )
    num_pad = (-n) % per_feed_batch_size if n else 0
    pads = [pad_example_fn(first) for _ in range(num_pad)]
    if not pads:
        return ds
    if isinstance(ds, grain.MapDataset):
        return grain.MapDataset.concatenate([ds, grain.MapDataset.source(pads)])
    return _AppendIterDataset(ds, pads)


class _ProportionalSliceMapDataset(grain.MapDataset):
    """The positions p of a MapDataset with `range_start <= p % period < range_end`, in order."""

    def __init__(self, parent: grain.MapDataset, *, range_start: int, range_end: int, period: int):
        super().__init__(parent)
        if not 0 <= range_start < range_end <= period:
            raise ValueError(
                f"shard_dataset_with_proportion: range_start={range_start}, "
                f"range_end={range_end}, period={period} are invalid; need "
                f"0 <= range_start < range_end <= period."
            )
        self._range_start = range_start
        self._width = range_end - range_start
        self._period = period
        full_periods, rest = divmod(len(parent), period)
        # Each full period contributes `width` positions; the partial one those below `rest`.
        self._length = full_periods * self._width + max(0, min(rest, range_end) - range_start)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        if self._length == 0:
            raise IndexError("shard_dataset_with_proportion: the shard is empty.")
        index %= self._length  # As Grain's MapDatasets do, e.g. after `.repeat()`.
        period_index, offset = divmod(index, self._width)
        return self._parent[period_index * self._period + self._range_start + offset]

    def __str__(self) -> str:
        return (
            f"_ProportionalSliceMapDataset[{self._range_start}:"
            f"{self._range_start + self._width}:{self._period}]"
        )


def shard_dataset_with_proportion(
    ds: grain.MapDataset, *, range_start: int, range_end: int, period: int
) -> grain.MapDataset:
    """Returns the positions `[range_start + period * n, range_end + period * n)` of `ds`.

    For feeds with unequal shares: with total weight `period`, a feed with the weights
    `[range_start, range_end)` takes that proportion of every `period` consecutive examples
    (e.g. 0..30 and 30..100 of period 100 split a dataset 30/70).

    Args:
        ds: A MapDataset.
        range_start: The first position of each period taken (inclusive).
        range_end: The end of the positions taken in each period (exclusive).
        period: The period.

    Returns:
        The sliced MapDataset.

    Raises:
        ValueError: If `ds` is not a MapDataset or not 0 <= range_start < range_end <= period.
    """
    if not isinstance(ds, grain.MapDataset):
        raise ValueError(
            f"shard_dataset_with_proportion: got a {type(ds).__name__}; shard a MapDataset "
            f"(before maybe_to_iter_dataset/prefetch_dataset)"
        )
    return _ProportionalSliceMapDataset(
        ds, range_start=range_start, range_end=range_end, period=period
    )
