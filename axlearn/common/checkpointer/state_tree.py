"""State trees as checkpoints see them: leaf paths, leaf kinds, dtypes and zarr specs."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import threading
import zlib
from typing import Any

import jax
import numpy as np
from jax import numpy as jnp

from axlearn.common.checkpointer import layout
from axlearn.common.utils import TensorSpec

# Python values stored inline in the index.
VALUE_TYPES = (bool, int, float, str)


def is_state_leaf(x: Any) -> bool:
    """Leaves of a target tree: arrays, array specs and host values (not containers)."""
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct, TensorSpec, np.ndarray, np.generic))


def flatten_state(state: Any) -> tuple[list[tuple[str, Any]], Any]:
    """Flattens `state` into (disk path, leaf) pairs in `jax.tree_util` order, and its treedef.

    Args:
        state: A pytree.

    Returns:
        (pairs, treedef).

    Raises:
        ValueError: If a leaf path cannot name a file, or two leaves map to the same path.
    """
    keyed, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_state_leaf)
    pairs = []
    seen = set()
    for keys, leaf in keyed:
        disk_path = layout.validate_leaf_path("/".join(_key_str(k) for k in keys))
        if disk_path in seen:
            raise ValueError(f"Two state leaves have the same checkpoint path {disk_path!r}")
        seen.add(disk_path)
        pairs.append((disk_path, leaf))
    return pairs, treedef


def _key_str(key: Any) -> str:
    """The path component of a pytree key, as in `axlearn.common.utils.flatten_items`."""
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def dtype_name(dtype: Any) -> str:
    """Returns the numpy name of a dtype ('float32', 'bfloat16', ...)."""
    return np.dtype(dtype).name


def parse_dtype(name: str) -> np.dtype:
    """Returns the dtype named `name` (including ml_dtypes such as bfloat16)."""
    return np.dtype(jnp.dtype(name))


def zarr_dtype(dtype: np.dtype) -> str:
    """Returns the zarr v2 dtype string TensorStore expects ('<f4', 'bfloat16', ...)."""
    dtype = np.dtype(dtype)
    return dtype.name if dtype.str[1] == "V" else dtype.str


def zarr_spec(path: str, *, shape, dtype, chunk_shape) -> dict:
    """Returns the TensorStore spec of an uncompressed zarr v2 array on the local filesystem.

    Args:
        path: The array directory.
        shape: The array shape.
        dtype: The numpy dtype.
        chunk_shape: The chunk shape (entries of 0 become 1).

    Returns:
        The spec dict.
    """
    return {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": path},
        "metadata": {
            "shape": [int(d) for d in shape],
            "chunks": [max(1, int(c)) for c in chunk_shape],
            "dtype": zarr_dtype(dtype),
            "compressor": None,
            "filters": None,
            "fill_value": None,
            "order": "C",
            "dimension_separator": ".",
            "zarr_format": 2,
        },
    }


def zarr_metadata_json(*, shape, dtype, chunk_shape) -> bytes:
    """Returns the `.zarray` file of `zarr_spec`'s array, byte for byte as TensorStore writes it.

    Args:
        shape: The array shape.
        dtype: The numpy dtype.
        chunk_shape: The chunk shape (entries of 0 become 1).

    Returns:
        The JSON bytes (sorted keys, no spaces).
    """
    return _zarr_metadata_json(
        tuple(int(d) for d in shape), np.dtype(dtype), tuple(int(c) for c in chunk_shape)
    )


@functools.lru_cache(maxsize=4096)
def _zarr_metadata_json(shape: tuple, dtype: np.dtype, chunk_shape: tuple) -> bytes:
    # Cached: every save writes the same few dozen files, and this runs in the background
    # writer, whose Python work competes with the training loop for the GIL.
    metadata = zarr_spec("", shape=shape, dtype=dtype, chunk_shape=chunk_shape)["metadata"]
    return json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode("utf-8")


try:  # ISA-L's CRC-32 is zlib's checksum (same values), computed with carry-less multiply.
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same values.
    _crc32 = zlib.crc32


def crc32(data: Any, value: int = 0) -> int:
    """Returns the zlib-compatible CRC-32 of a bytes-like object, continuing from `value`.

    Args:
        data: A bytes-like object (e.g. a uint8 array or a memoryview).
        value: The CRC-32 of the bytes before `data` (0 at the start).

    Returns:
        The CRC-32 of the bytes so far, as an int.
    """
    return _crc32(data, value)


def crc32_hex(data: Any) -> str:
    """Returns the CRC-32 of an array's bytes (C order) or of a bytes object, as 8 hex digits.

    Args:
        data: An array (any dtype; its C-order bytes are checksummed) or a bytes-like object.

    Returns:
        The zlib-compatible CRC-32 as 8 lowercase hex digits.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        return f"{_crc32(data):08x}"
    flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return f"{_crc32(flat):08x}"


# Guards the creation of the shared I/O thread pools below.
_pool_lock = threading.Lock()


# Shared thread pools by name: "io" for chunk reads (16 threads), "write" for chunk writes (8),
# separate so that a save's lowered thread priority never slows a restore.
_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_POOL_WORKERS = {"io": 16, "write": 8}


def _submit(pool: str, fn, *args) -> concurrent.futures.Future:
    with _pool_lock:
        if pool not in _pools:
            _pools[pool] = concurrent.futures.ThreadPoolExecutor(
                max_workers=_POOL_WORKERS[pool], thread_name_prefix=f"axlearn_checkpoint_{pool}"
            )
    return _pools[pool].submit(fn, *args)


def submit_io(fn, *args) -> concurrent.futures.Future:
    """Runs `fn(*args)` on the shared thread pool for file reads (which release the GIL).

    Args:
        fn: The function.
        *args: Its arguments.

    Returns:
        The future of its result.
    """
    return _submit("io", fn, *args)


def submit_write(fn, *args) -> concurrent.futures.Future:
    """Runs `fn(*args)` on the shared thread pool for chunk writes.

    Args:
        fn: The function.
        *args: Its arguments.

    Returns:
        The future of its result.
    """
    return _submit("write", fn, *args)


Region = tuple[tuple[int, int], ...]


def normalize_index(index: tuple, shape: tuple[int, ...]) -> Region:
    """Returns ((start, stop), ...) of a tuple of slices over an array of `shape`."""
    result = []
    for i, dim in enumerate(shape):
        s = index[i] if i < len(index) else slice(None)
        start, stop, step = s.indices(dim)
        if step != 1:
            raise ValueError(f"Strided shard index {index} is not supported")
        result.append((start, stop))
    return tuple(result)


def region_shape(region: Region) -> tuple[int, ...]:
    """Returns the shape of a region."""
    return tuple(b - a for a, b in region)
