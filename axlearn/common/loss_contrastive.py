"""Contrastive losses computed from features (AXLearn's `axlearn.common.loss` names).

- `asymmetric_contrastive_loss_from_features(queries, positive_keys, *, negative_keys, ...)`:
  query i's positive is key i; the other positives and the non-padded negatives are negatives.
- `symmetric_contrastive_loss_from_features(x, y, *, x_negatives, y_negatives, ...)`: the mean of
  the x-to-y and y-to-x asymmetric losses.

- `contrastive_logits(x, y)`: the similarity logits x @ y.T.
- `asymmetric_contrastive_loss_from_logits`, `symmetric_contrastive_loss_from_logits`: the
  losses from precomputed logits (the `..._from_features` variants build them with
  `contrastive_logits`).

`axlearn.common.loss` re-exports every name here, so `from axlearn.common.loss import ...` works
as in AXLearn.
"""

from __future__ import annotations

from typing import Optional, Union

import jax.numpy as jnp
import optax

Tensor = jnp.ndarray

# Added to logits of padded keys in contrastive losses.
NEG_INF = -1e15


def contrastive_logits(x: Tensor, y: Tensor) -> Tensor:
    """Similarity logits x @ y.T.

    Args:
        x: [num_x, dim].
        y: [num_y, dim].

    Returns:
        [num_x, num_y].

    Raises:
        ValueError: If the inputs are not 2-D or their feature sizes differ.
    """
    if x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"x and y must be 2-D, got {x.shape} and {y.shape}.")
    if x.shape[1] != y.shape[1]:
        raise ValueError("`x[1]` and `y[1]` must have the same feature size!")
    return jnp.einsum("id,jd->ij", x, y)


def asymmetric_contrastive_loss_from_logits(
    logits: Tensor,
    *,
    key_paddings: Optional[Tensor] = None,
    temperature: Union[Tensor, float] = 1.0,
    soft_labels: Optional[Tensor] = None,
) -> Tensor:
    """Cross entropy of each query i against all non-padded keys, key i being its positive.

    Args:
        logits: [num_queries, num_keys], num_queries <= num_keys.
        key_paddings: Optional 0/1 [num_keys] (1: padded key, excluded).
        temperature: Logits are divided by it.
        soft_labels: Optional [num_queries, num_keys] targets instead of the identity.

    Returns:
        The scalar loss.
    """
    logits = logits / temperature
    num_queries, num_keys = logits.shape
    if key_paddings is None:
        key_paddings = jnp.zeros(num_keys)
    logits = logits + key_paddings * NEG_INF
    if soft_labels is not None:
        if soft_labels.shape != logits.shape:
            raise ValueError(
                f"soft_labels has a shape of {soft_labels.shape} while logits has a shape of "
                f"{logits.shape}!"
            )
        soft_labels = soft_labels * (1 - key_paddings)
    # Softmax cross entropy in float32, averaged over the queries (as `loss.cross_entropy`).
    logits = logits.astype(jnp.float32)
    if soft_labels is None:
        per_query = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(num_queries))
    else:
        per_query = optax.softmax_cross_entropy(logits, soft_labels.astype(jnp.float32))
    return per_query.mean()


def symmetric_contrastive_loss_from_logits(
    x_y_logits: Tensor,
    y_x_logits: Tensor,
    *,
    y_as_key_paddings: Optional[Tensor] = None,
    x_as_key_paddings: Optional[Tensor] = None,
    temperature: Union[float, Tensor] = 1.0,
    y_as_key_soft_labels: Optional[Tensor] = None,
    x_as_key_soft_labels: Optional[Tensor] = None,
) -> Tensor:
    """The mean of the asymmetric contrastive losses in both directions.

    Args:
        x_y_logits: [num_x, num_y_keys].
        y_x_logits: [num_y, num_x_keys].
        y_as_key_paddings: Optional 0/1 [num_y_keys].
        x_as_key_paddings: Optional 0/1 [num_x_keys].
        temperature: Logits are divided by it.
        y_as_key_soft_labels: Optional soft labels for x_y_logits.
        x_as_key_soft_labels: Optional soft labels for y_x_logits.

    Returns:
        The scalar loss.
    """
    a = asymmetric_contrastive_loss_from_logits(
        x_y_logits,
        key_paddings=y_as_key_paddings,
        temperature=temperature,
        soft_labels=y_as_key_soft_labels,
    )
    b = asymmetric_contrastive_loss_from_logits(
        y_x_logits,
        key_paddings=x_as_key_paddings,
        temperature=temperature,
        soft_labels=x_as_key_soft_labels,
    )
    return (a + b) / 2.0


def _check_2d(name: str, x: Tensor):
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D [num, feature_size], got shape {x.shape}.")


