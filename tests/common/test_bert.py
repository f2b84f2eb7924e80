"""Tests of axlearn.common.bert against Hugging Face `transformers` BERT models built on CPU."""

import os
from typing import Optional

import jax
import numpy as np
import pytest
import torch
import transformers

from axlearn.common import bert
from axlearn.common.golden import golden_path, load_golden
from axlearn.common.layers import BinaryClassificationMetric, set_layer_norm_eps_recursively
from axlearn.common.module import functional as F
from tests.common.hf_bert_conversion import (
    BERT_NAMES,
    encoder_weights,
    numpy_state_dict,
    state_from_flat,
)

VOCAB, DIM, HEADS, LAYERS, MAX_POS, TYPES = 48, 16, 4, 2, 12, 2
UPDATE_ENV = "AXLEARN_UPDATE_GOLDENS"


def _model_config(head: Optional[object] = None):
    cfg = bert.bert_model_config(
        vocab_size=VOCAB,
        hidden_dim=DIM,
        embedding_cfg=bert.bert_embedding_config(
            max_position_embeddings=MAX_POS, type_vocab_size=TYPES
        ),
        stack_cfg=bert.bert_transformer_config(num_layers=LAYERS, num_heads=HEADS),
        head_cfg=head,
    )
    return cfg.set(name="bert")


def _hf_config(**kwargs):
    return transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * DIM,
        max_position_embeddings=MAX_POS,
        type_vocab_size=TYPES,
        layer_norm_eps=1e-12,
        hidden_act="gelu_new",  # The tanh approximation, jax.nn.gelu's default ("nn.gelu").
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
        **kwargs,
    )


def _seeded(cls, cfg, seed: int = 0):
    """An HF model of class `cls` whose init depends only on `seed` (not on earlier tests)."""
    torch.manual_seed(seed)
    return _perturbed(cls(cfg))


def _perturbed(model):
    torch.manual_seed(0)
    with torch.no_grad():  # Non-trivial norms and biases, so their conversion is tested.
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _encoder_weights(sd: dict, prefix: str, hf_cfg=None) -> dict:
    """{our path: array} of the encoder from an HF BertModel state dict under `prefix`."""
    return encoder_weights(
        sd,
        prefix,
        dim=hf_cfg.hidden_size if hf_cfg else DIM,
        heads=hf_cfg.num_attention_heads if hf_cfg else HEADS,
        layers=hf_cfg.num_hidden_layers if hf_cfg else LAYERS,
        names=BERT_NAMES,
    )


_state = state_from_flat


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(2, 9)).astype(np.int32)
    ids[1, 6:] = 0
    types = rng.integers(0, TYPES, size=ids.shape).astype(np.int32)
    return ids, types


def _predict(model, state, ids, types):
    out, _ = jax.jit(
        lambda s, b: F(
            model,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
            state=s,
            inputs=dict(input_batch=b),
            method="predict",
        )
    )(state, dict(input_ids=ids, token_type_ids=types))
    return out


