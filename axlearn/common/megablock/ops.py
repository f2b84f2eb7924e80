"""Grouped matmul: rows of `lhs`, sorted by group, times their group's matrix of `rhs`.

`gmm(lhs [m, k], rhs [g, k, n], group_sizes [g])` returns [m, n] where rows
[sum(group_sizes[:i]), sum(group_sizes[:i+1])) are multiplied by rhs[i]; rows past
sum(group_sizes) are 0. Ours runs on `jax.lax.ragged_dot` on every backend (AXLearn's uses a Pallas
kernel on TPU/GPU); `tiling` (tm, tk, tn) only sets the row padding: lhs is padded to a multiple of
min(tm, padded rows) so small batches (decoding) work with large tiles.
"""

from collections.abc import Callable
from typing import Optional, Union

import jax
import jax.numpy as jnp

from axlearn.common.utils import Tensor

Tiling = tuple[int, int, int]


def select_tiling_fn(
    *, tiling_larger_k: Tiling, tiling_larger_n: Tiling
) -> Callable[[int, int, int], Tiling]:
    """Returns fn(m, k, n) -> tiling: `tiling_larger_k` when k >= n, else `tiling_larger_n`.

    Args:
        tiling_larger_k: (tm, tk, tn) for the input projections (k = model dim >= n).
        tiling_larger_n: (tm, tk, tn) for the output projection.

    Returns:
        The tiling selector.
    """

    def select(m: int, k: int, n: int) -> Tiling:
        del m
        return tuple(tiling_larger_k if k >= n else tiling_larger_n)

    return select


def resolve_tiling(
    tiling: Union[Tiling, Callable[[int, int, int], Tiling]], *, m: int, k: int, n: int
) -> Tiling:
    """The (tm, tk, tn) of `tiling` (a tuple or a selector) for an [m, k] x [k, n] product."""
    if callable(tiling):
        tiling = tiling(m, k, n)
    if len(tiling) != 3 or any(int(t) <= 0 for t in tiling):
        raise ValueError(f"gmm tiling must be 3 positive ints (tm, tk, tn), got {tiling}")
    return tuple(int(t) for t in tiling)


def gmm(
    lhs: Tensor,
    rhs: Tensor,
    group_sizes: Tensor,
    *,
    tiling: Union[Tiling, Callable[[int, int, int], Tiling]] = (128, 128, 128),
    preferred_element_type: Optional[jnp.dtype] = None,
    interpret: bool = False,
) -> Tensor:
    """Grouped matmul (see the module docstring).

    Args:
        lhs: [m, k], rows sorted by group.
        rhs: [g, k, n].
        group_sizes: Int [g], summing to at most m.
        tiling: (tm, tk, tn) or a selector fn(m, k, n) (see `select_tiling_fn`).
        preferred_element_type: The output dtype (default: lhs.dtype).
        interpret: Accepted for AXLearn compatibility (the kernel is not a Pallas call here).

    Returns:
        [m, n].
    """
    del interpret
    m, k = lhs.shape
    tm, _, _ = resolve_tiling(tiling, m=m, k=k, n=rhs.shape[-1])
    tm = max(1, min(tm, m))
    pad = (-m) % tm
    if pad:
        lhs = jnp.pad(lhs, ((0, pad), (0, 0)))
    out = jax.lax.ragged_dot(
        lhs,
        rhs,
        group_sizes.astype(jnp.int32),
        preferred_element_type=preferred_element_type or lhs.dtype,
    )
    return out[:m]
