"""Grain dataset transformations of `axlearn.common.input_grain` (re-exported there).

`maybe_to_iter_dataset`, `rekey`, `unbatch` and `pad_for_evaluation`: each keeps Grain's
checkpointing (an iterator's `get_state()`/`set_state()` covers the transformation's position).
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


def _batch_size_of(batch: Any) -> int:
    sizes = {np.shape(leaf)[0] for leaf in jax.tree.leaves(batch)}
    if len(sizes) != 1:
        raise ValueError(f"unbatch: leaves have different batch sizes {sorted(sizes)}")
    return sizes.pop()


class _UnbatchIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator):
        super().__init__(parent)
        self._parent_state = parent.get_state()
        self._batch = None
        self._index = 0
        self._size = 0

    def __next__(self):
        while self._index >= self._size:
            self._parent_state = self._parent.get_state()
            self._batch = next(self._parent)
            self._size = _batch_size_of(self._batch) if jax.tree.leaves(self._batch) else 0
            self._index = 0
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
    def __iter__(self) -> grain.DatasetIterator:
        return _UnbatchIterator(self._parent.__iter__())


def unbatch(ds: grain.IterDataset) -> grain.IterDataset:
    """Splits each batch (leading axis of every leaf) into examples; empty batches vanish.

    Args:
        ds: An IterDataset of batches.

    Returns:
        An IterDataset of examples (checkpointable mid-batch).
    """
    return _UnbatchIterDataset(maybe_to_iter_dataset(ds))


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
