"""Tests of axlearn/vision/image_classification.py against a NumPy softmax cross entropy."""

import jax
import numpy as np
import pytest

from axlearn.common.module import functional as F
from axlearn.vision import resnet
from axlearn.vision.image_classification import ImageClassificationModel


def _model(num_classes=5):
    cfg = ImageClassificationModel.default_config().set(
        name="m",
        backbone=resnet.ResNet.resnet18_config().set(hidden_dim=4, num_blocks_per_stage=[1]),
        num_classes=num_classes,
    )
    model = cfg.instantiate(parent=None)
    return model, model.initialize_parameters_recursively(jax.random.PRNGKey(0))


def test_loss_is_cross_entropy_of_logits_without_padded_labels():
    model, params = _model()
    rng = np.random.default_rng(0)
    batch = {
        "image": rng.normal(size=(4, 16, 16, 3)).astype(np.float32),
        "label": np.array([0, 3, -1, 4], np.int32),  # -1: a padded example.
    }
    (loss, outputs), _ = F(
        model, prng_key=jax.random.PRNGKey(1), state=params, inputs=(batch,), is_training=False
    )
    logits = np.asarray(outputs["logits"], np.float64)
    assert logits.shape == (4, 5) and outputs["embedding"].shape == (4, 4)
    # The classifier is a linear map of the embedding.
    w, b = (np.asarray(params["classifier"][k]) for k in ("weight", "bias"))
    np.testing.assert_allclose(logits, np.asarray(outputs["embedding"]) @ w + b, rtol=1e-5)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    keep = [0, 1, 3]
    expected = -np.mean(log_probs[keep, batch["label"][keep]])
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_backbone_without_embedding_is_rejected():
    cfg = ImageClassificationModel.default_config().set(
        name="m", backbone=resnet.ResNetStage.default_config(), num_classes=3
    )
    cfg.backbone.set(input_dim=3, output_dim=3, num_blocks=1)
    with pytest.raises(ValueError, match=r"m\.backbone \(ResNetStage\) must expose endpoints_dims"):
        cfg.instantiate(parent=None)
