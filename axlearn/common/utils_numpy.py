"""Conversion of (nested) tensors of any framework to NumPy arrays.

Re-exported from `axlearn.common.utils` (AXLearn's home of `as_numpy_array`). TensorFlow is never
imported here: a TensorFlow tensor is recognized by its `numpy()` method.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def _leaf_to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (int, float, bool, complex, np.number, np.bool_)):
        return np.asarray(x)
    if isinstance(x, jax.Array):
        return np.asarray(x)
    numpy_fn = getattr(x, "numpy", None)
    if callable(numpy_fn):  # A TensorFlow (or torch CPU) tensor.
        return np.asarray(numpy_fn())
    raise NotImplementedError(
        f"as_numpy_array: cannot convert a {type(x).__name__} ({x!r:.80}) to a NumPy array; "
        "pass numbers, NumPy/JAX arrays or TensorFlow tensors"
    )


def as_numpy_array(x: Any) -> Any:
    """Converts every leaf of a nested structure to a NumPy array.

    Python numbers become 0-d arrays (`1` -> `np.array(1)`, int64 on 64-bit platforms), NumPy
    arrays are returned as they are, JAX arrays are copied to host and TensorFlow tensors are
    converted with `.numpy()`. Dicts, lists and tuples keep their structure.

    Args:
        x: A (nested) structure of numbers and tensors.

    Returns:
        The same structure with NumPy array leaves.

    Raises:
        NotImplementedError: If a leaf cannot be converted.
    """
    return jax.tree.map(_leaf_to_numpy, x)
