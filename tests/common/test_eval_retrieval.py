"""Tests of axlearn.common.eval_retrieval against brute-force NumPy references."""

import jax
import numpy as np
import pytest

from axlearn.common.base_model import BaseModel
from axlearn.common.eval_retrieval import (
    CLIPRetrievalMetricCalculator,
    EmbeddingRetrievalMetricCalculator,
    KnnMetricCalculator,
    calculate_clip_retrieval_metrics,
    get_pairwise_distances_sqr,
)


class _EchoModel(BaseModel):
    """predict() returns input_batch["predicted"]."""

    def predict(self, input_batch):
        return input_batch["predicted"]


def _summaries(calc_cfg, batches):
    model = _EchoModel.default_config().set(name="model").instantiate(parent=None)
    calc = calc_cfg.set(name="calc").instantiate(
        parent=None, model=model, model_param_partition_specs={}
    )
    state = calc.init_state(prng_key=jax.random.PRNGKey(0), model_params={})
    outputs = []
    for batch in batches:
        result = calc.forward(batch, model_params={}, state=state)
        state = result["state"]
        outputs.append(result["output"])
    return calc.get_summaries(model_params={}, state=state, all_forward_outputs=outputs)


def test_clip_retrieval_matches_brute_force():
    rng = np.random.default_rng(0)
    img = rng.normal(size=(4, 1, 3)).astype(np.float32)
    txt = rng.normal(size=(4, 2, 3)).astype(np.float32)
    valid = np.array([[1, 1], [1, 0], [0, 0], [1, 1]])
    got = calculate_clip_retrieval_metrics(
        top_ks=[1, 2], visual_embeddings=img, textual_embeddings=txt, valid_sentences=valid
    )
    sim = img[:, 0] @ txt.reshape(-1, 3).T
    live_txt = valid.reshape(-1).astype(bool)
    live_img = valid.any(axis=1)
    for k in (1, 2):
        i2t = [
            bool(
                set(np.argsort(-np.where(live_txt, sim[i], -np.inf))[:k])
                & {2 * i, 2 * i + 1}
                & set(np.flatnonzero(live_txt))
            )
            for i in range(4)
            if live_img[i]
        ]
        t2i = [
            i // 2 in np.argsort(-np.where(live_img, sim[:, i], -np.inf))[:k]
            for i in range(8)
            if live_txt[i]
        ]
        assert float(got[f"i2t_top@{k}"]) == pytest.approx(np.mean(i2t))
        assert float(got[f"t2i_top@{k}"]) == pytest.approx(np.mean(t2i))
    summaries = _summaries(
        CLIPRetrievalMetricCalculator.default_config().set(top_ks=[1], prefix="clip"),
        [
            {
                "input": {"valid_sentences": valid[s]},
                "predicted": {
                    "visual_encoder": {"output_features": img[s]},
                    "textual_encoder": {"output_features": txt[s]},
                },
            }
            for s in (slice(0, 2), slice(2, 4))
        ],
    )
    assert float(summaries["clip/i2t_top@1"]) == pytest.approx(float(got["i2t_top@1"]))


def test_pairwise_distances():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    expected = ((a[:, None] - b[None]) ** 2).sum(-1)
    np.testing.assert_allclose(get_pairwise_distances_sqr(a, b), expected, rtol=1e-5, atol=1e-5)


def test_embedding_retrieval_without_is_query_excludes_self_and_invalid():
    rng = np.random.default_rng(2)
    emb = rng.normal(size=(6, 2)).astype(np.float32)
    labels = np.array([-1, 0, 1, 0, 1, 0])  # The first example is padding.
    summaries = _summaries(
        EmbeddingRetrievalMetricCalculator.default_config().set(
            metrics=["accuracy@1", "MAP"], max_query_chunk_size=2
        ),
        [
            {"input": {"label": labels[s]}, "predicted": {"embedding": emb[s]}}
            for s in (slice(0, 3), slice(3, 6))
        ],
    )
    acc, aps = [], []
    valid = np.flatnonzero(labels >= 0)
    for q in valid:
        others = [i for i in valid if i != q]
        d = ((emb[others] - emb[q]) ** 2).sum(-1)
        rel = (labels[others] == labels[q])[np.argsort(d)]
        acc.append(rel[0])
        # As AXLearn's: the query itself stays in the index, masked to the last rank, relevant.
        rel = np.append(rel, True)
        precision = np.cumsum(rel) / np.arange(1, len(rel) + 1)
        aps.append((precision * rel).sum() / rel.sum())
    assert int(summaries["num_valid"]) == 5
    assert float(summaries["accuracy@1"]) == pytest.approx(np.mean(acc))
    assert float(summaries["MAP"]) == pytest.approx(np.mean(aps))


def test_knn_accuracy():
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(8, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    is_query = np.array([1, 1, 1, 0, 0, 0, 0, 0], bool)
    summaries = _summaries(
        KnnMetricCalculator.default_config().set(num_labels=3, top_ks=(3,), temps=(0.1,)),
        [{"input": {"label": labels, "is_query": is_query}, "predicted": {"embedding": emb}}],
    )
    correct = []
    for q in range(3):
        sims = emb[3:] @ emb[q]
        top = np.argsort(-sims)[:3]
        votes = np.zeros(3)
        for i in top:
            votes[labels[3:][i]] += np.exp(sims[i] / 0.1)
        correct.append(np.argmax(votes) == labels[q])
    assert float(summaries["knn-t0.10@3"]) == pytest.approx(np.mean(correct))