def test_mlm_logits_match_hf_bert_for_masked_lm():
    hf = _seeded(transformers.BertForMaskedLM, _hf_config())
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    # The decoder is tied to the word embeddings in both models.
    np.testing.assert_array_equal(
        sd["cls.predictions.decoder.weight"], sd["bert.embeddings.word_embeddings.weight"]
    )
    flat = _encoder_weights(sd, "bert.")
    flat.update(
        {
            "head/transform/linear/weight": sd["cls.predictions.transform.dense.weight"].T,
            "head/transform/linear/bias": sd["cls.predictions.transform.dense.bias"],
            "head/transform/norm/scale": sd["cls.predictions.transform.LayerNorm.weight"],
            "head/transform/norm/bias": sd["cls.predictions.transform.LayerNorm.bias"],
            "head/output_bias": sd["cls.predictions.bias"],
        }
    )
    model = _model_config().instantiate(parent=None)
    state = _state(model, flat)
    ids, types = _batch()
    ours = _predict(model, state, ids, types)
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            token_type_ids=torch.tensor(types, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
        ).logits.numpy()
    live = ids != 0
    np.testing.assert_allclose(np.asarray(ours["logits"])[live], ref[live], atol=1e-5, rtol=1e-5)
    # The loss skips ignored targets (id 0 by bert_lm_head_config), as a NumPy cross entropy.
    labels = np.where(np.arange(ids.shape[1]) % 3 == 0, ids, 0)
    batch = dict(input_ids=ids, token_type_ids=types, target_labels=labels)
    (loss, _), _ = jax.jit(
        lambda st, b: F(
            model,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
            state=st,
            inputs=dict(input_batch=b),
        )
    )(state, batch)
    logits = np.asarray(ours["logits"], np.float64)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    mask = labels != 0
    expected = -np.take_along_axis(log_p, labels[..., None], -1)[..., 0][mask].mean()
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_sequence_classification_matches_hf():
    hf = _seeded(transformers.BertForSequenceClassification, _hf_config(num_labels=3))
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    flat = _encoder_weights(sd, "bert.")
    flat.update(
        {
            "head/pooler/linear/weight": sd["bert.pooler.dense.weight"].T,
            "head/pooler/linear/bias": sd["bert.pooler.dense.bias"],
            "head/output/weight": sd["classifier.weight"].T,
            "head/output/bias": sd["classifier.bias"],
        }
    )
    head = bert.BertSequenceClassificationHead.default_config().set(num_classes=3)
    model = _model_config(head).instantiate(parent=None)
    state = _state(model, flat)
    ids, types = _batch()
    ours = _predict(model, state, ids, types)
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            token_type_ids=torch.tensor(types, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
        ).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours["logits"]), ref, atol=1e-5, rtol=1e-5)


def test_config_helpers():
    cfg = bert.bert_model_config(vocab_size=VOCAB)
    assert cfg.dim == 768 and cfg.encoder.transformer.num_layers == 12
    layer = cfg.encoder.transformer.layer
    assert layer.self_attention.structure == "postnorm"
    assert layer.feed_forward.structure == "postnorm"
    assert layer.self_attention.norm.eps == 1e-12 and cfg.encoder.emb.norm.eps == 1e-12
    assert cfg.head.num_classes == VOCAB and cfg.head.ignored_target_id == 0
    assert bert.bert_layer_norm_epsilon(np.float16) == 1e-3
    with pytest.raises(ValueError, match="at least 2"):
        bert.BertMultipleChoiceHead.default_config().set(
            name="h", input_dim=4, num_classes=1
        ).instantiate(parent=None)


# AXLearn's bert_test reads `load_golden("axlearn.common.bert_test", ...)`: its params (our
# layout), inputs and Hugging Face's outputs. The file shipped in axlearn/experiments/testdata
# is written here from HF models (regenerate with AXLEARN_UPDATE_GOLDENS=1) and checked below.
GOLDEN_MODULE = "axlearn.common.bert_test"
# The HF config of AXLearn's bert_test (its `ref_cfg`).
_AXLEARN_TEST_CFG = dict(
    vocab_size=24,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=20,
    type_vocab_size=2,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    hidden_act="gelu_new",
    classifier_dropout=0.0,
    layer_norm_eps=1e-12,
    pad_token_id=0,
)


_np_state = numpy_state_dict


def _pooler_head(sd: dict) -> dict:
    return {
        "head/pooler/linear/weight": sd["bert.pooler.dense.weight"].T,
        "head/pooler/linear/bias": sd["bert.pooler.dense.bias"],
        "head/output/weight": sd["classifier.weight"].T,
        "head/output/bias": sd["classifier.bias"],
    }


