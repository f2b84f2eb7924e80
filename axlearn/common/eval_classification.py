"""Classification evaluation over a whole eval set (AXLearn's `axlearn.common.eval_classification`).

`PrecisionRecallMetricCalculator` collects every batch's targets and scores, then reports per
label, from the precision-recall curve of the whole set (`metrics_classification.
precision_recall_curve`):
- `<label>_recall@p<100 * level>`: for each precision level, the recall at the threshold whose
  precision is the lowest one >= the level, and `..._threshold` that threshold;
- `<label>_precision@r<100 * level>`: for each recall level, the precision at the threshold
  whose recall is the lowest one >= the level, and `..._threshold`.
When no threshold reaches a level, the metric is -1 (its threshold: that of the curve's first
entry). Examples with a negative target (in any label) are padding and left out.
"""

from collections.abc import Sequence
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from axlearn.common.config import REQUIRED, Required, config_class
from axlearn.common.evaler import GlobalMetricCalculator
from axlearn.common.metrics_classification import precision_recall_curve
from axlearn.common.utils import NestedTensor, Tensor


def _at_level(
    *, achieved: Tensor, reported: Tensor, thresholds: Tensor, level: float
) -> tuple[Tensor, Tensor]:
    """The `reported` value and threshold where `achieved` is the smallest value >= `level`.

    Args:
        achieved: [n] the curve's values compared with the level (e.g. precisions).
        reported: [n] the curve's values reported there (e.g. recalls).
        thresholds: [n] the curve's thresholds (`finfo(float32).max` marks no threshold).
        level: The target level.

    Returns:
        (reported value, or -1 where no entry reaches the level; its threshold).
    """
    big = jnp.finfo(jnp.float32).max
    ok = jnp.logical_and(achieved >= level, thresholds != big)
    index = jnp.argmin(jnp.where(ok, achieved, big))
    return jnp.where(ok, reported, -1)[index], thresholds[index]


class PrecisionRecallMetricCalculator(GlobalMetricCalculator):
    """Recall at precision levels and precision at recall levels, per label (module docstring)."""

    @config_class
    class Config(GlobalMetricCalculator.Config):
        """Configures PrecisionRecallMetricCalculator."""

        # The label names, in the order of the prediction's last axis (metric name prefixes).
        label_names: Required[Sequence[str]] = REQUIRED
        # The input_batch field of the targets ([batch] or [batch, num_labels] of 0/1; < 0: pad).
        label_field: str = "target_labels"
        # The predict output field of the scores ([batch, num_labels]).
        prediction_field: str = "logits"
        # The precision levels, in (0, 1], at which recall is reported.
        precision_levels: Required[Sequence[float]] = REQUIRED
        # The recall levels, in (0, 1], at which precision is reported.
        recall_levels: Required[Sequence[float]] = REQUIRED
        # Whether targets are class ids to one-hot over the labels (else 0/1 per label).
        expand_label_to_onehot: Optional[bool] = False

    class Output(NamedTuple):
        """One batch's targets and scores."""

        # Ground truth 0/1 (< 0: padding), [batch_size, num_labels] or [batch_size].
        y_true: NestedTensor
        # Prediction scores in (-inf, inf), [batch_size, num_labels].
        y_score: NestedTensor

    def forward(
        self, input_batch: NestedTensor, *, model_params: NestedTensor, state: NestedTensor
    ) -> dict[str, NestedTensor]:
        """Runs the model's predict method on one batch.

        Args:
            input_batch: The eval batch.
            model_params: The model parameters.
            state: From `init_state` or the previous `forward`.

        Returns:
            {"state": the next state, "output": an `Output` of the batch's targets and scores}.
        """
        outputs = super().forward(input_batch, model_params=model_params, state=state)
        cfg = self.config
        scores = outputs["output"].predict_outputs[cfg.prediction_field]
        return dict(
            state=outputs["state"],
            output=self.Output(y_true=input_batch[cfg.label_field], y_score=scores),
        )

    def _calculate_metrics(
        self, outputs: Output
    ) -> dict[str, Tensor]:  # pytype: disable=signature-mismatch
        """Computes the metrics of the module docstring from the whole set.

        Args:
            outputs: An `Output` of [num_examples, ...] arrays (all batches concatenated).

        Returns:
            {metric name: scalar}.
        """
        cfg = self.config
        labels = jnp.asarray(outputs.y_true)
        if cfg.expand_label_to_onehot:
            labels = jax.nn.one_hot(labels, len(cfg.label_names))
        if labels.ndim == 1:
            labels = labels[:, None]
        scores = jnp.asarray(outputs.y_score)
        # An example with a negative target is padding.
        live = jnp.all(labels >= 0, axis=1)
        metrics = {}
        for i in range(labels.shape[-1]):
            curve = precision_recall_curve(labels[:, i], scores[:, i], weight=live)
            precisions, recalls = curve["precisions"], curve["recalls"]
            thresholds = curve["thresholds"]
            name = cfg.label_names[i]
            for level in cfg.precision_levels:
                key = f"{name}_recall@p{level * 100}"
                metrics[key], metrics[f"{key}_threshold"] = _at_level(
                    achieved=precisions, reported=recalls, thresholds=thresholds, level=level
                )
            for level in cfg.recall_levels:
                key = f"{name}_precision@r{level * 100}"
                metrics[key], metrics[f"{key}_threshold"] = _at_level(
                    achieved=recalls, reported=precisions, thresholds=thresholds, level=level
                )
        return metrics
