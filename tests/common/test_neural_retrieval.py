"""Tests axlearn.common.neural_retrieval against Hugging Face DPR encoders and a NumPy loss.

The encoders are `transformers.DPRQuestionEncoder` / `DPRContextEncoder` built from a config (no
download), their weights converted to ours. The same data is AXLearn's neural_retrieval_test
golden, shipped in axlearn/experiments/testdata (regenerate with AXLEARN_UPDATE_GOLDENS=1).
"""

import jax
import numpy as np
import pytest
import torch
import transformers

from axlearn.common import utils
from axlearn.common.module import functional as F
from axlearn.common.neural_retrieval import (
    PASSAGE_ENCODER_NAME,
    QUERY_ENCODER_NAME,
    set_bert_dpr_encoder_config,
    set_dpr_model_config,
    set_siamese_dpr_model_config,
)
from axlearn.common.text_dual_encoder import (
    POSITIVE_EMBEDDINGS,
    POSITIVE_INPUT_IDS,
    POSITIVE_PADDINGS,
)
from tests.common.hf_bert_conversion import (
    BERT_NAMES,
    check_golden,
    encoder_weights,
    numpy_state_dict,
    state_from_flat,
)

GOLDEN_MODULE = "axlearn.common.neural_retrieval_test"
# AXLearn's test setup.
_KWARGS = dict(
    pad_token_id=0,
    max_seq_len=12,
    vocab_size=30522,
    num_layers=3,
    model_dim=32,
    num_heads=8,
    feed_forward_act="exact_gelu",
)
_USED_IDS = 64  # The ids the inputs use; the other token embeddings are zeros (a small file).


def _golden_cases() -> dict:
    cases = {}
    for seed, (name, klass, prefix) in enumerate(
        (
            ("test_dpr_question_encoder", transformers.DPRQuestionEncoder, "question_encoder."),
            ("test_dpr_context_encoder", transformers.DPRContextEncoder, "ctx_encoder."),
        )
    ):
        hf_cfg = transformers.DPRConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=8,
            intermediate_size=128,
            max_position_embeddings=12,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            layer_norm_eps=1e-12,
        )
        torch.manual_seed(seed)
        hf = klass(hf_cfg)
        bert = getattr(hf, prefix[:-1]).bert_model
        with torch.no_grad():
            bert.embeddings.word_embeddings.weight[_USED_IDS:] = 0
            for pname, p in bert.named_parameters():
                if "LayerNorm" in pname or pname.endswith("bias"):
                    p.add_(0.2 * torch.randn_like(p))
        hf.eval()
        rng = np.random.default_rng(seed)
        ids = rng.integers(1, _USED_IDS, size=(3, 12)).astype(np.int32)
        ids[0, 7:] = 0
        ids[2, 3:] = 0
        with torch.no_grad():
            emb = hf(
                input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(ids != 0, dtype=torch.long),
            ).pooler_output.numpy()
        params = encoder_weights(
            numpy_state_dict(hf), prefix + "bert_model.", dim=32, heads=8, layers=3,
            names=BERT_NAMES, ours="text_encoder/encoder/",
        )  # fmt: skip
        cases[name] = dict(
            params=params,
            inputs=dict(positive_input_ids=ids[:, None]),
            outputs=dict(positive_embeddings=emb[:, None]),
        )
    return cases


def _nested(flat: dict) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


@pytest.mark.slow  # Two HF models, about 15 s on 2 loaded cores.
def test_dpr_encoders_match_hf():
    cases = _golden_cases()
    check_golden(GOLDEN_MODULE, {k: dict(v, params=_nested(v["params"])) for k, v in cases.items()})
    layer = set_bert_dpr_encoder_config(**_KWARGS).set(name="test").instantiate(parent=None)
    assert layer.config.output_proj is None and layer.config.output_norm is None
    fwd = jax.jit(
        lambda state, ids: F(
            layer,
            inputs=dict(input_batch={POSITIVE_INPUT_IDS: ids}),
            state=state,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
        )[0][POSITIVE_EMBEDDINGS]
    )
    for case in cases.values():
        out = fwd(state_from_flat(layer, case["params"]), case["inputs"]["positive_input_ids"])
        np.testing.assert_allclose(
            out, case["outputs"]["positive_embeddings"], atol=1e-5, rtol=1e-5
        )


@pytest.mark.slow  # Three compiles of two encoders, about 20 s on 2 loaded cores.
def test_dpr_dual_encoder_loss_matches_numpy():
    small = dict(_KWARGS, vocab_size=40, num_layers=1, model_dim=16, num_heads=2)
    model = set_dpr_model_config(
        query_encoder_cfg=set_bert_dpr_encoder_config(**small),
        passage_encoder_cfg=set_bert_dpr_encoder_config(**small),
        contrastive_loss_scale_factor=5.0,
    )
    model = model.set(name="dpr").instantiate(parent=None)
    state = model.initialize_parameters_recursively(jax.random.PRNGKey(1))
    assert {PASSAGE_ENCODER_NAME, QUERY_ENCODER_NAME} <= set(state), sorted(state)
    rng = np.random.default_rng(3)
    batch = {
        QUERY_ENCODER_NAME: {POSITIVE_INPUT_IDS: rng.integers(1, 40, (4, 1, 12)).astype(np.int32)},
        PASSAGE_ENCODER_NAME: {
            POSITIVE_INPUT_IDS: rng.integers(1, 40, (4, 1, 12)).astype(np.int32),
            POSITIVE_PADDINGS: np.zeros((4, 1), bool),
        },
    }
    (loss, aux), _ = F(
        model,
        inputs=dict(input_batch=batch),
        state=state,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        method="forward",
    )
    encode = {
        name: F(
            model,
            inputs=dict(input_batch=batch, encoder_name=name),
            state=state,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
            method="forward_single_stream_encoder",
        )[0][POSITIVE_EMBEDDINGS][:, 0]
        for name in (QUERY_ENCODER_NAME, PASSAGE_ENCODER_NAME)
    }
    q, p = np.asarray(encode[QUERY_ENCODER_NAME]), np.asarray(encode[PASSAGE_ENCODER_NAME])
    logits = 5.0 * q @ p.T
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(loss, -np.mean(np.diag(log_probs)), rtol=1e-5, atol=1e-6)
    del aux


def test_siamese_dpr_shares_one_encoder():
    small = dict(_KWARGS, vocab_size=40, num_layers=1, model_dim=16, num_heads=2)
    siamese = set_siamese_dpr_model_config(
        shared_encoder_cfg=set_bert_dpr_encoder_config(**small)
    ).set(name="dpr")
    assert siamese.shared_encoder_name == QUERY_ENCODER_NAME
    model = siamese.instantiate(parent=None)
    specs = model.create_parameter_specs_recursively()
    paths = [path for path, _ in utils.flatten_items(specs)]
    assert paths and not any(PASSAGE_ENCODER_NAME in path for path in paths)
