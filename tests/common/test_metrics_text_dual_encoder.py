"""Tests of axlearn.common.metrics_text_dual_encoder against a brute-force NumPy reference."""

import jax
import numpy as np
import pytest

from axlearn.common.base_model import BaseModel
from axlearn.common.metrics_text_dual_encoder import (
    TextDualEncoderMetricCalculator,
    calculate_retrieval_metrics_from_similarity_matrix,
)
from axlearn.common.text_dual_encoder import (
    NEGATIVE_EMBEDDINGS,
    NEGATIVE_PADDINGS,
    POSITIVE_EMBEDDINGS,
    POSITIVE_PADDINGS,
)

Q, T = "query_encoder", "text_encoder"


class _EchoModel(BaseModel):
    """predict() returns input_batch["predicted"]."""

    def predict(self, input_batch):
        return input_batch["predicted"]


def _data(seed=0, negatives=True):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(6, 1, 3)).astype(np.float32)
    pos = rng.normal(size=(6, 2, 3)).astype(np.float32)
    neg = rng.normal(size=(6, 1, 3)).astype(np.float32) if negatives else None
    q_pad = np.array([[0], [0], [1], [0], [0], [0]])
    pos_pad = np.array([[0, 0], [0, 1], [0, 0], [0, 1], [0, 0], [0, 0]])
    neg_pad = np.array([[0], [1], [0], [0], [0], [1]]) if negatives else None
    return q, q_pad, pos, pos_pad, neg, neg_pad


def _reference(q, q_pad, pos, pos_pad, neg, neg_pad, ks, ndcg_ks):
    texts = [pos.reshape(-1, 3)] + ([neg.reshape(-1, 3)] if neg is not None else [])
    pads = [pos_pad.reshape(-1)] + ([neg_pad.reshape(-1)] if neg is not None else [])
    texts, pads = np.concatenate(texts), np.concatenate(pads).astype(bool)
    sim = q[:, 0] @ texts.T
    out = {f"retrieval_accuracy@{k}": [] for k in ks}
    out["avg_rank"] = []
    out.update({f"ndcg@{k}": [] for k in ndcg_ks})
    for i in range(len(q)):
        if q_pad[i, 0]:
            continue
        live = np.flatnonzero(~pads)
        order = live[np.argsort(-sim[i, live], kind="stable")]
        relevant = {i * 2 + j for j in range(2) if not pos_pad[i, j]}
        rel = np.array([c in relevant for c in order], float)
        for k in ks:
            out[f"retrieval_accuracy@{k}"].append(rel[:k].any())
        out["avg_rank"].append(np.argmax(rel) + 1)
        for k in ndcg_ks:
            disc = 1 / np.log2(np.arange(2, k + 2))
            ideal = (np.sort(rel)[::-1][:k] * disc[: len(rel[:k])]).sum()
            out[f"ndcg@{k}"].append((rel[:k] * disc[: len(rel[:k])]).sum() / ideal)
    return {k: float(np.mean(v)) for k, v in out.items()}, sim, pads


@pytest.mark.parametrize("negatives", [True, False])
def test_metrics_of_similarity_matrix(negatives):
    q, q_pad, pos, pos_pad, neg, neg_pad = _data(negatives=negatives)
    expected, sim, pads = _reference(q, q_pad, pos, pos_pad, neg, neg_pad, [1, 3], [2, 5])
    got = calculate_retrieval_metrics_from_similarity_matrix(
        sim=sim,
        text_positive_paddings=pos_pad,
        query_paddings=q_pad,
        text_paddings=pads.astype(np.float32),
        top_ks_for_accuracy=[1, 3],
        top_ks_for_ndcg=[2, 5],
    )
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert float(got[key]) == pytest.approx(value, abs=1e-5), key


def test_calculator_over_batches_with_empty_negatives():
    q, q_pad, pos, pos_pad, _, _ = _data(seed=1, negatives=False)
    expected, _, _ = _reference(q, q_pad, pos, pos_pad, None, None, [2], [])
    model = _EchoModel.default_config().set(name="model").instantiate(parent=None)
    calc = (
        TextDualEncoderMetricCalculator.default_config()
        .set(name="calc", left_encoder_name=Q, right_encoder_name=T, top_ks_for_accuracy=[2])
        .instantiate(parent=None, model=model, model_param_partition_specs={})
    )
    state = calc.init_state(prng_key=jax.random.PRNGKey(0), model_params={})
    outputs = []
    for start in range(0, 6, 2):
        s = slice(start, start + 2)
        batch = {
            Q: {POSITIVE_PADDINGS: q_pad[s]},
            T: {POSITIVE_PADDINGS: pos_pad[s], NEGATIVE_PADDINGS: np.zeros((2, 0))},
            "predicted": {
                Q: {POSITIVE_EMBEDDINGS: q[s]},
                T: {POSITIVE_EMBEDDINGS: pos[s], NEGATIVE_EMBEDDINGS: np.zeros((2, 0, 3))},
            },
        }
        result = calc.forward(batch, model_params={}, state=state)
        state = result["state"]
        outputs.append(result["output"])
    summaries = calc.get_summaries(model_params={}, state=state, all_forward_outputs=outputs)
    assert set(summaries) == {"retrieval_accuracy@2", "avg_rank"}
    for key, value in expected.items():
        assert float(summaries[key]) == pytest.approx(value, abs=1e-5), key
