"""Tests of axlearn.common.t5x_param_converter: a T5X tree written from a Hugging Face T5 model.

HF's T5 and T5X hold the same weights (HF's Linear weights are T5X's kernels transposed, both
with the folded query scale), so a T5X tree is written from a randomly initialized HF model by
hand, converted, and our model's logits are compared with HF's (1e-5, float32).
"""

import jax
import numpy as np
import pytest
import torch
import transformers

from axlearn.common import t5
from axlearn.common.attention import RepeatedTransformerLayer
from axlearn.common.module import functional as F
from axlearn.common.t5x_param_converter import parameters_from_t5x_encoder_decoder

VOCAB, DIM, HEADS, LAYERS, D_FF = 24, 8, 2, 2, 21


def _hf_model(feed_forward_proj: str):
    cfg = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=DIM,
        d_kv=DIM // HEADS,
        d_ff=D_FF,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        feed_forward_proj=feed_forward_proj,
        tie_word_embeddings=False,  # T5 1.1: no rescaling of the decoder output.
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(cfg)
    with torch.no_grad():  # Non-trivial norm scales.
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight") or name.endswith("final_layer_norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def _t5x_tree(hf) -> dict:
    """The T5X parameter tree holding the weights of HF model `hf`."""
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}

    def kernel(name):
        return dict(kernel=sd[name].T)

    def attention(prefix):
        return {
            t5x: kernel(f"{prefix}.{hf_name}.weight")
            for t5x, hf_name in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
        }

    def mlp(prefix):
        names = ("wi_0", "wi_1", "wo") if f"{prefix}.wi_0.weight" in sd else ("wi", "wo")
        return {n: kernel(f"{prefix}.{n}.weight") for n in names}

    def scale(name):
        return dict(scale=sd[name])

    encoder = {
        "relpos_bias": dict(
            rel_embedding=sd[
                "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            ].T
        ),
        "encoder_norm": scale("encoder.final_layer_norm.weight"),
    }
    decoder = {
        "relpos_bias": dict(
            rel_embedding=sd[
                "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            ].T
        ),
        "decoder_norm": scale("decoder.final_layer_norm.weight"),
        "logits_dense": kernel("lm_head.weight"),
    }
    for i in range(LAYERS):
        e, d = f"encoder.block.{i}.layer", f"decoder.block.{i}.layer"
        encoder[f"layers_{i}"] = dict(
            pre_attention_layer_norm=scale(f"{e}.0.layer_norm.weight"),
            attention=attention(f"{e}.0.SelfAttention"),
            pre_mlp_layer_norm=scale(f"{e}.1.layer_norm.weight"),
            mlp=mlp(f"{e}.1.DenseReluDense"),
        )
        decoder[f"layers_{i}"] = dict(
            pre_self_attention_layer_norm=scale(f"{d}.0.layer_norm.weight"),
            self_attention=attention(f"{d}.0.SelfAttention"),
            pre_cross_attention_layer_norm=scale(f"{d}.1.layer_norm.weight"),
            encoder_decoder_attention=attention(f"{d}.1.EncDecAttention"),
            pre_mlp_layer_norm=scale(f"{d}.2.layer_norm.weight"),
            mlp=mlp(f"{d}.2.DenseReluDense"),
        )
    return dict(
        token_embedder=dict(embedding=sd["shared.weight"]), encoder=encoder, decoder=decoder
    )


def _model(arch: str = "t5-v1-1", base_cfg=None):
    cfg = t5.t5_encoder_decoder_config(
        vocab_size=VOCAB,
        dim=DIM,
        num_encoder_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_attention_heads=HEADS,
        dropout_rate=0.0,
        stack_cfg=t5.t5_transformer_stack_config(arch=arch, hidden_dim=D_FF, base_cfg=base_cfg),
    )
    return cfg.set(name="t5").instantiate(parent=None)


def _shapes(tree) -> dict:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "mesh_axes"))
    return {jax.tree_util.keystr(k): tuple(v.shape) for k, v in flat}


def test_converted_t5x_params_match_hf_logits():
    hf = _hf_model("gated-gelu")
    model = _model()
    state = parameters_from_t5x_encoder_decoder(_t5x_tree(hf), model)
    assert _shapes(state) == _shapes(model.create_parameter_specs_recursively())
    rng = np.random.default_rng(0)
    source = rng.integers(2, VOCAB, size=(2, 7)).astype(np.int32)
    source[1, 5:] = 0
    target = rng.integers(2, VOCAB, size=(2, 5)).astype(np.int32)
    target[:, 0] = 0
    batch = dict(source=dict(input_ids=source), target=dict(input_ids=target), target_labels=target)
    (_, aux), _ = jax.jit(
        lambda st, b: F(
            model,
            inputs=dict(input_batch=b, return_aux=True),
            state=st,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
        )
    )(state, batch)
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(source, dtype=torch.long),
            attention_mask=torch.tensor(source != 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(target, dtype=torch.long),
        ).logits.numpy()
    np.testing.assert_allclose(np.asarray(aux["logits"]), ref, atol=1e-5, rtol=1e-5)


def test_repeated_layers_and_relu_mlp():
    hf = _hf_model("relu")
    tree = _t5x_tree(hf)
    model = _model("t5-v1", base_cfg=RepeatedTransformerLayer.default_config())
    state = parameters_from_t5x_encoder_decoder(tree, model)
    assert _shapes(state) == _shapes(model.create_parameter_specs_recursively())
    ff = state["encoder"]["transformer"]["repeat"]["layer"]["feed_forward"]
    for i in range(LAYERS):
        np.testing.assert_array_equal(
            np.asarray(ff["linear1"]["weight"][i]),
            tree["encoder"][f"layers_{i}"]["mlp"]["wi"]["kernel"],
        )
    attention = state["decoder"]["transformer"]["repeat"]["layer"]["self_attention"]["attention"]
    q = np.asarray(attention["i_proj"]["q_proj"]["weight"][1])
    query = tree["decoder"]["layers_1"]["self_attention"]["query"]["kernel"]
    expected = query * np.sqrt(DIM // HEADS)
    np.testing.assert_allclose(q.reshape(DIM, DIM), expected, rtol=1e-6)


def test_bad_trees_raise():
    tree = _t5x_tree(_hf_model("gated-gelu"))
    model = _model()
    bad = dict(tree, extra={})
    with pytest.raises(ValueError, match=r"Unsupported T5X parameters under the root: \['extra'\]"):
        parameters_from_t5x_encoder_decoder(bad, model)
    bad = dict(tree, encoder=dict(tree["encoder"]))
    del bad["encoder"]["layers_1"]
    with pytest.raises(ValueError, match="has layers \\[0\\], expected 0..1"):
        parameters_from_t5x_encoder_decoder(bad, model)
