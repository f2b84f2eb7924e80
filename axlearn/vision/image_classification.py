"""Image classification: a backbone's "embedding" endpoint, dropout, a linear classifier."""

from typing import Optional

from jax import numpy as jnp

from axlearn.common.base_layer import BaseLayer
from axlearn.common.base_model import BaseModel
from axlearn.common.config import REQUIRED, InstantiableConfig, Required, config_class
from axlearn.common.layers import ClassificationMetric, Dropout, Linear
from axlearn.common.module import Module
from axlearn.common.utils import NestedTensor, Tensor


class ImageClassificationModel(BaseModel):
    """Classifies images ("image" [batch, height, width, channels]) into `num_classes` classes.

    The backbone must return a dict with an "embedding" [batch, dim] entry and expose
    `endpoints_dims["embedding"]` (e.g. `axlearn.vision.resnet.ResNet`). The loss is the metric's
    (softmax cross entropy by default) against "label" [batch] (or "soft_label"
    [batch, num_classes]); labels outside [0, num_classes), e.g. the -1 of padded evaluation
    examples, are left out.
    """

    @config_class
    class Config(BaseLayer.Config):
        """Configures ImageClassificationModel."""

        # The backbone computing image embeddings, e.g. ResNet.resnet50_config().
        backbone: Required[InstantiableConfig] = REQUIRED
        # Number of classes.
        num_classes: Required[int] = REQUIRED
        # The classifier config (input_dim and output_dim are set by the model).
        classifier: InstantiableConfig = Linear.default_config().set(
            bias=True, param_partition_spec=("model", None)
        )
        # Dropout on the embedding before the classifier.
        dropout: Dropout.Config = Dropout.default_config()
        # The loss and metrics layer (num_classes is set by the model).
        metric: InstantiableConfig = ClassificationMetric.default_config()

    @classmethod
    def default_config(cls) -> Config:
        cfg = super().default_config()
        cfg.dtype = jnp.float32
        return cfg

    def __init__(self, cfg: Config, *, parent: Optional[Module]):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child("backbone", cfg.backbone)
        dims = getattr(self.backbone, "endpoints_dims", None)
        if not dims or "embedding" not in dims:
            raise ValueError(
                f"{self.path()}.backbone ({cfg.backbone.klass.__name__}) must expose "
                "endpoints_dims['embedding'], as axlearn.vision.resnet.ResNet does"
            )
        self._add_child("dropout", cfg.dropout)
        self._add_child(
            "classifier",
            cfg.classifier.clone(input_dim=dims["embedding"], output_dim=cfg.num_classes),
        )
        self._add_child("metric", cfg.metric.clone(num_classes=cfg.num_classes))

    def predict(self, input_batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Computes the backbone's endpoints and the classification logits.

        Args:
            input_batch: A dict with "image" [batch, height, width, channels].

        Returns:
            The backbone's endpoints plus "logits" [batch, num_classes].
        """
        endpoints = dict(self.backbone(input_batch["image"]))
        endpoints["logits"] = self.classifier(self.dropout(endpoints["embedding"]))
        return endpoints

    def forward(self, input_batch: dict[str, Tensor]) -> tuple[Tensor, NestedTensor]:
        """Returns (loss, predict()'s outputs); the metric layer adds accuracy summaries.

        Args:
            input_batch: "image", and "label" [batch] (int) or "soft_label" [batch, num_classes].

        Returns:
            (the scalar loss, the dict of endpoints and logits).
        """
        outputs = self.predict(input_batch)
        labels = input_batch.get("label")
        soft_labels = input_batch.get("soft_label")
        if labels is None:
            if soft_labels is None:
                raise ValueError(
                    f"{self.path()}: input_batch needs 'label' or 'soft_label', got "
                    f"{sorted(input_batch)}"
                )
            labels = jnp.argmax(soft_labels, axis=-1)
        loss = self.metric(outputs["logits"], labels=labels, soft_labels=soft_labels)
        return loss, outputs
