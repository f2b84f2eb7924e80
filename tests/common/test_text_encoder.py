"""Tests of axlearn.common.text_encoder: pooling of the encoder's states, against NumPy."""

import jax
import numpy as np
import pytest

from axlearn.common.bert import bert_embedding_config, bert_model_config, bert_transformer_config
from axlearn.common.module import functional as F
from axlearn.common.poolings import AveragePooling, FirstNTokenPooling, LastNTokenPooling
from axlearn.common.text_encoder import (
    ENCODED_HIDDEN_STATES,
    TEXT_EMBEDDINGS,
    TextEmbeddingEncoder,
)

VOCAB, DIM, PAD = 20, 8, 3


def _layer(pooler=None, hidden_dim=None, output_dim=DIM):
    encoder = bert_model_config(
        vocab_size=VOCAB,
        embedding_cfg=bert_embedding_config(max_position_embeddings=6),
        stack_cfg=bert_transformer_config(num_layers=1, num_heads=2),
    ).encoder
    cfg = TextEmbeddingEncoder.default_config().set(
        name="text", output_dim=output_dim, hidden_dim=hidden_dim, pad_token_id=PAD, encoder=encoder
    )
    if pooler is not None:
        cfg.pooler = pooler
    return cfg.instantiate(parent=None)


def _ids():
    ids = np.array([[5, 7, 9, 11, 4, 6], [8, 2, 10, PAD, PAD, PAD]], dtype=np.int32)
    return ids


def _run(layer, ids, state=None, method="forward", child=None):
    state = (
        state
        if state is not None
        else layer.initialize_parameters_recursively(jax.random.PRNGKey(1))
    )
    module = getattr(layer, child) if child else layer
    out, _ = F(
        module,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        state=state[child] if child else state,
        inputs=dict(input_ids=ids),
        method=method,
    )
    return out, state


def test_first_token_pooling_is_the_cls_state():
    layer = _layer()
    out, state = _run(layer, _ids())
    hidden = np.asarray(out[ENCODED_HIDDEN_STATES])
    assert hidden.shape == (2, 6, DIM)
    # The states are the encoder's, with padding given by pad_token_id (not 0).
    assert layer.encoder.config.pad_token_id == PAD
    direct, _ = _run(layer, _ids(), state=state, child="encoder")
    np.testing.assert_allclose(hidden, np.asarray(direct), atol=1e-6)
    np.testing.assert_allclose(np.asarray(out[TEXT_EMBEDDINGS]), hidden[:, :1], atol=1e-6)


@pytest.mark.parametrize("pooler", ["average", "last"])
def test_poolers_skip_pad_tokens(pooler):
    cfg = {
        "average": AveragePooling.default_config(),
        "last": LastNTokenPooling.default_config(),
    }[pooler]
    layer = _layer(pooler=cfg)
    ids = _ids()
    out, _ = _run(layer, ids)
    hidden = np.asarray(out[ENCODED_HIDDEN_STATES])
    live = ids != PAD
    if pooler == "average":
        expected = np.stack([hidden[b][live[b]].mean(axis=0) for b in range(2)])
    else:
        expected = np.stack([hidden[b][live[b]][-1] for b in range(2)])
    np.testing.assert_allclose(np.asarray(out[TEXT_EMBEDDINGS])[:, 0], expected, atol=1e-5)


def test_hidden_dim_sets_the_encoder_dim():
    layer = _layer(pooler=FirstNTokenPooling.default_config(), hidden_dim=6, output_dim=6)
    assert layer.encoder.config.dim == 6
    assert layer.pooler.config.input_dim == 6
    out, _ = _run(layer, _ids())
    assert out[TEXT_EMBEDDINGS].shape == (2, 1, 6)