def _keys_and_paddings(
    positives: Tensor,
    negatives: Optional[Tensor],
    negative_paddings: Optional[Tensor],
    *,
    negatives_name: str,
) -> tuple[Tensor, Tensor]:
    """Stacks positive and negative keys and their 0/1 paddings (positives are never padded)."""
    paddings = jnp.zeros(positives.shape[0])
    if negatives is None:
        if negative_paddings is not None:
            raise ValueError(f"{negatives_name} paddings are given without {negatives_name}.")
        return positives, paddings
    _check_2d(negatives_name, negatives)
    if negatives.shape[1] != positives.shape[1]:
        raise ValueError(
            f"{negatives_name} has feature size {negatives.shape[1]}, positives have "
            f"{positives.shape[1]}."
        )
    if negative_paddings is None:
        negative_paddings = jnp.zeros(negatives.shape[0])
    if negative_paddings.shape != (negatives.shape[0],):
        raise ValueError(
            f"{negatives_name} paddings must have shape ({negatives.shape[0]},), got "
            f"{negative_paddings.shape}."
        )
    keys = jnp.concatenate([positives, negatives], axis=0)
    paddings = jnp.concatenate([paddings, negative_paddings.astype(paddings.dtype)], axis=0)
    return keys, paddings


def asymmetric_contrastive_loss_from_features(
    queries: Tensor,
    positive_keys: Tensor,
    *,
    negative_keys: Optional[Tensor] = None,
    negative_key_paddings: Optional[Tensor] = None,
    temperature: Union[Tensor, float] = 1.0,
    soft_labels: Optional[Tensor] = None,
) -> Tensor:
    """Contrastive loss of queries against positive keys and optional negative keys.

    The keys are `positive_keys` followed by `negative_keys`; the logits are `queries @ keys.T`
    divided by `temperature`, and query i is scored by softmax cross entropy with key i as its
    target (or against `soft_labels`), padded negative keys excluded.

    Args:
        queries: [num_queries, feature_size].
        positive_keys: [num_queries, feature_size]; row i is query i's positive.
        negative_keys: Optional [num_negative_keys, feature_size].
        negative_key_paddings: Optional 0/1 [num_negative_keys] (1: padded, excluded).
        temperature: The logits are divided by it.
        soft_labels: Optional targets of shape [num_queries, num_keys] (num_keys counts positive
            and negative keys) used instead of the identity.

    Returns:
        The scalar loss.

    Raises:
        ValueError: If shapes are inconsistent.
    """
    _check_2d("queries", queries)
    _check_2d("positive_keys", positive_keys)
    if queries.shape[0] != positive_keys.shape[0]:
        raise ValueError(
            f"queries and positive_keys must have the same number of rows, got {queries.shape} "
            f"and {positive_keys.shape}."
        )
    keys, key_paddings = _keys_and_paddings(
        positive_keys, negative_keys, negative_key_paddings, negatives_name="negative_keys"
    )
    return asymmetric_contrastive_loss_from_logits(
        contrastive_logits(queries, keys),
        key_paddings=key_paddings,
        temperature=temperature,
        soft_labels=soft_labels,
    )


def symmetric_contrastive_loss_from_features(
    x: Tensor,
    y: Tensor,
    *,
    x_negatives: Optional[Tensor] = None,
    y_negatives: Optional[Tensor] = None,
    x_negative_paddings: Optional[Tensor] = None,
    y_negative_paddings: Optional[Tensor] = None,
    temperature: Union[Tensor, float] = 1.0,
    y_as_key_soft_labels: Optional[Tensor] = None,
    x_as_key_soft_labels: Optional[Tensor] = None,
) -> Tensor:
    """The mean of the x-to-y and y-to-x contrastive losses from features.

    x-to-y: each row of `x` is a query whose keys are `y` followed by the non-padded
    `y_negatives`, row i of `y` its positive; y-to-x likewise with `x` and `x_negatives`.

    Args:
        x: [num_positives, feature_size].
        y: [num_positives, feature_size]; row i pairs with row i of `x`.
        x_negatives: Optional [num_x_negatives, feature_size], extra keys for the y-to-x loss.
        y_negatives: Optional [num_y_negatives, feature_size], extra keys for the x-to-y loss.
        x_negative_paddings: Optional 0/1 [num_x_negatives] (1: padded, excluded).
        y_negative_paddings: Optional 0/1 [num_y_negatives] (1: padded, excluded).
        temperature: The logits are divided by it.
        y_as_key_soft_labels: Optional [num_positives, num_positives + num_y_negatives] targets
            for the x-to-y loss.
        x_as_key_soft_labels: Optional [num_positives, num_positives + num_x_negatives] targets
            for the y-to-x loss.

    Returns:
        The scalar loss.

    Raises:
        ValueError: If shapes are inconsistent.
    """
    _check_2d("x", x)
    _check_2d("y", y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {x.shape} and {y.shape}.")
    y_keys, y_as_key_paddings = _keys_and_paddings(
        y, y_negatives, y_negative_paddings, negatives_name="y_negatives"
    )
    x_keys, x_as_key_paddings = _keys_and_paddings(
        x, x_negatives, x_negative_paddings, negatives_name="x_negatives"
    )
    return symmetric_contrastive_loss_from_logits(
        contrastive_logits(x, y_keys),
        contrastive_logits(y, x_keys),
        y_as_key_paddings=y_as_key_paddings,
        x_as_key_paddings=x_as_key_paddings,
        temperature=temperature,
        y_as_key_soft_labels=y_as_key_soft_labels,
        x_as_key_soft_labels=x_as_key_soft_labels,
    )
