"""Parity with Hugging Face `transformers` LlamaForCausalLM via axlearn.common.hf_llama."""

import jax
import numpy as np
import pytest
import torch
import transformers

from axlearn.common.hf_llama import axlearn_to_hf_llama, hf_llama_to_axlearn
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, HIDDEN, THETA = 96, 64, 2, 4, 2, 112, 500000.0


def _hf_model(tied: bool):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rope_theta=THETA,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    # Non-trivial norm scales so that their conversion is tested too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model


def _our_model(*, stack: str, fused_qkv: bool, tied: bool):
    cfg = transformer_lm_config(
        num_layers=LAYERS,
        model_dim=DIM,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        hidden_dim=HIDDEN,
        vocab_size=VOCAB,
        rope_theta=THETA,
        norm_eps=1e-5,
        stack=stack,
        fused_qkv=fused_qkv,
        tied_embedding=tied,
    )
    return cfg.set(name="model").instantiate(parent=None)


@pytest.mark.parametrize(
    "stack,fused_qkv,tied",
    [("repeat", True, True), ("stack", False, False)],
)
def test_logits_match_transformers_and_round_trip(stack, fused_qkv, tied):
    hf = _hf_model(tied)
    model = _our_model(stack=stack, fused_qkv=fused_qkv, tied=tied)
    target = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
    state_dict = hf.state_dict()
    params = hf_llama_to_axlearn(state_dict, target=target)

    ids = np.random.default_rng(0).integers(0, VOCAB, size=(2, 16))
    with torch.no_grad():
        expected = hf(torch.tensor(ids)).logits.numpy()

    @jax.jit
    def logits_fn(params, ids):
        (_, aux), _ = functional(
            model,
            None,
            params,
            dict(input_batch=dict(input_ids=ids), return_aux=True),
            is_training=False,
        )
        return aux["logits"]

    ours = np.asarray(logits_fn(params, ids))
    assert np.abs(ours - expected).max() < 1e-4, np.abs(ours - expected).max()

    back = axlearn_to_hf_llama(params, num_heads=HEADS, num_kv_heads=KV_HEADS)
    assert sorted(back) == sorted(state_dict)
    for key, value in state_dict.items():
        np.testing.assert_array_equal(back[key], value.numpy(), err_msg=key)


def test_unsupported_parameters_are_errors():
    model = (
        transformer_lm_config(
            num_layers=LAYERS,
            model_dim=DIM,
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            hidden_dim=HIDDEN,
            vocab_size=VOCAB,
            qk_norm=True,
        )
        .set(name="model")
        .instantiate(parent=None)
    )
    target = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
    hf = _hf_model(True)
    with pytest.raises(ValueError, match=r"scale_(query|key)/norm/scale has no counterpart"):
        hf_llama_to_axlearn(hf.state_dict(), target=target)
