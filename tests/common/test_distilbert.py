"""Tests of axlearn.common.distilbert against Hugging Face `transformers` DistilBertModel (CPU)."""

import jax
import numpy as np
import pytest
import torch
import transformers

from axlearn.common.attention import RepeatedTransformerLayer, StackedTransformerLayer
from axlearn.common.distilbert import set_distilbert_config
from axlearn.common.layers import Dropout, LayerNorm
from axlearn.common.module import functional as F
from axlearn.common.poolings import AveragePooling, FirstNTokenPooling
from axlearn.common.text_encoder import ENCODED_HIDDEN_STATES, TEXT_EMBEDDINGS
from tests.common.hf_bert_conversion import (
    DISTILBERT_NAMES,
    check_golden,
    encoder_weights,
    numpy_state_dict,
    state_from_flat,
)

VOCAB, DIM, HEADS, LAYERS, FF, MAX_POS = 40, 16, 4, 2, 48, 12


def _hf_model(seed: int = 0):
    """A seeded HF DistilBertModel with non-trivial norms and biases."""
    cfg = transformers.DistilBertConfig(
        vocab_size=VOCAB,
        dim=DIM,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=FF,
        max_position_embeddings=MAX_POS,
        dropout=0.0,
        attention_dropout=0.0,
        activation="gelu",  # The exact (erf) GELU: "exact_gelu".
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = transformers.DistilBertModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _ours(**kwargs):
    cfg = set_distilbert_config(
        vocab_size=VOCAB,
        num_layers=LAYERS,
        model_dim=DIM,
        num_heads=HEADS,
        max_seq_len=MAX_POS,
        feed_forward_dim=FF,
        feed_forward_act="exact_gelu",
        dropout_rate=0.0,
        **kwargs,
    )
    return cfg.set(name="distilbert").instantiate(parent=None)


def _ids():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(3, 10)).astype(np.int32)
    ids[1, 7:] = 0
    ids[2, 4:] = 0
    return ids


def _run(model, state, ids):
    out, _ = jax.jit(
        lambda s, x: F(
            model,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
            state=s,
            inputs=dict(input_ids=x),
        )
    )(state, ids)
    return out


def _hf_hidden(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
        ).last_hidden_state.numpy()


def _converted(model, hf) -> dict:
    flat = encoder_weights(
        numpy_state_dict(hf), "", dim=DIM, heads=HEADS, layers=LAYERS, names=DISTILBERT_NAMES
    )
    return state_from_flat(model, flat)


def test_matches_hf_distilbert_model():
    hf = _hf_model()
    model = _ours()
    ids = _ids()
    out = _run(model, _converted(model, hf), ids)
    ref = _hf_hidden(hf, ids)
    live = ids != 0
    hidden = np.asarray(out[ENCODED_HIDDEN_STATES])
    assert hidden.shape == (3, 10, DIM)
    np.testing.assert_allclose(hidden[live], ref[live], atol=1e-5, rtol=1e-5)
    # The default pooler takes the first ([CLS]) token.
    emb = np.asarray(out[TEXT_EMBEDDINGS])
    assert emb.shape == (3, 1, DIM)
    np.testing.assert_allclose(emb, ref[:, :1], atol=1e-5, rtol=1e-5)


def test_average_pooler_matches_masked_mean_of_hf_states():
    hf = _hf_model(seed=1)
    model = _ours(pooler_config=AveragePooling.default_config())
    ids = _ids()
    out = _run(model, _converted(model, hf), ids)
    ref = _hf_hidden(hf, ids)
    live = (ids != 0)[..., None].astype(np.float32)
    expected = (ref * live).sum(axis=1) / live.sum(axis=1)
    np.testing.assert_allclose(
        np.asarray(out[TEXT_EMBEDDINGS])[:, 0], expected, atol=1e-5, rtol=1e-5
    )


