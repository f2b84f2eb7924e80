"""Classification metric layers re-exported by `axlearn.common.layers` (AXLearn's names).

Each layer's `forward(logits, *, labels, soft_labels=None)` returns a scalar loss averaged over
the live examples (labels >= 0; a negative label marks padding) and adds summaries:

- `ClassificationMetric` (softmax cross entropy, optional label smoothing or soft labels):
  "loss", "perplexity", "accuracy".
- `BinaryClassificationMetric` (sigmoid cross entropy over 0/1 labels of any shape, predictions
  `sigmoid(logits) > prediction_threshold`): "loss", "precision", "recall", "f1" (micro-averaged
  over all live labels).
- `CategoricalHingeLossMetric` (`max(0, max((1 - one_hot) * logits) - true_logit + 1)`):
  "loss".

`BaseClassificationHead` (logits from hidden states; `loss` applies one of these metrics) is
here too. Defined here to keep layers.py short; they report `axlearn.common.layers` as their module.
"""

from typing import Optional

import jax
from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.metrics import WeightedScalar
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, Tensor


def _masked_mean(values: Tensor, live: Tensor) -> tuple[Tensor, Tensor]:
    live = live.astype(jnp.float32)
    count = live.sum()
    return (values * live).sum() / jnp.maximum(count, 1.0), count


class BaseClassificationMetric(BaseLayer):
    """Base of the classification metric layers."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseClassificationMetric."""

        # The number of classes.
        num_classes: Required[int] = REQUIRED

    def forward(
        self, logits: Tensor, *, labels: Tensor, soft_labels: Optional[Tensor] = None
    ) -> Tensor:
        """Returns the loss and adds summaries (see the module docstring)."""
        raise NotImplementedError(type(self))


class ClassificationMetric(BaseClassificationMetric):
    """Softmax cross entropy with accuracy and perplexity summaries."""

    @config_class
    class Config(BaseClassificationMetric.Config):
        """Configures ClassificationMetric."""

        # Label smoothing in [0, 1): targets (1 - s) * one_hot + s / num_classes.
        label_smoothing: float = 0.0

    def forward(
        self, logits: Tensor, *, labels: Tensor, soft_labels: Optional[Tensor] = None
    ) -> Tensor:
        """Cross entropy of `logits` [..., num_classes] against `labels` [...] (or soft labels).

        Raises:
            ValueError: If both soft_labels and label_smoothing are given.
        """
        cfg = self.config
        if soft_labels is not None and cfg.label_smoothing:
            raise ValueError(
                f"{self.path()}: soft_labels cannot be combined with "
                f"label_smoothing={cfg.label_smoothing}; set label_smoothing=0"
            )
        logits = jnp.asarray(logits, jnp.float32)
        labels = jnp.asarray(labels)
        live = (labels >= 0) & (labels < cfg.num_classes)
        if soft_labels is not None:
            targets = jnp.asarray(soft_labels, jnp.float32)
        else:
            targets = jax.nn.one_hot(labels, cfg.num_classes, dtype=jnp.float32)
            if cfg.label_smoothing:
                targets = targets * (1 - cfg.label_smoothing) + (
                    cfg.label_smoothing / cfg.num_classes
                )
        per_example = -jnp.sum(targets * jax.nn.log_softmax(logits, axis=-1), axis=-1)
        loss, count = _masked_mean(per_example, live)
        accuracy, _ = _masked_mean(
            (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32), live
        )
        self.add_summary("loss", WeightedScalar(loss, count))
        self.add_summary("perplexity", WeightedScalar(jnp.exp(loss), count))
        self.add_summary("accuracy", WeightedScalar(accuracy, count))
        return loss


