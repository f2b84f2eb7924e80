"""Knowledge distillation models (AXLearn's `axlearn.common.distillation`).

- `DistillationModel` (Hinton et al., https://arxiv.org/abs/1503.02531): a teacher, run with
  is_training=False (freeze its weights in the learner), and a student; both models' `predict`
  outputs go to `metric`, whose value is the loss:
  - `KLDivergenceMetric`: KL(softmax(teacher logits / T) || softmax(student logits / T)) over
    the last axis, averaged over examples, plus the student's and teacher's top-1 accuracy;
  - `NegativeCosineSimilarityMetric`: -cos(student embedding, teacher embedding), averaged.
- `DeiTDistillationModel` (DeiT, https://arxiv.org/abs/2012.12877): hard distillation through
  a distillation token; `DeiTDistillationMetric`'s loss is
  (1 - alpha) * CE(class logits, labels) + alpha * CE(distillation logits, teacher's argmax),
  and the prediction is the argmax of the sum of both logits.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from axlearn.common.base_layer import BaseLayer
from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.layers import Linear
from axlearn.common.loss import kl_divergence, negative_cosine_similarity_loss
from axlearn.common.metrics import WeightedSummary
from axlearn.common.module import Module, child_context
from axlearn.common.utils import NestedTensor, Tensor


def _accuracy(predictions: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(top-1 accuracy over the examples with a label >= 0, their number)."""
    num_examples = (labels >= 0).sum()
    correct = jnp.equal(predictions, labels).sum()
    return correct / jnp.maximum(1, num_examples), num_examples