def _golden_cases() -> dict:
    """{test name: {"params/...", "inputs/...", "outputs/..." arrays}} from HF models."""
    cases = {}
    rng = np.random.default_rng(123)
    seq, batch = 8, 3

    def ids(shape, pad_from=None):
        x = rng.integers(2, 24, size=shape).astype(np.int32)
        if pad_from is not None:
            for row, start in enumerate(pad_from):
                x[row, start:] = 0
        return x

    for name, pad_from in (("test_for_mlm", None), ("test_for_mlm_with_padding", [8, 5, 3])):
        cfg = transformers.BertConfig(**_AXLEARN_TEST_CFG)
        hf = _seeded(transformers.BertForMaskedLM, cfg, seed=len(cases))
        input_ids = ids((batch, seq), pad_from)
        types = rng.integers(0, 2, size=input_ids.shape).astype(np.int32)
        masked = (rng.random(input_ids.shape) < 0.4) & (input_ids != 0)
        labels = np.where(masked, input_ids, -100).astype(np.int32)
        input_ids = np.where(masked, 1, input_ids).astype(np.int32)  # 1: [MASK].
        with torch.no_grad():
            out = hf(
                input_ids=torch.tensor(input_ids, dtype=torch.long),
                token_type_ids=torch.tensor(types, dtype=torch.long),
                attention_mask=torch.tensor(input_ids != 0, dtype=torch.long),
                labels=torch.tensor(labels, dtype=torch.long),
                output_hidden_states=True,
            )
        sd = _np_state(hf)
        params = _encoder_weights(sd, "bert.", cfg)
        params.update(
            {
                "head/transform/linear/weight": sd["cls.predictions.transform.dense.weight"].T,
                "head/transform/linear/bias": sd["cls.predictions.transform.dense.bias"],
                "head/transform/norm/scale": sd["cls.predictions.transform.LayerNorm.weight"],
                "head/transform/norm/bias": sd["cls.predictions.transform.LayerNorm.bias"],
                "head/output_bias": sd["cls.predictions.bias"],
            }
        )
        cases[name] = dict(
            params=params,
            inputs=dict(input_ids=input_ids, token_type_ids=types, target_labels=labels),
            outputs=dict(
                hidden_states_last=out.hidden_states[-1].numpy(),
                logits=out.logits.numpy(),
                loss=out.loss.numpy(),
            ),
        )
    for num_classes in (1, 2, 3):
        cfg = transformers.BertConfig(
            **_AXLEARN_TEST_CFG,
            num_labels=num_classes,
            problem_type="regression" if num_classes == 1 else "single_label_classification",
        )
        hf = _seeded(transformers.BertForSequenceClassification, cfg, seed=len(cases))
        input_ids = ids((batch, seq))
        if num_classes == 1:
            labels = rng.standard_normal(batch).astype(np.float32)
            torch_labels = torch.tensor(labels)
        else:
            labels = rng.integers(0, num_classes, size=batch).astype(np.int32)
            torch_labels = torch.tensor(labels, dtype=torch.long)
        with torch.no_grad():
            out = hf(input_ids=torch.tensor(input_ids, dtype=torch.long), labels=torch_labels)
        sd = _np_state(hf)
        cases[f"test_sequence_classification_{num_classes}"] = dict(
            params={**_encoder_weights(sd, "bert.", cfg), **_pooler_head(sd)},
            inputs=dict(input_ids=input_ids, target_labels=labels),
            outputs=dict(logits=out.logits.numpy(), loss=out.loss.numpy()),
        )
    cfg = transformers.BertConfig(**_AXLEARN_TEST_CFG)
    hf = _seeded(transformers.BertForMultipleChoice, cfg, seed=len(cases))
    input_ids = ids((batch, 2, seq))
    types = rng.integers(0, 2, size=input_ids.shape).astype(np.int32)
    labels = rng.integers(0, 2, size=batch).astype(np.int32)
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(input_ids, dtype=torch.long),
            token_type_ids=torch.tensor(types, dtype=torch.long),
            labels=torch.tensor(labels, dtype=torch.long),
        )
    sd = _np_state(hf)
    cases["test_multiple_choice_classification"] = dict(
        params={**_encoder_weights(sd, "bert.", cfg), **_pooler_head(sd)},
        inputs=dict(input_ids=input_ids, token_type_ids=types, target_labels=labels),
        outputs=dict(logits=out.logits.numpy(), loss=out.loss.numpy()),
    )
    cfg = transformers.BertConfig(
        **_AXLEARN_TEST_CFG, num_labels=2, problem_type="multi_label_classification"
    )
    hf = _seeded(transformers.BertForSequenceClassification, cfg, seed=len(cases))
    input_ids = ids((batch, seq))
    labels = rng.integers(0, 2, size=(batch, 2)).astype(np.int32)
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(input_ids, dtype=torch.long),
            labels=torch.tensor(labels, dtype=torch.float32),
        )
    sd = _np_state(hf)
    cases["test_sequence_binary_classification"] = dict(
        params={**_encoder_weights(sd, "bert.", cfg), **_pooler_head(sd)},
        inputs=dict(input_ids=input_ids, target_labels=labels),
        outputs=dict(logits=out.logits.numpy(), loss=out.loss.numpy()),
    )
    return cases


