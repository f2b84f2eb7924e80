"""Loss functions (AXLearn's `axlearn.common.loss` names and signatures).

- `cross_entropy(logits, target_labels, *, live_targets, z_loss_scale, label_smoothing,
  soft_target_labels)`: softmax cross entropy averaged over live targets, plus a z-loss.
- `binary_cross_entropy`, `sigmoid_cross_entropy_with_logits`: sigmoid cross entropy.
- `mean_squared_error`, `bilinear_mean_squared_error`, `l1_loss`: weighted means, returned as
  `metrics.WeightedSummary`.
- `contrastive_logits`, `asymmetric_contrastive_loss_from_logits`,
  `symmetric_contrastive_loss_from_logits` and their `..._from_features` variants: contrastive
  losses, defined in `loss_contrastive` and re-exported here (as is `NEG_INF`).
- `categorical_hinge_loss`; `ReductionMethod` with `_reduce_loss`.

Losses compute in float32 when given bfloat16/float16 inputs.
"""

from __future__ import annotations

import enum
from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.metrics import WeightedSummary

Tensor = jnp.ndarray


class ReductionMethod(str, enum.Enum):  # noqa: UP042 (AXLearn's str+Enum semantics)
    """How `_reduce_loss` reduces a per-element loss."""

    NONE = "none"
    SUM = "sum"
    MEAN = "mean"


def _reduce_loss(
    *,
    loss: Tensor,
    reduction: ReductionMethod,
    sample_weight: Optional[Tensor],
    eps: float = 1e-6,
) -> Tensor:
    """Reduces a per-element loss, weighting elements by `sample_weight` if given.

    MEAN with weights divides the weighted sum by the sum of `sample_weight` as given (AXLearn's
    convention: a [batch, 1] weight counts once per row, not once per broadcast element; its
    magnitude at least eps).

    Args:
        loss: A float tensor.
        reduction: NONE (returns the weighted loss), SUM or MEAN.
        sample_weight: Optional weights broadcastable to `loss`.
        eps: Smallest magnitude of the weight sum.

    Returns:
        The reduced loss (a scalar unless NONE).
    """
    if sample_weight is not None:
        loss = loss * sample_weight
    if reduction == ReductionMethod.NONE:
        return loss
    if reduction == ReductionMethod.SUM:
        return jnp.sum(loss)
    if sample_weight is None:
        return jnp.mean(loss)
    total = jnp.sum(sample_weight)
    sign = jnp.where(total < 0, -1.0, 1.0)
    return jnp.sum(loss) / (sign * jnp.maximum(jnp.abs(total), eps))


def _one_hot_with_label_smoothing(
    labels: Tensor, num_classes: int, label_smoothing: float = 0.0
) -> Tensor:
    if num_classes < 1:
        raise ValueError("num classes should be at least 1.")
    if label_smoothing < 0 or label_smoothing > 1:
        raise ValueError("label_smoothing should be in the range [0, 1].")
    one_hot = jax.nn.one_hot(labels, num_classes)
    return one_hot * (1 - label_smoothing) + label_smoothing / num_classes


