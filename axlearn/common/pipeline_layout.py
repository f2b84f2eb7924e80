"""The data layouts of `axlearn.common.pipeline`: stacked chunk rows, microbatches, time steps.

Stacked parameters of a pipeline with S stages and V virtual stages have a leading axis of S * V
rows; row `r = s * V + v` holds chunk `c = v * S + s` (so the rows sharded onto device s are
chunks s, s + S, ..., s + (V - 1) S). A batch [B, ...] becomes M microbatches [M, B // M, ...]
of strided rows. Re-exported by `axlearn.common.pipeline`.
"""

import numpy as np
from jax import numpy as jnp

from axlearn.common.utils import Tensor


def _chunk_layout(num_stages: int, num_virtual_stages: int) -> np.ndarray:
    """chunk_of_row[r] = the chunk held by stacked row r = s * V + v, i.e. v * S + s."""
    s, v = np.meshgrid(np.arange(num_stages), np.arange(num_virtual_stages), indexing="ij")
    return (v * num_stages + s).reshape(-1)


def chunk_order_to_rows(x: Tensor, *, num_stages: int, num_virtual_stages: int) -> Tensor:
    """Reorders a leading chunk axis (chunk c = v * S + s) into the stacked row order (s * V + v).

    Args:
        x: [S * V, ...], indexed by chunk.
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        [S * V, ...], indexed by stacked row.
    """
    return x[_chunk_layout(num_stages, num_virtual_stages)]


def rows_to_chunk_order(x: Tensor, *, num_stages: int, num_virtual_stages: int) -> Tensor:
    """The inverse of `chunk_order_to_rows`.

    Args:
        x: [S * V, ...], indexed by stacked row.
        num_stages: S.
        num_virtual_stages: V.

    Returns:
        [S * V, ...], indexed by chunk.
    """
    return x[np.argsort(_chunk_layout(num_stages, num_virtual_stages))]


def transpose_to_pipeline_stage_inputs(x: Tensor) -> Tensor:
    """Layer-major [N, M, ...] to pipeline-major [M + N - 1, N, ...] (GPipe time steps).

    Args:
        x: [N, M, ...], x[i, j] the input of layer (stage) i for microbatch j.

    Returns:
        y: [M + N - 1, N, ...] with y[i + j, i] == x[i, j] (zeros elsewhere): stage i sees
        microbatch j at time step i + j.
    """
    n, m = x.shape[:2]
    t = np.arange(m + n - 1)[:, None] - np.arange(n)[None, :]  # [T, N] microbatch index.
    valid = (t >= 0) & (t < m)
    y = x[np.arange(n)[None, :], np.clip(t, 0, m - 1)]
    mask = jnp.asarray(valid).reshape(valid.shape + (1,) * (x.ndim - 2))
    return jnp.where(mask, y, jnp.zeros_like(y))


def transpose_from_pipeline_stage_outputs(x: Tensor) -> Tensor:
    """Pipeline-major [M + N - 1, N, ...] to layer-major [N, M, ...].

    Args:
        x: [T = M + N - 1, N, ...], x[t, i] the output of stage i at time step t.

    Returns:
        y: [N, M, ...] with y[i, j] == x[i + j, i].
    """
    t, n = x.shape[:2]
    m = t - n + 1
    i = np.arange(n)[:, None]
    return x[i + np.arange(m)[None, :], i]


def _to_microbatches(x: Tensor, num_microbatches: int) -> Tensor:
    """[B, ...] -> [M, B // M, ...]; microbatch m holds rows m, m + M, m + 2M, ...

    Strided rows keep each device's batch shard within every microbatch (no resharding when
    the batch axis is sharded over data/fsdp).
    """
    b = x.shape[0]
    return jnp.swapaxes(x.reshape(b // num_microbatches, num_microbatches, *x.shape[1:]), 0, 1)


def _from_microbatches(x: Tensor) -> Tensor:
    """The inverse of `_to_microbatches`: [M, B // M, ...] -> [B, ...]."""
    return jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:])


__all__ = [
    "chunk_order_to_rows",
    "rows_to_chunk_order",
    "transpose_from_pipeline_stage_outputs",
    "transpose_to_pipeline_stage_inputs",
]