def test_config_defaults_follow_hf_distilbert_base():
    cfg = set_distilbert_config()
    hf = transformers.DistilBertConfig()
    assert cfg.output_dim == hf.dim == 768
    assert cfg.pad_token_id == hf.pad_token_id == 0
    assert cfg.encoder.vocab_size == hf.vocab_size
    assert cfg.encoder.emb.pos_emb.shape == (hf.max_position_embeddings,)
    assert cfg.encoder.emb.type_emb is None
    stack = cfg.encoder.transformer
    assert stack.klass is StackedTransformerLayer
    assert stack.num_layers == hf.n_layers
    assert stack.layer.self_attention.attention.num_heads == hf.n_heads
    assert stack.layer.remat_spec is None
    assert cfg.pooler.klass is FirstNTokenPooling
    layer = cfg.set(name="d").instantiate(parent=None)
    ff = layer.encoder.transformer.layer0.feed_forward
    assert ff.linear1.config.output_dim == hf.hidden_dim == 3072


@pytest.mark.parametrize("eps,rate", [(1e-12, 0.1), (1e-6, 0.25)])
def test_eps_dropout_and_remat(eps, rate):
    cfg = set_distilbert_config(layer_norm_eps=eps, dropout_rate=rate, remat=True, num_layers=2)
    norms, dropouts = [], []

    def enter(_, value, default_kv):
        if isinstance(value, LayerNorm.Config):
            norms.append(value.eps)
        if isinstance(value, Dropout.Config):
            dropouts.append(value.rate)
        return default_kv

    cfg.visit(visit_fn=lambda *_: None, enter_fn=enter)
    assert norms and set(norms) == {eps}
    assert dropouts and set(dropouts) == {rate}
    assert cfg.encoder.transformer.klass is RepeatedTransformerLayer
    assert cfg.encoder.transformer.layer.remat_spec is not None


# AXLearn's distilbert_test reads this golden (its HF reference data, regenerated here from HF).
GOLDEN_MODULE = "axlearn.common.distilbert_test"
# The ids the golden inputs use: the other token embeddings are zeros (a small, compressed file).
_GOLDEN_IDS = 64


def _golden_case() -> dict:
    """AXLearn's test_distilbert setup (dim 32, 1 layer, 8 heads, ff 64, exact GELU) from HF."""
    cfg = transformers.DistilBertConfig(
        vocab_size=30522,
        dim=32,
        n_layers=1,
        n_heads=8,
        hidden_dim=64,
        max_position_embeddings=12,
        dropout=0.0,
        attention_dropout=0.0,
        activation="gelu",
        pad_token_id=0,
    )
    torch.manual_seed(5)
    hf = transformers.DistilBertModel(cfg)
    with torch.no_grad():
        hf.embeddings.word_embeddings.weight[_GOLDEN_IDS:] = 0
        for name, p in hf.named_parameters():
            if "layer_norm" in name or "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    hf.eval()
    rng = np.random.default_rng(5)
    ids = rng.integers(1, _GOLDEN_IDS, size=(3, 12)).astype(np.int32)
    ids[1, 8:] = 0
    ids[2, 3:] = 0
    ref = _hf_hidden(hf, ids)
    params = encoder_weights(
        numpy_state_dict(hf), "", dim=32, heads=8, layers=1, names=DISTILBERT_NAMES
    )
    return dict(params=params, inputs=dict(input_ids=ids), outputs=dict(text_embeddings=ref[:, :1]))


def test_axlearn_distilbert_golden_holds_hf_outputs():
    """The shipped golden equals fresh HF outputs, and our set_distilbert_config matches it."""
    case = _golden_case()
    check_golden(GOLDEN_MODULE, {"test_distilbert": case}, atol=1e-6)
    layer = (
        set_distilbert_config(
            vocab_size=30522,
            num_layers=1,
            model_dim=32,
            num_heads=8,
            max_seq_len=12,
            feed_forward_dim=64,
            feed_forward_act="exact_gelu",
            dropout_rate=0,
        )
        .set(name="test")
        .instantiate(parent=None)
    )
    state = state_from_flat(layer, case["params"])
    out = _run(layer, state, case["inputs"]["input_ids"])
    np.testing.assert_allclose(
        np.asarray(out[TEXT_EMBEDDINGS]), case["outputs"]["text_embeddings"], atol=1e-5, rtol=1e-5
    )