def cross_entropy(
    logits: Tensor,
    target_labels: Tensor,
    *,
    live_targets: Optional[Tensor] = None,
    z_loss_scale: float = 0.0,
    label_smoothing: float = 0.0,
    soft_target_labels: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Softmax cross entropy averaged over the live targets, plus an optional z-loss.

    Per position, with targets t (one-hot of `target_labels`, label-smoothed, or
    `soft_target_labels`) and log_z = logsumexp(logits): ce = -sum(t * log_softmax(logits)) and
    z = z_loss_scale * log_z ** 2. The loss is sum(live * (ce + z)) / max(1, sum(live)).
    Computation is in float32.

    Args:
        logits: Float tensor [..., num_classes].
        target_labels: Int tensor [...]. With soft targets, used only to infer live targets.
        live_targets: Optional tensor broadcastable to [...] (bool, 0/1 or float weights): which
            positions count, and how much. None: the positions with 0 <= label < num_classes.
        z_loss_scale: Scale of the auxiliary z-loss (>= 0; 0 disables it).
        label_smoothing: In [0, 1]: targets become one_hot * (1 - s) + s / num_classes.
        soft_target_labels: Optional targets [..., num_classes] (already smoothed / soft).
        mask: Our earlier name for `live_targets` (give at most one of them).

    Returns:
        (loss, aux). aux has AXLearn's keys: total_loss (= loss), cross_entropy_loss (mean ce),
        per_target_loss (ce + z per position, [...]), accuracy (live-weighted argmax accuracy);
        and ours: cross_entropy (= cross_entropy_loss), z_loss (mean *scaled* z-loss; AXLearn's
        z_loss is unscaled), pre_mask_loss (= per_target_loss), num_targets (sum of live).

    Raises:
        ValueError: If z_loss_scale < 0, label_smoothing is outside [0, 1] or set together with
            soft_target_labels, or both mask and live_targets are given.
    """
    if z_loss_scale < 0:
        raise ValueError("z_loss_scale should not be negative.")
    if mask is not None and live_targets is not None:
        raise ValueError("Give at most one of mask and live_targets (mask is its old name).")
    if live_targets is None:
        live_targets = mask
    logits = logits.astype(jnp.float32)
    num_classes = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    if soft_target_labels is not None or label_smoothing != 0:
        if soft_target_labels is not None:
            if label_smoothing != 0:
                raise ValueError("Label smoothing should be set to 0 if soft labels are used.")
            targets = soft_target_labels.astype(jnp.float32)
        else:
            targets = _one_hot_with_label_smoothing(target_labels, num_classes, label_smoothing)
        per_token_ce = log_z * targets.sum(-1) - (targets * logits).sum(-1)
    else:
        valid = (target_labels >= 0) & (target_labels < num_classes)
        safe_labels = jnp.where(valid, target_labels, 0)
        target_logits = jnp.take_along_axis(logits, safe_labels[..., None], axis=-1)[..., 0]
        per_token_ce = log_z - target_logits
    if live_targets is None:
        live_targets = (target_labels >= 0) & (target_labels < num_classes)
    live = jnp.broadcast_to(live_targets, per_token_ce.shape).astype(jnp.float32)
    per_token_z = z_loss_scale * jnp.square(log_z)
    num_targets = live.sum()
    denom = jnp.maximum(1.0, num_targets)
    ce = (per_token_ce * live).sum() / denom
    z_loss = (per_token_z * live).sum() / denom
    loss = ce + z_loss
    per_target_loss = per_token_ce + per_token_z
    accuracy = (jnp.equal(jnp.argmax(logits, axis=-1), target_labels) * live).sum() / denom
    return loss, dict(
        total_loss=loss,
        cross_entropy_loss=ce,
        per_target_loss=per_target_loss,
        accuracy=accuracy,
        cross_entropy=ce,
        z_loss=z_loss,
        pre_mask_loss=per_target_loss,
        num_targets=num_targets,
    )


def sigmoid_cross_entropy_with_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """Elementwise sigmoid cross entropy, stable for large |logits|.

    max(x, 0) - x * t + log(1 + exp(-|x|)) (= -t log sigmoid(x) - (1 - t) log(1 - sigmoid(x))).

    Args:
        logits: Float tensor.
        targets: Targets in [0, 1], same shape.

    Returns:
        The per-element loss.
    """
    return jnp.maximum(logits, 0) - targets * logits + jnp.log1p(jnp.exp(-jnp.abs(logits)))


def binary_cross_entropy(
    logits: Tensor, *, target_labels: Tensor, live_targets: Optional[Tensor] = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sigmoid cross entropy averaged over live targets.

    Args:
        logits: Float tensor [...].
        target_labels: 0/1 tensor of the same shape.
        live_targets: Optional tensor broadcastable to [...] (bool, 0/1 or float weights).
            None: the positions with 0 <= label < 2.

    Returns:
        (loss, aux) with aux keys binary_cross_entropy_loss and per_target_loss.
    """
    if logits.dtype in (jnp.bfloat16, jnp.float16):
        logits = logits.astype(jnp.float32)
    per_target = sigmoid_cross_entropy_with_logits(logits, target_labels)
    if live_targets is None:
        live_targets = (target_labels >= 0) & (target_labels < 2)
    live = jnp.broadcast_to(live_targets, per_target.shape).astype(per_target.dtype)
    loss = (per_target * live).sum() / jnp.maximum(live.sum(), 1)
    return loss, dict(binary_cross_entropy_loss=loss, per_target_loss=per_target)


def _weighted_mean(
    arr: Tensor, *, sample_weight: Optional[Tensor] = None, eps: float = 1e-7
) -> WeightedSummary:
    """The `sample_weight`-weighted mean of `arr` (weights' shape a prefix of arr's)."""
    if sample_weight is None:
        sample_weight = jnp.array(1.0)
    sample_weight = jnp.asarray(sample_weight)
    while sample_weight.ndim < arr.ndim:
        sample_weight = sample_weight[..., None]
    sample_weight = jnp.broadcast_to(sample_weight, arr.shape)
    total = sample_weight.sum()
    return WeightedSummary(jnp.sum(sample_weight * arr) / jnp.maximum(total, eps), total)


def mean_squared_error(
    preds: Tensor, targets: Tensor, sample_weight: Optional[Tensor] = None, eps: float = 1e-7
) -> WeightedSummary:
    """Mean squared error, weighted per sample.

    Args:
        preds: Float tensor.
        targets: Float tensor of the same shape.
        sample_weight: Optional weights whose shape is a prefix of `targets`'.
        eps: Smallest total weight divided by.

    Returns:
        WeightedSummary(mean loss, total weight) (0 and 0 when nothing is weighted).
    """
    return _weighted_mean((preds - targets) ** 2, sample_weight=sample_weight, eps=eps)


def bilinear_mean_squared_error(
    preds: Tensor,
    targets: Tensor,
    *,
    shape: tuple[int, ...],
    sample_weight: Optional[Tensor] = None,
    eps: float = 1e-7,
) -> WeightedSummary:
    """Mean squared error of `preds - targets` after resizing it bilinearly to `shape`.

    The difference is resized with `jax.image.resize(method="bilinear", antialias=False)`, then
    squared and averaged as in `mean_squared_error`.

    Args:
        preds: Float tensor.
        targets: Float tensor broadcastable with `preds`.
        shape: The shape to resize the difference to; it has one entry per dimension, and each
            entry is a whole multiple or a whole divisor of the corresponding input dimension.
        sample_weight: Optional weights whose shape is a prefix of `shape`.
        eps: Smallest total weight divided by.

    Returns:
        WeightedSummary(mean loss, total weight).

    Raises:
        ValueError: If `shape` has a different number of dimensions than the inputs.
        NotImplementedError: If a dimension of `shape` and the input's are not whole multiples of
            one another.
    """
    src_shape = jnp.broadcast_shapes(preds.shape, targets.shape)
    shape = tuple(shape)
    if len(shape) != len(src_shape):
        raise ValueError(
            f"shape must have one entry per dimension of (preds-targets), got {shape} for "
            f"{src_shape}."
        )
    for dim, new_dim in zip(src_shape, shape):
        if dim % new_dim != 0 and new_dim % dim != 0:
            raise NotImplementedError(
                "The dimensions in shape and (preds-targets).shape must be whole multiples of "
                f"one another, {src_shape} vs. {shape}"
            )
    diff = jax.image.resize(preds - targets, shape=shape, method="bilinear", antialias=False)
    return _weighted_mean(diff**2, sample_weight=sample_weight, eps=eps)


def l1_loss(
    preds: Tensor, targets: Tensor, sample_weight: Optional[Tensor] = None, eps: float = 1e-7
) -> WeightedSummary:
    """Mean absolute error, weighted per sample (see `mean_squared_error`).

    Args:
        preds: Float tensor.
        targets: Float tensor of the same shape.
        sample_weight: Optional weights whose shape is a prefix of `targets`'.
        eps: Smallest total weight divided by.

    Returns:
        WeightedSummary(mean loss, total weight).
    """
    return _weighted_mean(jnp.abs(preds - targets), sample_weight=sample_weight, eps=eps)


def categorical_hinge_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """max(0, max((1 - t) * logits) - sum(t * logits) + 1) over the last axis.

    Args:
        logits: [..., num_classes].
        targets: One-hot [..., num_classes].

    Returns:
        The per-example loss [...].
    """
    pos = jnp.sum(targets * logits, axis=-1)
    neg = jnp.amax((1.0 - targets) * logits, axis=-1)
    return jnp.maximum(0.0, neg - pos + 1.0)


def focal_loss(
    logits: Tensor,
    targets: Tensor,
    alpha: float = 0.25,
    gamma: float = 1.5,
    sample_weight: Optional[Tensor] = None,
) -> Tensor:
    """Sigmoid focal loss (https://arxiv.org/abs/1708.02002), summed.

    Per element: (1 - p_t) ** gamma * bce, weighted by alpha for positive targets and 1 - alpha
    for negative ones (p_t: the predicted probability of the true class).

    Args:
        logits: [..., num_classes].
        targets: One-hot (0/1) [..., num_classes].
        alpha: Weight of positive targets.
        gamma: Focusing exponent.
        sample_weight: Optional weights broadcastable to the per-element loss.

    Returns:
        The summed (weighted) loss, a float32 scalar.
    """
    logits = logits.astype(jnp.float32)
    targets = targets.astype(jnp.float32)
    positive = jnp.equal(targets, 1.0)
    bce = sigmoid_cross_entropy_with_logits(logits, targets)
    probs = jax.nn.sigmoid(logits)
    p_t = jnp.where(positive, probs, 1.0 - probs)
    loss = jnp.power(1.0 - p_t, gamma) * bce
    loss = jnp.where(positive, alpha * loss, (1.0 - alpha) * loss)
    if sample_weight is not None:
        loss = loss * sample_weight
    return jnp.sum(loss)


def huber_loss(
    *,
    predictions: Tensor,
    targets: Tensor,
    delta: float = 1.0,
    sample_weight: Optional[Tensor] = None,
    reduce_axis: Optional[int] = None,
    reduction: ReductionMethod = ReductionMethod.NONE,
) -> Tensor:
    """Huber loss: 0.5 e**2 for |e| <= delta, else delta * (|e| - 0.5 delta), e = pred - target.

    Args:
        predictions: Float tensor.
        targets: Float tensor of the same shape.
        delta: The quadratic-to-linear threshold.
        sample_weight: Optional weights (broadcastable to the loss after `reduce_axis`).
        reduce_axis: If set, the loss is first averaged over this axis (as Keras' Huber).
        reduction: See `_reduce_loss`.

    Returns:
        The loss (per element unless reduced).
    """
    err = jnp.abs(predictions - targets)
    quadratic = jnp.minimum(err, delta)
    loss = 0.5 * quadratic**2 + delta * (err - quadratic)
    if reduce_axis is not None:
        loss = jnp.mean(loss, axis=reduce_axis)
    return _reduce_loss(loss=loss, reduction=reduction, sample_weight=sample_weight)


def flops_loss(
    *, embeddings: Tensor, paddings: Optional[Tensor] = None, sparsity_threshold: float = 0.0
) -> tuple[Tensor, Tensor]:
    """The FLOPs regularizer (https://openreview.net/pdf?id=SygpC6Ntvr): sum_j mean_i(|a_ij|)**2.

    Args:
        embeddings: [batch, vocab] or [batch, 1, vocab].
        paddings: Optional 0/1 [batch] (1: padding example, left out).
        sparsity_threshold: Elements with |a| <= this count as sparse.

    Returns:
        (loss, average number of sparse elements per valid example).
    """
    if embeddings.ndim == 3:
        if embeddings.shape[1] != 1:
            raise ValueError(f"Invalid embeddings shape {embeddings.shape}!")
        embeddings = embeddings[:, 0]
    if paddings is None:
        paddings = jnp.zeros(embeddings.shape[0])
    valid = (1 - paddings)[:, None]
    num_valid = jnp.sum(valid)
    sparse = (jnp.abs(embeddings) <= sparsity_threshold).sum(-1, keepdims=True)
    avg_sparse = jnp.sum(sparse * valid) / num_valid
    per_dim = jnp.sum(jnp.abs(embeddings) * valid, axis=0) / num_valid
    return jnp.sum(per_dim**2), avg_sparse


def large_margin_cosine_loss(
    logits: Tensor,
    *,
    labels: Optional[Tensor] = None,
    soft_labels: Optional[Tensor] = None,
    alpha: float = 1.0,
    margin: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CosFace loss (https://arxiv.org/abs/1801.09414) on cosine logits.

    Cross entropy of alpha * (logits - margin * one_hot), averaged over examples with a label.

    Args:
        logits: Cosine similarities [..., num_classes].
        labels: Int labels [...] (out-of-range ones are ignored).
        soft_labels: Soft labels [..., num_classes] instead of `labels`.
        alpha: Inverse temperature.
        margin: The additive cosine margin.

    Returns:
        (loss, {"accuracy", "num_examples"}).

    Raises:
        ValueError: If neither labels nor soft_labels is given.
    """
    if labels is None and soft_labels is None:
        raise ValueError("Neither labels nor soft_labels provided!")
    num_classes = logits.shape[-1]
    one_hot = (
        jax.nn.one_hot(labels, num_classes, dtype=logits.dtype)
        if soft_labels is None
        else soft_labels
    )
    scaled = alpha * (logits - margin * one_hot)
    per_example = -jnp.sum(one_hot * jax.nn.log_softmax(scaled), axis=-1)
    num_examples = (one_hot.sum(axis=-1) > 0).sum()
    denom = jnp.maximum(1, num_examples)
    gt = jnp.argmax(one_hot, axis=-1) if labels is None else labels
    accuracy = jnp.equal(jnp.argmax(logits, axis=-1), gt).sum() / denom
    return per_example.sum() / denom, {"accuracy": accuracy, "num_examples": num_examples}


def giou_loss(
    *,
    predictions: Tensor,
    targets: Tensor,
    reduction: ReductionMethod = ReductionMethod.NONE,
    sample_weight: Optional[Tensor] = None,
    eps: float = 1e-7,
) -> Tensor:
    """1 - generalized IoU (https://arxiv.org/abs/1902.09630) of boxes (y1, x1, y2, x2).

    Args:
        predictions: [..., 4] boxes.
        targets: [..., 4] boxes.
        reduction: See `_reduce_loss`.
        sample_weight: Optional weights [...].
        eps: Added to denominators.

    Returns:
        The loss (per box unless reduced).
    """
    py1, px1, py2, px2 = jnp.moveaxis(predictions, -1, 0)
    ty1, tx1, ty2, tx2 = jnp.moveaxis(targets, -1, 0)
    iy1, ix1 = jnp.maximum(py1, ty1), jnp.maximum(px1, tx1)
    iy2, ix2 = jnp.minimum(py2, ty2), jnp.minimum(px2, tx2)
    inter = jnp.where((iy2 >= iy1) & (ix2 >= ix1), (iy2 - iy1) * (ix2 - ix1), 0.0)
    union = (py2 - py1) * (px2 - px1) + (ty2 - ty1) * (tx2 - tx1) - inter
    enclosing = (jnp.maximum(py2, ty2) - jnp.minimum(py1, ty1)) * (
        jnp.maximum(px2, tx2) - jnp.minimum(px1, tx1)
    )
    giou = inter / (union + eps) - (enclosing - union) / (enclosing + eps)
    return _reduce_loss(loss=1 - giou, reduction=reduction, sample_weight=sample_weight)


def _l2_normalize(x: Tensor, eps: float) -> Tensor:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def negative_cosine_similarity_loss(
    predictions: Tensor,
    targets: Tensor,
    *,
    normalize_embedding: bool = True,
    eps: float = 1e-8,
    live_targets: Optional[Tensor] = None,
    reduction: ReductionMethod = ReductionMethod.MEAN,
) -> tuple[Tensor, dict[str, Tensor]]:
    """-cos(predictions, targets) over the last axis, reduced over live positions.

    Args:
        predictions: [..., dim].
        targets: [..., dim].
        normalize_embedding: Whether to L2-normalize both first.
        eps: Added to the squared norms when normalizing.
        live_targets: Optional 0/1 [...] weights.
        reduction: See `_reduce_loss`.

    Returns:
        (loss, {"cosine_similarity": [...], "elementwise_similarity": [..., dim]}).
    """
    if normalize_embedding:
        targets = _l2_normalize(targets, eps)
        predictions = _l2_normalize(predictions, eps)
    elementwise = targets * predictions
    cosine = jnp.sum(elementwise, axis=-1)
    loss = -_reduce_loss(loss=cosine, reduction=reduction, sample_weight=live_targets)
    return loss, {"cosine_similarity": cosine, "elementwise_similarity": elementwise}


def kl_divergence(
    log_predictions: Tensor, targets: Tensor, *, is_log_targets: bool = False
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL(targets || predictions) over the last axis, averaged over examples.

    Args:
        log_predictions: Log-probabilities [..., dim].
        targets: Probabilities [..., dim] (or log-probabilities with `is_log_targets`).
        is_log_targets: Whether `targets` are log-probabilities.

    Returns:
        (mean loss, {"per_example_loss": [...]}).
    """
    if is_log_targets:
        loss = jnp.exp(targets) * (targets - log_predictions)
    else:
        safe_log = jnp.log(jnp.where(targets == 0, 1.0, targets))
        loss = targets * (safe_log - log_predictions)
    per_example = jnp.sum(loss, axis=-1)
    return jnp.mean(per_example), {"per_example_loss": per_example}


def koleo_loss(embeddings: Tensor, *, normalize_embedding: bool = True, eps: float = 1e-8):
    """KoLeo regularizer (https://arxiv.org/abs/1806.03198): -mean_i log(min_j!=i |x_i - x_j|).

    The nearest neighbour is the one with the largest inner product (exact for normalized
    embeddings); its distance is computed as torch's PairwiseDistance does (eps inside).

    Args:
        embeddings: [batch, dim].
        normalize_embedding: Whether to L2-normalize first.
        eps: For the normalization and the log.

    Returns:
        The scalar loss.
    """
    if normalize_embedding:
        embeddings = _l2_normalize(embeddings, eps)
    n = embeddings.shape[0]
    dots = embeddings @ embeddings.T
    dots = jnp.where(jnp.eye(n, dtype=bool), -1.0, dots)
    nearest = embeddings[jnp.argmax(dots, axis=-1)]
    distances = jnp.sqrt(jnp.sum((nearest - embeddings + eps) ** 2, axis=-1))
    return -jnp.mean(jnp.log(distances + eps))


def pairwise_loss(
    *, logits: Tensor, pair_weights: Tensor, loss_scale: Tensor
) -> tuple[Tensor, Tensor]:
    """Weighted mean of the sigmoid cross entropy of logit differences over document pairs.

    Args:
        logits: [batch, num_docs].
        pair_weights: [batch, num_docs, num_docs]; > 0 where doc i should outrank doc j.
        loss_scale: [batch] per-query scales.

    Returns:
        (mean loss, total pair weight).
    """
    deltas = logits[:, :, None] - logits[:, None, :]
    labels = jnp.greater(pair_weights, 0).astype(logits.dtype)
    values = sigmoid_cross_entropy_with_logits(deltas, labels)
    total = pair_weights.sum()
    mean = (values * pair_weights * loss_scale[:, None, None]).sum() / (1e-8 + total)
    return mean, total


def ranking_pairwise_loss(
    *, logits: Tensor, ranks: Tensor, loss_scale: Tensor
) -> tuple[Tensor, Tensor]:
    """`pairwise_loss` over the pairs of ranked docs (rank > 0) with rank_i < rank_j.

    Args:
        logits: [batch, num_docs].
        ranks: Int [batch, num_docs]; 1 is the most relevant, 0 unranked.
        loss_scale: [batch].

    Returns:
        (mean loss, number of pairs).
    """
    ranked = ranks > 0
    pairs = ranked[:, :, None] & ranked[:, None, :] & (ranks[:, :, None] < ranks[:, None, :])
    return pairwise_loss(
        logits=logits, pair_weights=pairs.astype(logits.dtype), loss_scale=loss_scale
    )


# Defined in their own module (one idea per file); importable from here as in AXLearn.
from axlearn.common.loss_contrastive import (  # noqa: E402, F401
    NEG_INF,
    asymmetric_contrastive_loss_from_features,
    asymmetric_contrastive_loss_from_logits,
    contrastive_logits,
    symmetric_contrastive_loss_from_features,
    symmetric_contrastive_loss_from_logits,
)
