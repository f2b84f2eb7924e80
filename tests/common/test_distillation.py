"""Tests axlearn.common.distillation's losses against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.base_model import BaseModel
from axlearn.common.config import config_class
from axlearn.common.distillation import (
    DeiTDistillationMetric,
    DistillationModel,
    KLDivergenceMetric,
    NegativeCosineSimilarityMetric,
)
from axlearn.common.layers import Linear
from axlearn.common.module import functional as F


class _Classifier(BaseModel):
    """predict: {"logits": linear(x), "embedding": x @ W}."""

    @config_class
    class Config(BaseModel.Config):
        """Configures _Classifier."""

        dim: int = 4  # Input dim.
        num_classes: int = 5  # Output dim.

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "proj", Linear.default_config().set(input_dim=cfg.dim, output_dim=cfg.num_classes)
        )

    def predict(self, input_batch):
        logits = self.proj(input_batch["x"])
        return dict(logits=logits, embedding=logits)

    def forward(self, input_batch):
        return jnp.zeros([]), self.predict(input_batch)


def _np_log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("is_log_targets", [False, True])
def test_distillation_model_kl_loss_matches_numpy(is_log_targets):
    temperature = 2.5
    cfg = DistillationModel.default_config().set(
        name="distill",
        teacher=_Classifier.default_config(),
        student=_Classifier.default_config(),
        metric=KLDivergenceMetric.default_config().set(
            temperature=temperature, is_log_targets=is_log_targets
        ),
    )
    model = cfg.instantiate(parent=None)
    state = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    label = rng.integers(0, 5, 8)
    label[-2:] = -1  # Left out of the accuracies.
    (loss, aux), collection = F(
        model,
        inputs=dict(input_batch=dict(x=x, label=label)),
        state=state,
        is_training=True,
        prng_key=jax.random.PRNGKey(1),
    )
    teacher = np.asarray(aux["teacher_outputs"]["logits"])
    student = np.asarray(aux["student_outputs"]["logits"])
    log_p = _np_log_softmax(teacher / temperature)
    log_q = _np_log_softmax(student / temperature)
    expected = np.mean(np.sum(np.exp(log_p) * (log_p - log_q), axis=-1))
    np.testing.assert_allclose(loss, expected, rtol=1e-5, atol=1e-7)
    summaries = collection.summaries["metric"]
    live = label >= 0
    np.testing.assert_allclose(
        summaries["accuracy"].mean, np.sum(student.argmax(-1)[live] == label[live]) / live.sum()
    )
    np.testing.assert_allclose(
        summaries["accuracy_teacher"].mean,
        np.sum(teacher.argmax(-1)[live] == label[live]) / live.sum(),
    )
    assert int(summaries["accuracy"].weight) == 6


def test_kl_metric_rejects_bad_temperature():
    layer = KLDivergenceMetric.default_config().set(name="kl", temperature=0.0)
    layer = layer.instantiate(parent=None)
    with pytest.raises(ValueError, match="kl.temperature=0.0"):
        F(
            layer,
            inputs=dict(
                predictions=dict(logits=jnp.ones((2, 3))),
                targets=dict(logits=jnp.ones((2, 3))),
                label=jnp.zeros(2, jnp.int32),
            ),
            state={},
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
        )


@pytest.mark.parametrize("normalize", [True, False])
def test_negative_cosine_similarity_matches_numpy(normalize):
    rng = np.random.default_rng(1)
    s, t = rng.normal(size=(2, 6, 8)).astype(np.float32)
    layer = NegativeCosineSimilarityMetric.default_config().set(
        name="cos", student_embedding="s", teacher_embedding="t", normalize_embedding=normalize
    )
    loss, _ = F(
        layer.instantiate(parent=None),
        inputs=dict(predictions=dict(s=s), targets=dict(t=t), label=None),
        state={},
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
    )
    if normalize:
        s = s / np.linalg.norm(s, axis=-1, keepdims=True)
        t = t / np.linalg.norm(t, axis=-1, keepdims=True)
    np.testing.assert_allclose(loss, -np.mean(np.sum(s * t, axis=-1)), rtol=1e-5)


@pytest.mark.parametrize("soft", [False, True])
def test_deit_metric_matches_numpy(soft):
    rng = np.random.default_rng(2)
    n, k, alpha = 6, 4, 0.3
    lt, lc, ld = rng.normal(size=(3, n, k)).astype(np.float32)
    labels = rng.integers(0, k, n)
    labels[0] = -1
    soft_labels = rng.dirichlet(np.ones(k), n).astype(np.float32) if soft else None
    layer = DeiTDistillationMetric.default_config().set(name="deit", num_classes=k, alpha=alpha)
    loss, collection = F(
        layer.instantiate(parent=None),
        inputs=dict(
            logits_teacher=lt,
            logits_classification=lc,
            logits_distillation=ld,
            labels=labels,
            soft_labels=soft_labels,
        ),
        state={},
        is_training=True,
        prng_key=jax.random.PRNGKey(0),
    )
    live = labels >= 0
    # one_hot(-1) is all zeros: an unlabeled example adds nothing to the hard-label term.
    targets = soft_labels if soft else np.eye(k)[np.where(live, labels, 0)] * live[:, None]
    ce_cls = -np.sum(targets * _np_log_softmax(lc)) / live.sum()
    ce_kd = -np.sum((np.eye(k)[lt.argmax(1)] * _np_log_softmax(ld)).sum(-1) * live) / live.sum()
    np.testing.assert_allclose(loss, (1 - alpha) * ce_cls + alpha * ce_kd, rtol=1e-5)
    accuracy = np.sum((lc + ld).argmax(-1) == labels) / live.sum()
    np.testing.assert_allclose(collection.summaries["accuracy"].mean, accuracy, rtol=1e-6)
