"""Classification metrics in JAX (AXLearn's `axlearn.common.metrics_classification`).

Confusion matrices, precision / recall / F-beta, the binary classifier curve (true and false
positives per threshold), precision-recall and ROC curves, ROC AUC and the Brier score. All
functions keep static shapes so that they run under `jax.jit`: where scikit-learn drops tied or
zero-weight thresholds, these functions keep one entry per sample (see `binary_clf_curve`).
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from axlearn.common.metrics import MetricSummary, WeightedSummary
from axlearn.common.utils import Tensor


def _safe_divide(num: Tensor, den: Tensor) -> Tensor:
    """`num / den` where `den != 0`, else 0 (no NaN in either branch)."""
    nonzero = den != 0
    return jnp.where(nonzero, num / jnp.where(nonzero, den, 1), 0)


def confusion_matrix(
    y_true: Tensor, y_pred: Tensor, *, num_classes: int, weight: Optional[Tensor] = None
) -> Tensor:
    """The (weighted) confusion matrix of integer labels and predictions.

    Args:
        y_true: [batch] ground-truth classes in [0, num_classes).
        y_pred: [batch] predicted classes in [0, num_classes).
        num_classes: The number of classes.
        weight: Optional [batch] sample weights; None: every sample counts 1.

    Returns:
        C [num_classes, num_classes], where C[i, j] is the total weight of the samples with true
        class i and predicted class j (samples with a class outside [0, num_classes) are left
        out). Its dtype is the weight's (int32 counts when `weight` is None).

    Raises:
        ValueError: If the inputs are not all 1-D or their shapes differ.
    """
    y_true, y_pred = jnp.asarray(y_true), jnp.asarray(y_pred)
    weight = jnp.ones(y_true.shape, dtype=jnp.int32) if weight is None else jnp.asarray(weight)
    if not y_true.ndim == y_pred.ndim == weight.ndim == 1:
        raise ValueError(
            "Inputs should all be rank 1, got shapes "
            f"y_true={y_true.shape}, y_pred={y_pred.shape}, weight={weight.shape}."
        )
    if not y_true.shape == y_pred.shape == weight.shape:
        raise ValueError(
            "Input shapes should be equal, got "
            f"y_true={y_true.shape}, y_pred={y_pred.shape}, weight={weight.shape}."
        )
    rows, cols = y_true.astype(jnp.int32), y_pred.astype(jnp.int32)
    in_range = (rows >= 0) & (rows < num_classes) & (cols >= 0) & (cols < num_classes)
    weight = jnp.where(in_range, weight, 0)
    # Out-of-range samples have weight 0; clipping keeps negative indices from wrapping around.
    rows, cols = jnp.clip(rows, 0, num_classes - 1), jnp.clip(cols, 0, num_classes - 1)
    flat = jnp.zeros((num_classes * num_classes,), dtype=weight.dtype)
    flat = flat.at[rows * num_classes + cols].add(weight)
    return flat.reshape(num_classes, num_classes)


def precision_recall_f_score(
    y_true: Tensor,
    y_pred: Tensor,
    *,
    beta: float = 1.0,
    eps: float = 1e-8,
    weight: Optional[Tensor] = None,
) -> dict[str, MetricSummary]:
    """Precision, recall and F-beta score of the positive class (1) in binary classification.

    precision = TP / (TP + FP), recall = TP / (TP + FN) (0 when the denominator is 0), and
    f_score = (1 + beta^2) * P * R / (beta^2 * P + R + eps). Precision and recall come as
    `WeightedSummary`s weighted by their denominators, so that summing them over batches gives
    the precision and recall of the union.

    Args:
        y_true: [batch] ground truth in {0, 1}.
        y_pred: [batch] predictions in {0, 1}.
        beta: Recall counts beta times as much as precision (1: the F1 score). Must be > 0.
        eps: Added to the F-score's denominator, so that P = R = 0 gives 0.
        weight: Optional [batch] sample weights; None: every sample counts 1.

    Returns:
        A dict: "precision" (WeightedSummary(precision, TP + FP)), "recall"
        (WeightedSummary(recall, TP + FN)) and "f_score" (a scalar tensor in [0, 1]).

    Raises:
        ValueError: If beta is not positive.
    """
    if beta <= 0:
        raise ValueError(f"beta must be positive, got beta={beta}.")
    mat = confusion_matrix(y_true, y_pred, num_classes=2, weight=weight)
    tp = mat[1, 1]
    predicted_positive = tp + mat[0, 1]
    actual_positive = tp + mat[1, 0]
    precision = _safe_divide(tp, predicted_positive)
    recall = _safe_divide(tp, actual_positive)
    beta2 = beta**2
    f = (1 + beta2) * precision * recall / (beta2 * precision + recall + eps)
    return dict(
        precision=WeightedSummary(precision, predicted_positive),
        recall=WeightedSummary(recall, actual_positive),
        f_score=f,
    )


def f_score(
    y_true: Tensor,
    y_pred: Tensor,
    *,
    beta: float = 1.0,
    eps: float = 1e-8,
    weight: Optional[Tensor] = None,
) -> Tensor:
    """The F-beta score of the positive class; see `precision_recall_f_score`.

    Args:
        y_true: [batch] ground truth in {0, 1}.
        y_pred: [batch] predictions in {0, 1}.
        beta: Recall counts beta times as much as precision (> 0).
        eps: Added to the denominator.
        weight: Optional [batch] sample weights.

    Returns:
        A scalar tensor in [0, 1].

    Raises:
        ValueError: If beta is not positive.
    """
    return precision_recall_f_score(y_true, y_pred, beta=beta, eps=eps, weight=weight)["f_score"]


def _max_of(dtype) -> Tensor:
    """The largest finite value of `dtype` (int or float)."""
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(jnp.iinfo(dtype).max, dtype)
    return jnp.asarray(jnp.finfo(dtype).max, dtype)


def binary_clf_curve(
    y_true: Tensor,
    y_score: Tensor,
    *,
    weight: Optional[Tensor] = None,
) -> dict[str, Tensor]:
    """True and false positives when predicting positive for `score >= threshold`.

    The samples are sorted by descending score; entry i is for the threshold of the i-th score.
    Unlike scikit-learn (which keeps one entry per distinct score), tied scores keep one entry
    each (static shapes), all with the counts of the whole tie. Samples of weight 0 (e.g.
    padding) are moved to the end with threshold `finfo(float32).max`: ignore those entries.

    Args:
        y_true: [num_samples] ground truth in {0, 1}.
        y_score: [num_samples] predicted scores.
        weight: Optional [num_samples] sample weights >= 0; None: every sample counts 1.

    Returns:
        A dict of [num_samples] tensors: "fps" and "tps", the (weighted) false and true positives
        at each threshold (non-decreasing), and "thresholds" (non-increasing over the samples of
        non-zero weight).
    """
    y_true, y_score = jnp.asarray(y_true), jnp.asarray(y_score)
    if weight is None:
        weight = jnp.ones(y_score.shape, dtype=jnp.float32)
        order = jnp.argsort(-y_score, stable=True)
        thresholds = y_score[order]
    else:
        weight = jnp.asarray(weight)
        keep = weight != 0
        # Sort by (kept first, then descending score).
        order = jnp.lexsort((-y_score, ~keep))
        thresholds = jnp.where(
            keep[order], y_score[order], jnp.finfo(jnp.float32).max.astype(y_score.dtype)
        )
    y_true, weight = y_true[order], weight[order]
    tps = jnp.cumsum(y_true * weight)
    fps = jnp.cumsum((1 - y_true) * weight)
    # The last entry of each run of equal thresholds holds the counts of the whole run; give
    # them to the run's other entries (counts only grow, so a reverse cumulative min does it).
    run_end = jnp.concatenate([thresholds[1:] != thresholds[:-1], jnp.ones((1,), dtype=bool)])
    tps = jax.lax.cummin(jnp.where(run_end, tps, _max_of(tps.dtype)), reverse=True)
    fps = jax.lax.cummin(jnp.where(run_end, fps, _max_of(fps.dtype)), reverse=True)
    return dict(fps=fps, tps=tps, thresholds=thresholds)


def precision_recall_curve(
    y_true: Tensor, y_score: Tensor, *, weight: Optional[Tensor] = None
) -> dict[str, Tensor]:
    """Precision and recall of binary classification at every threshold, thresholds ascending.

    Entry i is for predicting positive when `score >= thresholds[i]`. Unlike scikit-learn, no
    extra (precision 1, recall 0) point is appended, tied and zero-weight entries are kept (see
    `binary_clf_curve`; the zero-weight ones come first, with threshold `finfo(float32).max`),
    and when there is no positive sample, recall is 0 (scikit-learn: 1).

    Args:
        y_true: [num_samples] ground truth in {0, 1}.
        y_score: [num_samples] predicted scores.
        weight: Optional [num_samples] sample weights >= 0; None: every sample counts 1.

    Returns:
        A dict of [num_samples] tensors: "precisions" and "recalls" in [0, 1], and "thresholds".
    """
    curve = binary_clf_curve(y_true=y_true, y_score=y_score, weight=weight)
    tps, fps = curve["tps"], curve["fps"]
    precision = _safe_divide(tps, tps + fps)
    recall = _safe_divide(tps, jnp.broadcast_to(tps[-1], tps.shape))
    return dict(
        precisions=precision[::-1], recalls=recall[::-1], thresholds=curve["thresholds"][::-1]
    )


def roc_curve(
    y_true: Tensor,
    y_score: Tensor,
    sample_weight: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The receiver operating characteristic curve: FPR and TPR over descending thresholds.

    Starts at (0, 0); tied and zero-weight samples repeat points (see `binary_clf_curve`), which
    leaves the area under the curve unchanged. Without negatives (positives), FPR (TPR) is NaN,
    as in scikit-learn.

    Args:
        y_true: [num_samples] ground truth in {0, 1}.
        y_score: [num_samples] predicted scores.
        sample_weight: Optional [num_samples] sample weights >= 0; None: every sample counts 1.

    Returns:
        (fpr, tpr), each [num_samples + 1] in [0, 1].
    """
    curve = binary_clf_curve(y_true=y_true, y_score=y_score, weight=sample_weight)
    zero = jnp.zeros((1,), dtype=curve["tps"].dtype)
    tps = jnp.concatenate([zero, curve["tps"]])
    fps = jnp.concatenate([zero, curve["fps"]])
    return fps / fps[-1], tps / tps[-1]


