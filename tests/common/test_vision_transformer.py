"""Tests axlearn.common.vision_transformer against Hugging Face's ViTModel (built on CPU)."""

import jax
import numpy as np
import pytest
import torch
from transformers import ViTConfig, ViTModel

from axlearn.common.module import functional as F
from axlearn.common.vision_transformer import build_vit_model_config, named_model_configs
from axlearn.vision.mask_generator import MaskingGenerator

DIM, HEADS, LAYERS, IMAGE, PATCH, FF = 16, 2, 2, 32, 8, 64


def _ours():
    cfg = build_vit_model_config(
        num_layers=LAYERS,
        model_dim=DIM,
        num_heads=HEADS,
        image_size=(IMAGE, IMAGE),
        patch_size=(PATCH, PATCH),
        feed_forward_dim=FF,
        dropout_rate=0.0,
    )
    model = cfg.set(name="vit").instantiate(parent=None)
    return model, model.initialize_parameters_recursively(jax.random.PRNGKey(1))


def _to_hf(params) -> ViTModel:
    hf_cfg = ViTConfig(
        hidden_size=DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FF,
        hidden_act="gelu_pytorch_tanh",  # jax.nn.gelu's tanh approximation.
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-6,
        image_size=IMAGE,
        patch_size=PATCH,
        num_channels=3,
        qkv_bias=True,
    )
    hf = ViTModel(hf_cfg, add_pooling_layer=False).eval()
    t = lambda x: torch.tensor(np.asarray(x, np.float32))  # noqa: E731
    enc = params["encoder_1d"]
    state = {
        "embeddings.cls_token": t(params["cls_token"]),
        "embeddings.position_embeddings": t(enc["pos_emb"]["weight"]),
        "embeddings.patch_embeddings.projection.weight": t(
            np.transpose(
                params["visual_embed"]["convert_to_sequence"]["conv"]["weight"], (3, 2, 0, 1)
            )
        ),
        "embeddings.patch_embeddings.projection.bias": t(
            params["visual_embed"]["convert_to_sequence"]["conv"]["bias"]
        ),
        "layernorm.weight": t(enc["output_norm"]["scale"]),
        "layernorm.bias": t(enc["output_norm"]["bias"]),
    }
    for i in range(LAYERS):
        layer = enc["transformer"][f"layer{i}"]
        att, ff = layer["self_attention"], layer["feed_forward"]
        pre = f"layers.{i}."  # transformers 5 names.
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = att["attention"]["i_proj"][name]
            state[pre + f"attention.{name}.weight"] = t(proj["weight"].reshape(DIM, -1).T)
            state[pre + f"attention.{name}.bias"] = t(proj["bias"].reshape(-1))
        o_proj = att["attention"]["o_proj"]
        state[pre + "attention.o_proj.weight"] = t(o_proj["weight"].reshape(DIM, -1))
        state[pre + "attention.o_proj.bias"] = t(o_proj["bias"])
        state[pre + "layernorm_before.weight"] = t(att["norm"]["scale"])
        state[pre + "layernorm_before.bias"] = t(att["norm"]["bias"])
        state[pre + "layernorm_after.weight"] = t(ff["norm"]["scale"])
        state[pre + "layernorm_after.bias"] = t(ff["norm"]["bias"])
        state[pre + "mlp.fc1.weight"] = t(ff["linear1"]["weight"].T)
        state[pre + "mlp.fc1.bias"] = t(ff["linear1"]["bias"])
        state[pre + "mlp.fc2.weight"] = t(ff["linear2"]["weight"].T)
        state[pre + "mlp.fc2.bias"] = t(ff["linear2"]["bias"])
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if "mask_token" not in k], missing
    return hf


def test_vit_matches_hf_vit_model():
    model, params = _ours()
    # Non-zero class token and biases so that every weight matters.
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: x + 0.05 * rng.standard_normal(x.shape).astype(x.dtype), params)
    image = rng.uniform(-1, 1, (2, IMAGE, IMAGE, 3)).astype(np.float32)
    ours, _ = F(
        model,
        inputs=dict(image=image),
        state=params,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
    )
    hf = _to_hf(params)
    with torch.no_grad():
        ref = hf(pixel_values=torch.tensor(image.transpose(0, 3, 1, 2))).last_hidden_state.numpy()
    np.testing.assert_allclose(np.asarray(ours["encoded_features"]), ref, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ours["embedding"]), ref[:, 0], atol=1e-5)
    side = IMAGE // PATCH
    np.testing.assert_allclose(
        np.asarray(ours["3"]), ref[:, 1:].reshape(2, side, side, DIM), atol=1e-5
    )


def test_named_sizes():
    cfgs = named_model_configs()
    b16 = cfgs["B16"]
    assert b16.output_dim == 768 and b16.encoder_1d.transformer.num_layers == 12
    assert b16.encoder_1d.pos_emb.shape == (197,)
    assert cfgs["H14"].num_cls_tokens == 0 and cfgs["H14"].encoder_1d.pos_emb.shape == (256,)
    assert "G14-repeat" in cfgs
    with pytest.raises(ValueError, match="global_feature_extraction"):
        build_vit_model_config(
            num_layers=1, model_dim=8, num_heads=2, global_feature_extraction="x"
        )


@pytest.mark.parametrize("count", [0, 50, 196])
def test_masking_generator_exact_count(count):
    mask = MaskingGenerator(input_size=(14, 14), num_masking_patches=count)()
    assert mask.shape == (14, 14) and mask.dtype == np.int32 and int(mask.sum()) == count
