"""Tests of axlearn.common.text_dual_encoder against NumPy references (and HF DistilBERT)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from axlearn.common.config import config_for_function
from axlearn.common.distilbert import set_distilbert_config
from axlearn.common.layers import L2Norm, Linear, RedirectToSharedModule
from axlearn.common.module import functional as F
from axlearn.common.schedule import polynomial
from axlearn.common.text_dual_encoder import (
    NEGATIVE_EMBEDDINGS,
    NEGATIVE_INPUT_IDS,
    NEGATIVE_PADDINGS,
    NUM_VALID_RANKING_PAIRS,
    PAIRWISE_LOSS_EMBEDDINGS,
    PAIRWISE_LOSS_PADDINGS,
    POSITIVE_EMBEDDINGS,
    POSITIVE_INPUT_IDS,
    POSITIVE_PADDINGS,
    RANKS,
    SIMILARITY_MATRIX,
    TEXT_DUAL_ENCODER_SHARED_MODULE_NAME,
    FLOPsLossLayer,
    RankingPairwiseLossLayer,
    TextEmbeddingAsymmetricContrastiveLossLayer,
    TextEmbeddingDualEncoder,
    TextEmbeddingStreamEncoder,
    flatten_and_concat_embeddings,
)
from tests.common import test_distilbert as hf_distilbert

Q, D = "query_encoder", "doc_encoder"


def _call(layer, state, input_batch, is_training=False):
    return F(
        layer,
        is_training=is_training,
        prng_key=jax.random.PRNGKey(0),
        state=state,
        inputs=dict(input_batch=input_batch),
    )


def _stream_cfg(output_dim=hf_distilbert.DIM, **kwargs):
    text = set_distilbert_config(
        vocab_size=hf_distilbert.VOCAB,
        num_layers=hf_distilbert.LAYERS,
        model_dim=hf_distilbert.DIM,
        num_heads=hf_distilbert.HEADS,
        max_seq_len=hf_distilbert.MAX_POS,
        feed_forward_dim=hf_distilbert.FF,
        feed_forward_act="exact_gelu",
        dropout_rate=0.0,
    )
    return TextEmbeddingStreamEncoder.default_config().set(
        text_encoder=text, output_dim=output_dim, **kwargs
    )


def _np_softmax_xent(logits, labels):
    logits = logits - logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return -logp[np.arange(len(labels)), labels]


def test_stream_encoder_projects_and_normalizes_hf_cls_states():
    hf = hf_distilbert._hf_model(seed=2)
    out_dim = 6
    cfg = _stream_cfg(
        output_dim=out_dim,
        hidden_dim=hf_distilbert.DIM,
        output_proj=Linear.default_config().set(bias=True),
        output_norm=L2Norm.default_config(),
    )
    layer = cfg.set(name="stream").instantiate(parent=None)
    state = layer.initialize_parameters_recursively(jax.random.PRNGKey(3))
    state["text_encoder"] = hf_distilbert._converted(layer.text_encoder, hf)
    rng = np.random.default_rng(0)
    state["output_proj"]["bias"] = jnp.asarray(rng.normal(size=out_dim), jnp.float32)
    pos = rng.integers(1, hf_distilbert.VOCAB, size=(2, 2, 7)).astype(np.int32)
    pos[1, 1, 4:] = 0
    # One field (each field is traced apart); the negatives are encoded in the tests below.
    batch = {POSITIVE_INPUT_IDS: pos, "other": np.ones(2)}
    out = jax.jit(lambda st, b: _call(layer, st, b)[0])(state, batch)  # Eager is slow.
    assert set(out) == {POSITIVE_INPUT_IDS, "other", POSITIVE_EMBEDDINGS}
    w = np.asarray(state["output_proj"]["weight"])
    b = np.asarray(state["output_proj"]["bias"])
    for ids, key in ((pos, POSITIVE_EMBEDDINGS),):
        flat = ids.reshape(-1, ids.shape[-1])
        with torch.no_grad():
            cls = hf(
                input_ids=torch.tensor(flat, dtype=torch.long),
                attention_mask=torch.tensor(flat != 0, dtype=torch.long),
            ).last_hidden_state.numpy()[:, 0]
        proj = cls @ w + b
        expected = proj / np.sqrt((proj**2).sum(-1, keepdims=True) + 1e-8)
        np.testing.assert_allclose(
            np.asarray(out[key]), expected.reshape(ids.shape[0], ids.shape[1], -1), atol=1e-5
        )


def test_stream_encoder_skips_missing_and_empty_fields():
    layer = _stream_cfg().set(name="stream").instantiate(parent=None)
    state = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    batch = {
        POSITIVE_INPUT_IDS: np.ones((2, 1, 5), np.int32),
        NEGATIVE_INPUT_IDS: np.ones((2, 0, 5)),
    }
    out, _ = _call(layer, state, batch)
    assert out[POSITIVE_EMBEDDINGS].shape == (2, 1, hf_distilbert.DIM)
    assert NEGATIVE_EMBEDDINGS not in out and PAIRWISE_LOSS_EMBEDDINGS not in out


def test_stream_encoder_needs_output_proj_for_another_dim():
    with pytest.raises(AssertionError, match=r"stream: output_proj can't be None"):
        _stream_cfg(output_dim=4, hidden_dim=hf_distilbert.DIM).set(name="stream").instantiate(
            parent=None
        )


def test_flatten_orders_positives_then_negatives():
    left = np.arange(4.0).reshape(2, 1, 2)
    pos = np.arange(8.0).reshape(2, 2, 2)
    neg = -np.arange(4.0).reshape(2, 1, 2)
    out = flatten_and_concat_embeddings(
        left_positive_embeddings=left,
        right_positive_embeddings=pos,
        right_positive_paddings=np.array([[0, 1], [0, 0]]),
        right_negative_embeddings=neg,
        right_negative_paddings=np.array([[1], [0]]),
    )
    np.testing.assert_array_equal(out["flattened_left_embeddings"], left[:, 0])
    np.testing.assert_array_equal(
        out["flattened_right_embeddings"], np.concatenate([pos.reshape(4, 2), neg.reshape(2, 2)])
    )
    np.testing.assert_array_equal(out["right_paddings"], [0, 1, 0, 0, 1, 0])


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_contrastive_loss_matches_numpy(scale):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(3, 1, 4)).astype(np.float32)
    pos = rng.normal(size=(3, 1, 4)).astype(np.float32)
    neg = rng.normal(size=(3, 2, 4)).astype(np.float32)
    neg_pad = np.array([[0, 1], [0, 0], [1, 1]])
    layer = (
        TextEmbeddingAsymmetricContrastiveLossLayer.default_config()
        .set(name="c", left_encoder_name=Q, right_encoder_name=D)
        .set(contrastive_loss_scale_factor=scale)
        .instantiate(parent=None)
    )
    batch = {
        Q: {POSITIVE_EMBEDDINGS: q},
        D: {
            POSITIVE_EMBEDDINGS: pos,
            POSITIVE_PADDINGS: np.zeros((3, 1)),
            NEGATIVE_EMBEDDINGS: neg,
            NEGATIVE_PADDINGS: neg_pad,
        },
    }
    (loss, aux), _ = _call(layer, {}, batch)
    keys = np.concatenate([pos[:, 0], neg.reshape(-1, 4)])
    sim = q[:, 0] @ keys.T
    np.testing.assert_allclose(np.asarray(aux[SIMILARITY_MATRIX]), sim, atol=1e-5)
    live = np.concatenate([np.ones(3), 1 - neg_pad.reshape(-1)]).astype(bool)
    expected = _np_softmax_xent((sim * scale)[:, live], np.arange(3)).mean()
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_ranking_pairwise_loss_matches_brute_force():
    rng = np.random.default_rng(2)
    q = rng.normal(size=(2, 1, 3)).astype(np.float32)
    cands = rng.normal(size=(2, 4, 3)).astype(np.float32)
    ranks = np.array([[1, 3, 2, 2], [2, 1, 4, 3]])
    pads = np.array([[0, 0, 0, 1], [0, 0, 0, 0]])
    layer = (
        RankingPairwiseLossLayer.default_config()
        .set(name="r", left_encoder_name=Q, right_encoder_name=D, pairwise_loss_scale_factor=1.5)
        .instantiate(parent=None)
    )
    batch = {
        Q: {POSITIVE_EMBEDDINGS: q},
        D: {PAIRWISE_LOSS_EMBEDDINGS: cands, PAIRWISE_LOSS_PADDINGS: pads, RANKS: ranks},
    }
    (loss, aux), _ = _call(layer, {}, batch)
    terms = []
    for b in range(2):
        s = 1.5 * cands[b] @ q[b, 0]
        r = ranks[b] * (1 - pads[b])
        for i in range(4):
            for j in range(4):
                if 0 < r[i] < r[j]:  # i ranks better: loss log(1 + exp(s_j - s_i)).
                    terms.append(np.log1p(np.exp(s[j] - s[i])))
    assert int(aux[NUM_VALID_RANKING_PAIRS]) == len(terms) == 9
    np.testing.assert_allclose(float(loss), np.mean(terms), rtol=1e-5)


def test_flops_loss_matches_numpy_and_steps_its_schedule():
    rng = np.random.default_rng(3)
    left = np.abs(rng.normal(size=(2, 1, 5))).astype(np.float32)
    pos = rng.normal(size=(2, 2, 5)).astype(np.float32)
    neg = rng.normal(size=(2, 1, 5)).astype(np.float32)
    pos_pad, neg_pad = np.array([[0, 1], [0, 0]]), np.array([[0], [1]])
    layer = (
        FLOPsLossLayer.default_config()
        .set(name="f", left_encoder_name=Q, right_encoder_name=(D, "sparse"))
        .set(
            flops_weight_schedule=config_for_function(polynomial).set(
                begin_step=0, end_step=2, begin_value=0.0, end_value=1.0, power=1
            ),
            left_encoder_flops_loss_weight=0.5,
            right_encoder_flops_loss_weight=2.0,
        )
        .instantiate(parent=None)
    )
    state = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    assert int(state["step"]) == 0
    batch = {
        Q: {POSITIVE_EMBEDDINGS: left},
        D: {
            "sparse": {
                POSITIVE_EMBEDDINGS: pos,
                POSITIVE_PADDINGS: pos_pad,
                NEGATIVE_EMBEDDINGS: neg,
                NEGATIVE_PADDINGS: neg_pad,
            }
        },
    }

    def np_flops(x, pad):
        valid = x[pad == 0]
        return float((np.abs(valid).mean(axis=0) ** 2).sum())

    right = np.concatenate([pos.reshape(-1, 5), neg.reshape(-1, 5)])
    right_pad = np.concatenate([pos_pad.reshape(-1), neg_pad.reshape(-1)])
    per_step = 0.5 * np_flops(left[:, 0], np.zeros(2)) + 2.0 * np_flops(right, right_pad)
    for step, weight in enumerate([0.0, 0.5, 1.0, 1.0]):
        (loss, _), collections = _call(layer, state, batch, is_training=True)
        np.testing.assert_allclose(float(loss), weight * per_step, rtol=1e-5)
        state = dict(state, step=collections.state_updates["step"])
        assert int(state["step"]) == step + 1
    summaries = collections.summaries
    assert f"{Q}_flops_loss" in summaries and f"{(D, 'sparse')}_avg_sparsity_count" in summaries


def _dual_cfg(shared: bool):
    contrastive = TextEmbeddingAsymmetricContrastiveLossLayer.default_config().set(
        left_encoder_name=Q, right_encoder_name=D, contrastive_loss_scale_factor=3.0
    )
    right = (
        RedirectToSharedModule.default_config().set(
            shared_module=TEXT_DUAL_ENCODER_SHARED_MODULE_NAME
        )
        if shared
        else _stream_cfg()
    )
    return TextEmbeddingDualEncoder.default_config().set(
        name="dual",
        stream_encoder={Q: _stream_cfg(), D: right},
        fusion_network={"contrastive": contrastive},
        loss_weights={"contrastive": 0.5},
        shared_encoder_name=Q if shared else None,
    )


@pytest.mark.parametrize("shared", [False, True])
def test_dual_encoder_loss_is_the_weighted_contrastive_loss_of_its_encoders(shared):
    model = _dual_cfg(shared).instantiate(parent=None)
    state = model.initialize_parameters_recursively(jax.random.PRNGKey(4))
    if shared:
        assert state[D] == {} and state[Q]
    rng = np.random.default_rng(4)
    q_ids = rng.integers(1, hf_distilbert.VOCAB, size=(2, 1, 6)).astype(np.int32)
    d_ids = rng.integers(1, hf_distilbert.VOCAB, size=(2, 1, 6)).astype(np.int32)
    n_ids = rng.integers(1, hf_distilbert.VOCAB, size=(2, 2, 6)).astype(np.int32)
    n_pad = np.array([[0, 1], [0, 0]])
    batch = {
        Q: {POSITIVE_INPUT_IDS: q_ids},
        D: {
            POSITIVE_INPUT_IDS: d_ids,
            POSITIVE_PADDINGS: np.zeros((2, 1)),
            NEGATIVE_INPUT_IDS: n_ids,
            NEGATIVE_PADDINGS: n_pad,
        },
    }
    (loss, _), summaries = jax.jit(
        lambda st, b: (lambda out, col: (out, col.summaries))(*_call(model, st, b))
    )(state, batch)
    # Reference: each encoder alone, then the NumPy contrastive loss.
    stream = _stream_cfg().set(name="s").instantiate(parent=None)
    right_state = state[Q] if shared else state[D]
    q_emb = np.asarray(_call(stream, state[Q], {POSITIVE_INPUT_IDS: q_ids})[0][POSITIVE_EMBEDDINGS])
    d_out = _call(stream, right_state, {POSITIVE_INPUT_IDS: d_ids, NEGATIVE_INPUT_IDS: n_ids})[0]
    keys = np.concatenate(
        [
            np.asarray(d_out[POSITIVE_EMBEDDINGS])[:, 0],
            np.asarray(d_out[NEGATIVE_EMBEDDINGS]).reshape(4, -1),
        ]
    )
    sim = 3.0 * q_emb[:, 0] @ keys.T
    live = np.concatenate([np.ones(2), 1 - n_pad.reshape(-1)]).astype(bool)
    expected = _np_softmax_xent(sim[:, live], np.arange(2)).mean()
    np.testing.assert_allclose(float(summaries["loss_contrastive"]), expected, rtol=1e-4)
    np.testing.assert_allclose(float(loss), 0.5 * expected, rtol=1e-4)
    single, _ = F(
        model,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        state=state,
        inputs=dict(input_batch={Q: {POSITIVE_INPUT_IDS: q_ids}}, encoder_name=Q),
        method="forward_single_stream_encoder",
    )
    np.testing.assert_allclose(np.asarray(single[POSITIVE_EMBEDDINGS]), q_emb, atol=1e-6)


def test_dual_encoder_config_errors_name_the_path():
    cfg = _dual_cfg(shared=False).set(shared_encoder_name="nope")
    with pytest.raises(ValueError, match=r"dual: shared_encoder_name 'nope'"):
        cfg.instantiate(parent=None)
    cfg = _dual_cfg(shared=False)
    cfg.fusion_network = {Q: cfg.fusion_network["contrastive"]}
    with pytest.raises(ValueError, match=r"dual: stream_encoder and fusion_network share"):
        cfg.instantiate(parent=None)