def _trapezoid(y: Tensor, x: Tensor) -> Tensor:
    """The trapezoidal integral of y over x."""
    return jnp.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2)


def binary_classification_roc_auc_score(
    y_true: Tensor,
    y_score: Tensor,
    sample_weight: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The area under the ROC curve (ROC AUC) of a binary classifier.

    Labels other than 0 and 1 fail a `checkify.check` (raised eagerly; under `jax.jit`, wrap
    the function with `checkify.checkify`).

    Args:
        y_true: [num_samples] ground truth in {0, 1}.
        y_score: [num_samples] predicted scores.
        sample_weight: Optional [num_samples] sample weights >= 0; None: every sample counts 1.

    Returns:
        (score, valid_input): the AUC in [0, 1], and whether it could be computed (False when
        the samples of non-zero weight do not hold both labels, or a label is not 0 or 1;
        the score is then 0).
    """
    y_true, y_score = jnp.asarray(y_true), jnp.asarray(y_score)
    binary = jnp.all((y_true == 0) | (y_true == 1))
    checkify.check(binary, "y_true can only be 0 or 1!")
    counted = jnp.ones(y_true.shape, bool) if sample_weight is None else sample_weight > 0
    positives = jnp.sum(jnp.where(counted, y_true, 0))
    negatives = jnp.sum(jnp.where(counted, 1 - y_true, 0))
    valid = binary & (positives > 0) & (negatives > 0)

    def auc():
        fpr, tpr = roc_curve(y_true, y_score, sample_weight)
        return _trapezoid(tpr, fpr).astype(jnp.float32)

    score = jax.lax.cond(valid, auc, lambda: jnp.zeros((), jnp.float32))
    return score, valid


def brier_score(labels: Tensor, logits: Tensor) -> Tensor:
    """The Brier score: the squared distance between the softmax and the one-hot label.

    brier[b] = sum_k (softmax(logits[b])[k] - (k == labels[b]))^2, in [0, 2].

    Args:
        labels: [batch] classes in [0, num_classes).
        logits: [batch, num_classes] prediction logits.

    Returns:
        [batch] float32 scores.
    """
    probs = jax.nn.softmax(jnp.asarray(logits).astype(jnp.float32), axis=-1)
    one_hot = jax.nn.one_hot(labels, probs.shape[-1], dtype=jnp.float32)
    return jnp.sum(jnp.square(probs - one_hot), axis=-1)