class BinaryClassificationMetric(BaseClassificationMetric):
    """Sigmoid cross entropy over 0/1 labels with precision/recall/F1 summaries."""

    @config_class
    class Config(BaseClassificationMetric.Config):
        """Configures BinaryClassificationMetric."""

        # Must be 2 (binary labels).
        num_classes: int = 2
        # A label is predicted positive when sigmoid(logit) > prediction_threshold.
        prediction_threshold: float = 0.5

    def __init__(self, cfg: Config, *, parent):
        super().__init__(cfg, parent=parent)
        if self.config.num_classes != 2:
            raise ValueError(
                f"{self.path()}: num_classes={self.config.num_classes}, but binary classification "
                "is only defined for two classes; set num_classes=2"
            )

    def forward(
        self, logits: Tensor, *, labels: Tensor, soft_labels: Optional[Tensor] = None
    ) -> Tensor:
        """Loss of `logits` against 0/1 `labels` of the same shape (negative labels: padding).

        Raises:
            ValueError: If soft_labels is given.
        """
        if soft_labels is not None:
            raise ValueError(
                f"{self.path()}: soft_labels for binary cross entropy must be None; pass 0/1 labels"
            )
        logits = jnp.asarray(logits, jnp.float32)
        labels = jnp.asarray(labels)
        live = labels >= 0
        targets = (labels == 1).astype(jnp.float32)
        per_label = jnp.maximum(logits, 0) - logits * targets + jnp.log1p(jnp.exp(-jnp.abs(logits)))
        loss, count = _masked_mean(per_label, live)
        preds = (jax.nn.sigmoid(logits) > self.config.prediction_threshold) & live
        positive = (labels == 1) & live
        tp = jnp.sum(preds & positive).astype(jnp.float32)
        predicted = jnp.sum(preds).astype(jnp.float32)
        actual = jnp.sum(positive).astype(jnp.float32)
        precision = jnp.where(predicted > 0, tp / jnp.maximum(predicted, 1.0), 0.0)
        recall = jnp.where(actual > 0, tp / jnp.maximum(actual, 1.0), 0.0)
        f1 = jnp.where(
            precision + recall > 0,
            2 * precision * recall / jnp.maximum(precision + recall, 1e-12),
            0.0,
        )
        self.add_summary("loss", WeightedScalar(loss, count))
        self.add_summary("precision", WeightedScalar(precision, predicted))
        self.add_summary("recall", WeightedScalar(recall, actual))
        self.add_summary("f1", WeightedScalar(f1, count))
        return loss


class CategoricalHingeLossMetric(BaseClassificationMetric):
    """Categorical hinge loss: max(0, max((1 - one_hot) * logits) - true logit + 1)."""

    def forward(
        self, logits: Tensor, *, labels: Tensor, soft_labels: Optional[Tensor] = None
    ) -> Tensor:
        """Hinge loss of `logits` [..., num_classes] against `labels` [...].

        Raises:
            ValueError: If soft_labels is given.
        """
        if soft_labels is not None:
            raise ValueError(
                f"{self.path()}: soft_labels for category hinge loss must be None; pass labels"
            )
        cfg = self.config
        logits = jnp.asarray(logits, jnp.float32)
        labels = jnp.asarray(labels)
        live = (labels >= 0) & (labels < cfg.num_classes)
        targets = jax.nn.one_hot(labels, cfg.num_classes, dtype=jnp.float32)
        # Keras' definition (as `loss.categorical_hinge_loss`): the wrong-class term is
        # max((1 - one_hot) * logits), so it is at least 0.
        true_logit = jnp.sum(targets * logits, axis=-1)
        wrong_logit = jnp.max((1.0 - targets) * logits, axis=-1)
        per_example = jnp.maximum(0.0, wrong_logit - true_logit + 1.0)
        loss, count = _masked_mean(per_example, live)
        self.add_summary("loss", WeightedScalar(loss, count))
        return loss


class BaseClassificationHead(BaseLayer):
    """Base of classification heads: `forward` gives logits, `loss` applies the `metric` layer."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures BaseClassificationHead."""

        input_dim: Required[int] = REQUIRED  # The hidden-state feature dim.
        num_classes: Required[int] = REQUIRED  # The number of classes.
        # The metric layer computing the loss (num_classes is set from the head's).
        metric: InstantiableConfig = ClassificationMetric.default_config()

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("metric", cfg.metric.set(num_classes=cfg.num_classes))

    def forward(self, input_batch: NestedTensor) -> Tensor:
        """Returns logits [..., num_classes] from `input_batch["hidden_states"]` [..., input_dim].

        Args:
            input_batch: A dict with "hidden_states" and the caller's other inputs.

        Returns:
            The logits.
        """
        raise NotImplementedError(type(self))

    def loss(
        self, *, logits: Tensor, target_labels: Tensor, soft_labels: Optional[Tensor] = None
    ) -> Tensor:
        """Returns the metric's scalar loss of `logits` against `target_labels`.

        Args:
            logits: [..., num_classes].
            target_labels: [...] ints; labels outside [0, num_classes) are not counted.
            soft_labels: Optional [..., num_classes] targets; `target_labels` then gives the mask.

        Returns:
            The scalar loss.
        """
        return self.metric(logits, labels=target_labels, soft_labels=soft_labels)


for _cls in (
    BaseClassificationHead,
    BaseClassificationMetric,
    ClassificationMetric,
    BinaryClassificationMetric,
    CategoricalHingeLossMetric,
):
    _cls.__module__ = "axlearn.common.layers"
