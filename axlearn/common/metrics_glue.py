"""GLUE metrics (AXLearn's `axlearn.common.metrics_glue`; GLUE: https://arxiv.org/abs/1804.07461).

`glue_metrics(task=...)` gives each task's metrics as `WeightedSummary`s weighted by the number
of live targets:
- every task but "stsb": "accuracy";
- "cola": also "matthews_corr" (`metrics_correlation.matthews_corrcoef`);
- "mrpc", "qqp", "record": also "f1" of class 1, a prediction other than 0 or 1 counting as
  wrong;
- "stsb" (regression): "pearson_corr" and "spearman_corr".

`GLUEMetricCalculator` is an evaler metric calculator computing them per batch from the model's
`aux["logits"]` (argmax, or the single regression output for "stsb");
`GLUEMetricAccumulator` collects every batch's predictions and computes the metrics over the
whole set at the end (rank correlations cannot be averaged over batches).
"""

from typing import Optional, Union

import jax
import jax.numpy as jnp

from axlearn.common.config import REQUIRED, Configurable, Required, config_class
from axlearn.common.evaler import ModelSummaryAccumulator
from axlearn.common.metrics import MetricSummary, WeightedSummary
from axlearn.common.metrics_classification import f_score
from axlearn.common.metrics_correlation import (
    matthews_corrcoef,
    pearson_corrcoef,
    spearman_corrcoef,
)
from axlearn.common.utils import NestedTensor, Tensor

# Tasks reporting the F1 score of class 1 beside accuracy.
_F1_TASKS = ("mrpc", "qqp", "record")


def glue_metrics(
    *, task: str, target_labels: Tensor, preds: Tensor, mask: Tensor
) -> dict[str, MetricSummary]:
    """Computes the GLUE metrics of `task` (see the module docstring).

    Args:
        task: The GLUE task name ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", ...).
        target_labels: [batch_size] ground truth: classes in [0, num_classes), or scores for
            "stsb".
        preds: [batch_size] predictions (classes, possibly outside [0, num_classes); scores for
            "stsb").
        mask: [batch_size] 0/1 (or boolean) mask of the targets to include.

    Returns:
        {metric name: WeightedSummary(value, number of live targets)}.
    """
    mask = jnp.asarray(mask)
    num_targets = mask.sum()
    summaries = {}
    if task == "stsb":
        summaries["pearson_corr"] = WeightedSummary(
            pearson_corrcoef(preds, target_labels, weight=mask), num_targets
        )
        summaries["spearman_corr"] = WeightedSummary(
            spearman_corrcoef(preds, target_labels, mask=mask), num_targets
        )
    else:
        correct = jnp.sum(mask * (preds == target_labels))
        summaries["accuracy"] = WeightedSummary(correct / jnp.maximum(num_targets, 1), num_targets)
    if task == "cola":
        summaries["matthews_corr"] = WeightedSummary(
            matthews_corrcoef(target_labels, preds, weight=mask), num_targets
        )
    elif task in _F1_TASKS:
        # A prediction outside {0, 1} becomes the wrong class.
        valid = jnp.logical_or(preds == 0, preds == 1)
        preds = jnp.where(valid, preds, 1 - target_labels)
        summaries["f1"] = WeightedSummary(
            f_score(target_labels, preds, beta=1, weight=mask), num_targets
        )
    return summaries


_jit_glue_metrics = jax.jit(glue_metrics, static_argnames=("task",))


class GLUEMetricAccumulator(Configurable):
    """Collects predictions and targets over batches; computes `glue_metrics` over all of them.

    Instantiated as `GLUEMetricAccumulator.default_config().instantiate(task=...)`.
    """

    def __init__(self, cfg: Configurable.Config, task: str):
        super().__init__(cfg)
        self._task = task
        self._preds: list[Tensor] = []
        self._gt: list[Tensor] = []
        self._mask: list[Tensor] = []

    def update(self, *, target_labels: Tensor, preds: Tensor, mask: Optional[Tensor] = None):
        """Adds one batch.

        Args:
            target_labels: [batch_size] ground truth.
            preds: [batch_size] predictions.
            mask: Optional [batch_size] mask of the live targets (None: all live).

        Raises:
            ValueError: If the inputs are not rank 1 or their shapes differ.
        """
        if mask is None:
            mask = jnp.ones_like(target_labels)
        if not target_labels.ndim == preds.ndim == mask.ndim == 1:
            raise ValueError(
                "GLUEMetricAccumulator.update: pred labels, gt labels, and mask should have "
                f"exactly one dimension. Got pred: {preds.ndim}, gt: {target_labels.ndim}, "
                f"mask: {mask.ndim}."
            )
        if not target_labels.shape == preds.shape == mask.shape:
            raise ValueError(
                "GLUEMetricAccumulator.update: pred labels, gt labels, and mask should have the "
                f"same shape. Got pred: {preds.shape}, gt: {target_labels.shape}, "
                f"mask: {mask.shape}."
            )
        self._preds.append(preds)
        self._gt.append(target_labels)
        self._mask.append(mask)

    def summaries(self) -> dict[str, MetricSummary]:
        """Returns `glue_metrics` of every batch added so far (computed in one jitted call)."""
        return _jit_glue_metrics(
            task=self._task,
            target_labels=jnp.concatenate(self._gt),
            preds=jnp.concatenate(self._preds),
            mask=jnp.concatenate(self._mask),
        )


class GLUEMetricCalculator(ModelSummaryAccumulator):
    """Computes `glue_metrics` and the loss of each eval batch, averaged over batches.

    The model's method returns `(loss, aux)` with `aux["logits"]` [batch_size, num_classes]
    (predictions: their argmax; "stsb": [batch_size, 1], the score itself). Targets equal to
    `ignore_target_label` are left out.
    """

    @config_class
    class Config(ModelSummaryAccumulator.Config):
        """Configures GLUEMetricCalculator."""

        # The GLUE task name, e.g. "cola", "mrpc", "stsb".
        task: Required[str] = REQUIRED
        # The target value of examples to leave out (e.g. -1; NaN for "stsb").
        ignore_target_label: Required[Union[int, float]] = REQUIRED

    def _forward_in_jit(
        self, model_params: NestedTensor, prng_key: Tensor, input_batch: NestedTensor
    ) -> dict[str, NestedTensor]:
        cfg = self.config
        next_key, forward_key = jax.random.split(prng_key)
        (loss, aux), collection = self._call_model(
            method=cfg.model_method,
            prng_key=forward_key,
            model_params=model_params,
            input_batch=input_batch,
            **cfg.model_method_kwargs,
        )
        logits = aux["logits"]
        target_labels = input_batch["target_labels"]
        live = (target_labels != cfg.ignore_target_label).astype(logits.dtype)
        if cfg.task == "stsb":
            preds = logits.squeeze(axis=-1)
        else:
            preds = logits.argmax(axis=-1)
        summaries = dict(collection.summaries)
        summaries.update(
            glue_metrics(task=cfg.task, target_labels=target_labels, preds=preds, mask=live)
        )
        summaries["loss"] = WeightedSummary(loss, live.sum())
        return dict(prng_key=next_key, summaries=summaries, per_example={})
