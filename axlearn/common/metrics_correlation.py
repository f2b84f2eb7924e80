"""Correlation metrics in JAX (AXLearn's `axlearn.common.metrics_correlation`).

- `matthews_corrcoef`: the (multiclass, weighted) Matthews correlation coefficient of labels and
  predictions, as scikit-learn's `matthews_corrcoef`;
- `pearson_corrcoef`: the weighted Pearson correlation of two vectors (weights may be a 0/1 mask);
- `spearman_corrcoef`: Spearman's rank correlation (Pearson's of the tie-averaged ranks), with
  an optional mask of the entries to rank;
- `_rankdata`: scipy's `rankdata(method="average")`.

Every function keeps static shapes, so that it runs under `jax.jit`. Each adds `eps` under the
square root of its denominator: where a variance is 0 (constant labels or predictions), the
result is 0 instead of NaN.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.utils import Tensor

__all__ = ["matthews_corrcoef", "pearson_corrcoef", "spearman_corrcoef"]


def _dense_class_ids(values: Tensor, *, size: int) -> Tensor:
    """Maps each entry of `values` to the index of its value among the sorted distinct values.

    Args:
        values: [n] class values (any numbers).
        size: A static upper bound on the number of distinct values (>= n works always).

    Returns:
        [n] int32 indices in [0, size).
    """
    # Padding with the largest value keeps the table sorted; 'left' finds a value's first copy.
    table = jnp.unique(values, size=size, fill_value=jnp.max(values))
    return jnp.searchsorted(table, values, side="left").astype(jnp.int32)


def matthews_corrcoef(
    y_true: Tensor, y_pred: Tensor, *, weight: Optional[Tensor] = None, eps: float = 1e-8
) -> Tensor:
    """The Matthews correlation coefficient (MCC) of multiclass predictions.

    With total weight s, correctly predicted weight c, and per class k the weight t_k of samples
    whose true class is k and p_k of those predicted as k:
    MCC = (c * s - sum_k t_k p_k) / sqrt((s^2 - sum_k p_k^2) * (s^2 - sum_k t_k^2)).
    Class values are arbitrary numbers (e.g. a prediction of -1 is a class of its own); the sums
    are computed from the normalized weights (s = 1), without a confusion matrix.

    Args:
        y_true: [batch_size] ground-truth classes.
        y_pred: [batch_size] predicted classes.
        weight: Optional [batch_size] sample weights; None: every sample counts 1.
        eps: Added under the square root of the denominator.

    Returns:
        A scalar float32 tensor in [-1, 1] (0 when either side has a single class).

    Raises:
        ValueError: If the inputs are not rank 1 or their shapes differ.
    """
    y_true, y_pred = jnp.asarray(y_true), jnp.asarray(y_pred)
    weight = jnp.ones(y_true.shape, jnp.float32) if weight is None else jnp.asarray(weight)
    if not y_true.ndim == y_pred.ndim == weight.ndim == 1:
        raise ValueError(
            "matthews_corrcoef: inputs should all be rank 1, got shapes "
            f"y_true={y_true.shape}, y_pred={y_pred.shape}, weight={weight.shape}."
        )
    if not y_true.shape == y_pred.shape == weight.shape:
        raise ValueError(
            "matthews_corrcoef: input shapes should be equal, got "
            f"y_true={y_true.shape}, y_pred={y_pred.shape}, weight={weight.shape}."
        )
    n = y_true.shape[0]
    both = jnp.concatenate([y_true, y_pred]).astype(jnp.float32)
    ids = _dense_class_ids(both, size=2 * n)
    true_ids, pred_ids = ids[:n], ids[n:]
    weight = weight.astype(jnp.float32)
    weight = weight / jnp.maximum(weight.sum(), jnp.finfo(jnp.float32).tiny)
    t = jax.ops.segment_sum(weight, true_ids, num_segments=2 * n)
    p = jax.ops.segment_sum(weight, pred_ids, num_segments=2 * n)
    s = t.sum()
    c = jnp.sum(jnp.where(true_ids == pred_ids, weight, 0.0))
    cov_true_pred = c * s - jnp.dot(t, p)
    cov_pred_pred = s * s - jnp.dot(p, p)
    cov_true_true = s * s - jnp.dot(t, t)
    return cov_true_pred * jax.lax.rsqrt(cov_true_true * cov_pred_pred + eps)


def pearson_corrcoef(
    x: Tensor, y: Tensor, *, eps: float = 1e-8, weight: Optional[Tensor] = None
) -> Tensor:
    """The weighted Pearson correlation coefficient of `x` and `y`.

    With weights w normalized to sum 1 (a 0/1 mask leaves the masked entries out):
    r = cov_w(x, y) / sqrt(var_w(x) * var_w(y) + eps). Unlike `jnp.corrcoef`, it is weighted;
    when every weight is 0, r is 0.

    Args:
        x: [batch_size] values.
        y: [batch_size] values.
        eps: Added under the square root of the denominator.
        weight: Optional [batch_size] sample weights; None: every sample counts 1.

    Returns:
        A scalar tensor in [-1, 1].

    Raises:
        ValueError: If the shapes of x, y and weight differ.
    """
    x = jnp.asarray(x).astype(jnp.float32)
    y = jnp.asarray(y).astype(jnp.float32)
    weight = jnp.ones_like(x) if weight is None else jnp.asarray(weight).astype(jnp.float32)
    if not x.shape == y.shape == weight.shape:
        raise ValueError(
            "pearson_corrcoef: input shapes should be equal, got "
            f"x={x.shape}, y={y.shape}, weight={weight.shape}."
        )
    # As AXLearn: a total weight below 1 is not scaled up (all-zero weights give 0).
    weight = weight / jnp.maximum(weight.sum(axis=-1), 1)
    dx = x - jnp.sum(weight * x, axis=-1)
    dy = y - jnp.sum(weight * y, axis=-1)
    cov = jnp.sum(weight * dx * dy, axis=-1)
    var_x = jnp.sum(weight * dx * dx, axis=-1)
    var_y = jnp.sum(weight * dy * dy, axis=-1)
    return cov * jax.lax.rsqrt(var_x * var_y + eps)


def _rankdata(x: Tensor) -> Tensor:
    """1-based ranks of `x`, ties getting the average of their ranks (scipy's "average").

    A value whose copies occupy sorted positions [l, r) gets rank (l + 1 + r) / 2.

    Args:
        x: [batch_size] values.

    Returns:
        [batch_size] float32 ranks.
    """
    x = jnp.asarray(x)
    ordered = jnp.sort(x)
    first = jnp.searchsorted(ordered, x, side="left")
    end = jnp.searchsorted(ordered, x, side="right")
    return 0.5 * (first + 1 + end).astype(jnp.float32)


def spearman_corrcoef(
    x: Tensor, y: Tensor, *, eps: float = 1e-8, mask: Optional[Tensor] = None
) -> Tensor:
    """Spearman's rank correlation coefficient: Pearson's of the tie-averaged ranks.

    Masked entries are ranked as if they were not there (they are ranked below every other entry
    and get weight 0 in the correlation).

    Args:
        x: [batch_size] values.
        y: [batch_size] values.
        eps: Added under the square root of the denominator.
        mask: Optional [batch_size] 0/1 (or boolean) mask of the entries to include.

    Returns:
        A scalar tensor in [-1, 1].

    Raises:
        ValueError: If the shapes of x, y and mask differ.
    """
    x, y = jnp.asarray(x), jnp.asarray(y)
    if x.shape != y.shape:
        raise ValueError(
            f"spearman_corrcoef: input shapes should be equal, got x={x.shape} and y={y.shape}."
        )
    if mask is not None:
        mask = jnp.asarray(mask)
        if mask.shape != x.shape:
            raise ValueError(
                "spearman_corrcoef: input shapes should be equal, got "
                f"x={x.shape} and mask={mask.shape}."
            )
        live = mask != 0
        x = jnp.where(live, x.astype(jnp.float32), -jnp.inf)
        y = jnp.where(live, y.astype(jnp.float32), -jnp.inf)
        mask = live.astype(jnp.float32)
    return pearson_corrcoef(_rankdata(x), _rankdata(y), eps=eps, weight=mask)