def _flat_case(case: dict) -> dict:
    flat = {}
    for group, values in case.items():
        for key, value in values.items():
            flat[f"{group}/{key}"] = np.asarray(value)
    return flat


@pytest.mark.slow  # Seven HF models and seven compiles (about a minute on 2 loaded cores).
def test_axlearn_bert_goldens_hold_hf_outputs():
    """The shipped bert_test golden equals fresh HF outputs (same seeds), and ours match it."""
    cases = _golden_cases()
    path = golden_path(GOLDEN_MODULE)
    if os.environ.get(UPDATE_ENV):
        arrays = {}
        for name, case in cases.items():
            arrays.update({f"{name}/{k}": v for k, v in _flat_case(case).items()})
        np.savez(path, **arrays)
    head_of = {
        "test_for_mlm": None,
        "test_for_mlm_with_padding": None,
        "test_multiple_choice_classification": bert.BertMultipleChoiceHead.default_config().set(
            num_classes=2
        ),
        "test_sequence_binary_classification": (
            bert.BertSequenceClassificationHead.default_config().set(
                num_classes=2, metric=BinaryClassificationMetric.default_config()
            )
        ),
    }
    for n in (1, 2, 3):
        head_of[f"test_sequence_classification_{n}"] = (
            bert.BertSequenceClassificationHead.default_config().set(num_classes=n)
        )
    for name, case in cases.items():
        golden = load_golden(GOLDEN_MODULE, name)
        stored = {k: v for k, v in _flat_case(golden).items() if not k.startswith("params/")}
        for key, value in _flat_case(case).items():
            if key.startswith("params/"):
                continue
            np.testing.assert_allclose(stored[key], value, atol=1e-5, err_msg=f"{name} {key}")
        cfg = bert.BertModel.default_config().set(
            name="bert",
            dim=16,
            vocab_size=24,
            encoder=bert.Encoder.default_config().set(
                dim=16,
                vocab_size=24,
                pad_token_id=0,
                emb=bert.bert_embedding_config(max_position_embeddings=20, type_vocab_size=2),
                transformer=bert.bert_transformer_config(num_layers=2, num_heads=4),
            ),
        )
        if head_of[name] is None:
            cfg.head = bert.bert_lm_head_config(
                base_cfg=cfg.head, vocab_size=24, ignored_target_id=-100, layer_norm_epsilon=1e-12
            )
        else:
            cfg.head = head_of[name]
        set_layer_norm_eps_recursively(cfg, 1e-12)
        model = cfg.instantiate(parent=None)
        state = _state(
            model,
            {
                k[len("params/") :]: v
                for k, v in _flat_case(case).items()
                if k.startswith("params/")
            },
        )
        inputs = golden["inputs"]
        (loss, aux), _ = jax.jit(
            lambda st, b, model=model: F(
                model,
                is_training=False,
                prng_key=jax.random.PRNGKey(0),
                state=st,
                inputs=dict(input_batch=b, return_aux=True),
            )
        )(state, inputs)
        live = 1.0
        if "mlm" in name:
            live = (inputs["input_ids"] != 0)[..., None]
        np.testing.assert_allclose(
            np.asarray(aux["logits"]) * live,
            golden["outputs"]["logits"] * live,
            atol=2e-5,
            err_msg=name,
        )
        np.testing.assert_allclose(
            float(loss), float(golden["outputs"]["loss"]), rtol=1e-5, err_msg=name
        )