class BaseDistillationModel(BaseModel):
    """A model made of a teacher and a student; subclasses define the loss."""

    @config_class
    class Config(BaseModel.Config):
        """Configures BaseDistillationModel."""

        # The teacher model (run with is_training=False).
        teacher: Required[BaseLayer.Config] = REQUIRED
        # The student model (the one trained).
        student: Required[BaseLayer.Config] = REQUIRED

    def forward(self, input_batch: dict[str, Tensor]) -> tuple[Tensor, NestedTensor]:
        """Returns (loss, outputs); implemented by subclasses.

        Raises:
            NotImplementedError: Always (a subclass defines the loss).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward")


class NegativeCosineSimilarityMetric(BaseLayer):
    """The negative cosine similarity of the student's and the teacher's embeddings."""

    @config_class
    class Config(BaseLayer.Config):
        """Configures NegativeCosineSimilarityMetric."""

        # The student's predict output holding its embedding.
        student_embedding: str = "embedding"
        # The teacher's predict output holding its embedding (None: student_embedding).
        teacher_embedding: Optional[str] = None
        # Whether to L2-normalize both embeddings first.
        normalize_embedding: bool = True

    def forward(self, *, predictions: NestedTensor, targets: NestedTensor, **kwargs) -> Tensor:
        """Computes the loss.

        Args:
            predictions: The student's predict outputs ([..., dim] embeddings).
            targets: The teacher's predict outputs ([..., dim] embeddings).
            **kwargs: The rest of the input batch (unused).

        Returns:
            The scalar loss, -mean(cos(student, teacher)).
        """
        del kwargs
        cfg = self.config
        loss, _ = negative_cosine_similarity_loss(
            predictions=predictions[cfg.student_embedding],
            targets=targets[cfg.teacher_embedding or cfg.student_embedding],
            normalize_embedding=cfg.normalize_embedding,
        )
        return loss


class KLDivergenceMetric(BaseLayer):
    """KL divergence of the temperature-softened teacher and student distributions.

    Also adds the summaries "accuracy" (the student's top-1) and "accuracy_teacher", over the
    examples with a label >= 0.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures KLDivergenceMetric."""

        # Whether the KL is computed from the teacher's log-probabilities (same value).
        is_log_targets: bool = False
        # The softmax temperature of both models' logits (> 0).
        temperature: float = 1.0

    def forward(
        self, *, predictions: NestedTensor, targets: NestedTensor, label: Tensor, **kwargs
    ) -> Tensor:
        """Computes the loss and accuracies.

        Args:
            predictions: The student's predict outputs; "logits" [..., num_classes].
            targets: The teacher's predict outputs; "logits" [..., num_classes].
            label: [...] int labels; negative ones are left out of the accuracies.
            **kwargs: The rest of the input batch (unused).

        Returns:
            The scalar KL(teacher || student), averaged over examples.

        Raises:
            ValueError: If the temperature is not positive.
        """
        del kwargs
        cfg = self.config
        if cfg.temperature <= 0:
            raise ValueError(
                f"{self.path()}.temperature={cfg.temperature}: distillation temperature has to "
                "be positive."
            )
        teacher_probs = jax.nn.softmax(targets["logits"] / cfg.temperature)
        student_log_probs = jax.nn.log_softmax(predictions["logits"] / cfg.temperature)
        loss, _ = kl_divergence(
            log_predictions=student_log_probs,
            targets=jnp.log(teacher_probs) if cfg.is_log_targets else teacher_probs,
            is_log_targets=cfg.is_log_targets,
        )
        accuracy, num_examples = _accuracy(jnp.argmax(student_log_probs, axis=-1), label)
        self.add_summary("accuracy", WeightedSummary(accuracy, num_examples))
        accuracy_t, _ = _accuracy(jnp.argmax(teacher_probs, axis=-1), label)
        self.add_summary("accuracy_teacher", WeightedSummary(accuracy_t, num_examples))
        return loss


class DistillationModel(BaseDistillationModel):
    """Distills a frozen teacher into a student through `metric` (the loss)."""

    @config_class
    class Config(BaseDistillationModel.Config):
        """Configures DistillationModel."""

        # Computes the loss from the student's and teacher's predict outputs.
        metric: InstantiableConfig = KLDivergenceMetric.default_config()

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.dtype = jnp.float32
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("teacher", cfg.teacher)
        self._add_child("student", cfg.student)
        self._add_child("metric", cfg.metric)

    def forward(self, input_batch: dict[str, Tensor]) -> tuple[Tensor, NestedTensor]:
        """Runs both models' `predict` and the metric.

        Args:
            input_batch: The batch (also passed to the metric as keyword arguments).

        Returns:
            (loss, {"student_outputs": ..., "teacher_outputs": ...}).
        """
        # The teacher runs in inference mode; the learner freezes its weights.
        with child_context("teacher", module=self.teacher, is_training=False):
            teacher_outputs = self.teacher.predict(input_batch)
        student_outputs = self.student.predict(input_batch)
        loss = self.metric(predictions=student_outputs, targets=teacher_outputs, **input_batch)
        return loss, dict(student_outputs=student_outputs, teacher_outputs=teacher_outputs)


class DeiTDistillationMetric(BaseLayer):
    """DeiT's hard-distillation loss and accuracies (see the module docstring).

    Adds the summaries "loss", "accuracy" (of the summed logits) and "accuracy_teacher".
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures DeiTDistillationMetric."""

        # The number of classes.
        num_classes: Required[int] = REQUIRED
        # The weight of the distillation term, in [0, 1].
        alpha: float = 0.5

    def forward(
        self,
        *,
        logits_teacher: Tensor,
        logits_classification: Tensor,
        logits_distillation: Tensor,
        labels: Tensor,
        soft_labels: Optional[Tensor] = None,
    ) -> Tensor:
        """Computes the loss.

        Args:
            logits_teacher: [batch, num_classes] teacher logits.
            logits_classification: [batch, num_classes] logits of the student's class token.
            logits_distillation: [batch, num_classes] logits of its distillation token.
            labels: [batch] int labels; negative ones are left out.
            soft_labels: Optional [batch, num_classes] (smoothed, e.g. mixup) targets of the
                classification term instead of one-hot labels.

        Returns:
            The scalar (1 - alpha) * classification CE + alpha * distillation CE.
        """
        cfg = self.config
        valid = labels >= 0
        denominator = jnp.maximum(1, valid.sum())
        dtype = logits_classification.dtype
        if soft_labels is None:
            soft_labels = jax.nn.one_hot(labels, cfg.num_classes, dtype=dtype)
        ce_classification = -jnp.sum(
            soft_labels * jax.nn.log_softmax(logits_classification), axis=-1
        )
        loss_classification = ce_classification.sum() / denominator
        pseudo_labels = jax.nn.one_hot(
            jnp.argmax(logits_teacher, axis=1), cfg.num_classes, dtype=dtype
        )
        ce_distillation = -jnp.sum(pseudo_labels * jax.nn.log_softmax(logits_distillation), -1)
        loss_distillation = jnp.sum(ce_distillation * valid) / denominator
        loss = (1 - cfg.alpha) * loss_classification + cfg.alpha * loss_distillation
        accuracy, num_examples = _accuracy(
            jnp.argmax(logits_classification + logits_distillation, axis=-1), labels
        )
        self.add_summary("loss", WeightedSummary(loss, num_examples))
        self.add_summary("accuracy", WeightedSummary(accuracy, num_examples))
        accuracy_t, _ = _accuracy(jnp.argmax(logits_teacher, axis=-1), labels)
        self.add_summary("accuracy_teacher", WeightedSummary(accuracy_t, num_examples))
        return loss


class DeiTDistillationModel(BaseDistillationModel):
    """DeiT: a student with a distillation token learns from a frozen teacher's argmax.

    The student's predict outputs "logits" and "distillation_features" [batch, 1, dim] (the
    distillation token), which `distillation_classifier` maps to distillation logits; its
    backbone's `endpoints_dims["embedding"]` gives that dim.
    """

    @config_class
    class Config(BaseDistillationModel.Config):
        """Configures DeiTDistillationModel."""

        # Maps the distillation token's features to logits (dims are set here).
        distillation_classifier: InstantiableConfig = Linear.default_config().set(
            bias=True, param_partition_spec=("model", None)
        )
        # Computes the loss.
        metric: InstantiableConfig = DeiTDistillationMetric.default_config()
        # The number of classes (set on the teacher, the student and the metric).
        num_classes: int = 1000

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.dtype = jnp.float32
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("teacher", cfg.teacher.clone(num_classes=cfg.num_classes))
        self._add_child("student", cfg.student.clone(num_classes=cfg.num_classes))
        self._add_child(
            "distillation_classifier",
            cfg.distillation_classifier.clone(
                input_dim=self.student.backbone.endpoints_dims["embedding"],
                output_dim=cfg.num_classes,
            ),
        )
        self._add_child("metric", cfg.metric.clone(num_classes=cfg.num_classes))

    def forward(self, input_batch: dict[str, Tensor]) -> tuple[Tensor, NestedTensor]:
        """Runs the teacher and the student; returns (loss, logits).

        Args:
            input_batch: The batch, with "label" [batch] and optionally "soft_label".

        Returns:
            (loss, {"logits": the summed student logits, "logits_student", "logits_teacher"}).
        """
        with child_context("teacher", module=self.teacher, is_training=False):
            teacher = self.teacher.predict(input_batch)
        student = self.student.predict(input_batch)
        logits_kd = self.distillation_classifier(
            jnp.squeeze(student["distillation_features"], axis=1)
        )
        loss = self.metric(
            logits_teacher=teacher["logits"],
            logits_classification=student["logits"],
            logits_distillation=logits_kd,
            labels=input_batch.get("label"),
            soft_labels=input_batch.get("soft_label"),
        )
        return loss, dict(
            logits=student["logits"] + logits_kd,
            logits_student=student["logits"],
            logits_teacher=teacher["logits"],
        )
