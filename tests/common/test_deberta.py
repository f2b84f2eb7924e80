"""Tests of axlearn.common.deberta against Hugging Face `DebertaV2Model` built on CPU.

Our models are initialized (norms and biases perturbed), their weights converted into HF's
layout and loaded into HF models built from a small `DebertaV2Config` (no download); the outputs
must agree within 1e-5 in float32.
"""

import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from axlearn.common import utils
from axlearn.common.attention import (
    FusedQKVLinear,
    RepeatedTransformerLayer,
    StackedTransformerLayer,
)
from axlearn.common.bert import BertPooler, BertSequenceClassificationHead
from axlearn.common.config import InvalidConfigValueError
from axlearn.common.deberta import (
    DeBERTaV2Encoder,
    DisentangledAttentionType,
    DisentangledSelfAttention,
    deberta_relative_position_bucket,
    deberta_v2_encoder_config,
    deberta_v2_model_config,
    deberta_v2_self_attention_config,
)
from axlearn.common.golden import golden_path, load_golden
from axlearn.common.layers import Embedding, set_layer_norm_eps_recursively
from axlearn.common.module import functional as F

C2P, P2C = DisentangledAttentionType.C2P, DisentangledAttentionType.P2C
VOCAB, DIM, HEADS, LAYERS, SEQ = 40, 16, 4, 2, 12
EPS = 1e-7


def hf_config(
    *,
    attention_type,
    share: bool,
    max_distance: int,
    buckets: Optional[int],
    max_pos: Optional[int] = SEQ,
    dim: int = DIM,
    heads: int = HEADS,
    layers: int = LAYERS,
    vocab: int = VOCAB,
    eps: float = EPS,
    **kwargs,
) -> transformers.DebertaV2Config:
    """The HF config computing what ours does (see the deberta module docstring)."""
    names = {C2P: "c2p", P2C: "p2c"}
    return transformers.DebertaV2Config(
        vocab_size=vocab,
        hidden_size=dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * dim,
        hidden_act="gelu_new",  # jax.nn.gelu's tanh form ("nn.gelu").
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=max_pos or 8,
        position_biased_input=max_pos is not None,
        type_vocab_size=0,
        relative_attention=True,
        max_relative_positions=max_distance,
        position_buckets=buckets if buckets is not None else -1,
        norm_rel_ebd="layer_norm",
        share_att_key=share,
        pos_att_type=[names[t] for t in attention_type],
        layer_norm_eps=eps,
        pad_token_id=0,
        **kwargs,
    )


def encoder_config(
    *,
    attention_type,
    share: bool,
    max_distance: int,
    buckets: Optional[int],
    max_pos: Optional[int] = SEQ,
    stack_cls=StackedTransformerLayer,
    dim: int = DIM,
    heads: int = HEADS,
    layers: int = LAYERS,
    vocab: int = VOCAB,
) -> DeBERTaV2Encoder.Config:
    """Our encoder config of the same model as `hf_config`."""
    cfg = deberta_v2_encoder_config(
        dim=dim,
        vocab_size=vocab,
        num_layers=layers,
        max_distance=max_distance,
        max_position_embeddings=max_pos,
        num_directional_buckets=buckets,
        stack_cls=stack_cls,
    )
    layer = cfg.transformer.layer
    layer.self_attention.attention = deberta_v2_self_attention_config(
        base_cfg=layer.self_attention.attention,
        num_heads=heads,
        max_distance=max_distance,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        share_projections=share,
        num_directional_buckets=buckets,
        attention_type=attention_type,
    )
    return cfg.set(name="encoder", pad_token_id=0)


def init_state(model, seed: int = 0):
    """Our initialization, with norms and biases perturbed so that their conversion is tested."""
    state = model.initialize_parameters_recursively(jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    out = []
    for (path, leaf), key in zip(leaves, keys):
        name = jax.tree_util.keystr(path)
        if "bias" in name or "norm" in name:
            leaf = leaf + 0.2 * jax.random.normal(key, leaf.shape, leaf.dtype)
        out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


def flat_params(state) -> dict:
    """{"a/b/c": float32 NumPy array} of a state tree."""
    return {k: np.asarray(v, np.float32) for k, v in utils.flatten_items(state)}


def _linear(w: np.ndarray) -> torch.Tensor:
    """Our [in, heads, head_dim] (or [in, out]) weight as an HF Linear weight [out, in]."""
    return torch.tensor(w.reshape(w.shape[0], -1).T.copy())


def _vec(b: np.ndarray) -> torch.Tensor:
    return torch.tensor(b.reshape(-1).copy())


def attention_to_hf(flat: dict, ours: str, hf: str, out: dict, *, share: bool, types):
    """Converts one DisentangledSelfAttention (params under `ours`) into HF's (under `hf`)."""
    names = (("q_proj", "query_proj"), ("k_proj", "key_proj"), ("v_proj", "value_proj"))
    for ours_name, hf_name in names:
        out[hf + hf_name + ".weight"] = _linear(flat[f"{ours}i_proj/{ours_name}/weight"])
        out[hf + hf_name + ".bias"] = _vec(flat[f"{ours}i_proj/{ours_name}/bias"])
    if not share and C2P in types:
        out[hf + "pos_key_proj.weight"] = _linear(flat[ours + "pos_k_proj/weight"])
        out[hf + "pos_key_proj.bias"] = _vec(flat[ours + "pos_k_proj/bias"])
    if not share and P2C in types:
        out[hf + "pos_query_proj.weight"] = _linear(flat[ours + "pos_q_proj/weight"])
        # Ours has no P2C bias (as the original DeBERTa); HF's is zero here.
        out[hf + "pos_query_proj.bias"] = torch.zeros(out[hf + "pos_query_proj.weight"].shape[0])


def encoder_to_hf(flat: dict, *, prefix: str, layers: int, share: bool, types) -> dict:
    """HF DebertaV2Model state dict (keys under `prefix`) of our encoder's flat params."""
    out = {
        prefix + "embeddings.word_embeddings.weight": torch.tensor(flat["emb/token_emb/weight"]),
        prefix + "embeddings.LayerNorm.weight": torch.tensor(flat["emb/norm/scale"]),
        prefix + "embeddings.LayerNorm.bias": torch.tensor(flat["emb/norm/bias"]),
        prefix + "encoder.rel_embeddings.weight": torch.tensor(flat["relative_pos_emb/weight"]),
        prefix + "encoder.LayerNorm.weight": torch.tensor(flat["relative_pos_emb/norm/scale"]),
        prefix + "encoder.LayerNorm.bias": torch.tensor(flat["relative_pos_emb/norm/bias"]),
    }
    if "emb/pos_emb/weight" in flat:
        pos = flat["emb/pos_emb/weight"]
        out[prefix + "embeddings.position_embeddings.weight"] = torch.tensor(
            pos.reshape(-1, pos.shape[-1])
        )
    repeated = any(k.startswith("transformer/repeat/") for k in flat)
    for i in range(layers):
        if repeated:
            start = "transformer/repeat/layer/"
            layer = {k[len(start) :]: v[i] for k, v in flat.items() if k.startswith(start)}
        else:
            start = f"transformer/layer{i}/"
            layer = {k[len(start) :]: v for k, v in flat.items() if k.startswith(start)}
        hf = f"{prefix}encoder.layer.{i}."
        att = "self_attention/attention/"
        attention_to_hf(layer, att, hf + "attention.self.", out, share=share, types=types)
        o_w = layer[att + "o_proj/weight"]
        out[hf + "attention.output.dense.weight"] = torch.tensor(o_w.reshape(o_w.shape[0], -1))
        out[hf + "attention.output.dense.bias"] = _vec(layer[att + "o_proj/bias"])
        for ours_norm, hf_norm in (
            ("self_attention/norm", "attention.output.LayerNorm"),
            ("feed_forward/norm", "output.LayerNorm"),
        ):
            out[hf + hf_norm + ".weight"] = _vec(layer[ours_norm + "/scale"])
            out[hf + hf_norm + ".bias"] = _vec(layer[ours_norm + "/bias"])
        for lin, hf_name in (("linear1", "intermediate.dense"), ("linear2", "output.dense")):
            out[hf + hf_name + ".weight"] = _linear(layer[f"feed_forward/{lin}/weight"])
            out[hf + hf_name + ".bias"] = _vec(layer[f"feed_forward/{lin}/bias"])
    return out


def load_hf(hf_model, state_dict: dict):
    """Loads every parameter of `hf_model` (strictly) and returns it in eval mode."""
    hf_model.load_state_dict(state_dict, strict=True)
    return hf_model.eval()


def _ids(batch: int, seq: int, vocab: int, seed: int = 0, pad_from=(None, 7)):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(batch, seq)).astype(np.int32)
    for row, start in enumerate(pad_from[:batch]):
        if start is not None:
            ids[row, start:] = 0
    return ids


def _run(model, state, inputs, method="forward"):
    out, _ = F(
        model,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        state=state,
        inputs=inputs,
        method=method,
    )
    return out


def _hf_hidden(hf, ids):
    with torch.no_grad():
        return hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
        ).last_hidden_state.numpy()


# (attention_type, share_projections, max_distance, num_directional_buckets, max_pos, stack).
_VARIANTS = {
    "c2p_p2c_shared_buckets": ((C2P, P2C), True, 16, 4, SEQ, StackedTransformerLayer),
    "c2p_p2c_separate_buckets": ((C2P, P2C), False, 16, 4, SEQ, StackedTransformerLayer),
    "c2p_only": ((C2P,), False, 8, 6, SEQ, StackedTransformerLayer),
    "p2c_only": ((P2C,), False, 8, 6, SEQ, StackedTransformerLayer),
    "c2p_shared": ((C2P,), True, 8, None, SEQ, StackedTransformerLayer),
    "p2c_shared_no_abs_pos": ((P2C,), True, 8, 4, None, StackedTransformerLayer),
    "content_only": ((), False, 8, None, SEQ, StackedTransformerLayer),
    "repeated": ((P2C, C2P), True, 16, 4, SEQ, RepeatedTransformerLayer),
}


@pytest.mark.parametrize("variant", sorted(_VARIANTS))
def test_encoder_matches_hf_deberta_v2_model(variant):
    types, share, max_distance, buckets, max_pos, stack = _VARIANTS[variant]
    cfg = encoder_config(
        attention_type=types,
        share=share,
        max_distance=max_distance,
        buckets=buckets,
        max_pos=max_pos,
        stack_cls=stack,
    )
    set_layer_norm_eps_recursively(cfg, EPS)  # HF has one eps; ours defaults to 1e-7 and 1e-8.
    model = cfg.instantiate(parent=None)
    state = init_state(model)
    # HF buckets with position_buckets; ours with num_directional_buckets or max_distance.
    hf_cfg = hf_config(
        attention_type=types,
        share=share,
        max_distance=max_distance,
        buckets=buckets or max_distance,
        max_pos=max_pos,
    )
    hf = load_hf(
        transformers.DebertaV2Model(hf_cfg),
        encoder_to_hf(flat_params(state), prefix="", layers=LAYERS, share=share, types=types),
    )
    ids = _ids(2, SEQ, VOCAB)
    ours = np.asarray(jax.jit(lambda s, x: _run(model, s, dict(input_ids=x)))(state, ids))
    live = ids != 0
    np.testing.assert_allclose(ours[live], _hf_hidden(hf, ids)[live], atol=1e-5, rtol=1e-5)


def test_unbucketed_hf_equals_ours_within_half_the_buckets():
    """HF without position buckets equals ours while |i - j| <= buckets / 2 (exact buckets)."""
    types, max_distance = (C2P, P2C), 32
    cfg = encoder_config(attention_type=types, share=True, max_distance=max_distance, buckets=None)
    set_layer_norm_eps_recursively(cfg, EPS)
    model = cfg.instantiate(parent=None)
    state = init_state(model, seed=3)
    hf_cfg = hf_config(attention_type=types, share=True, max_distance=max_distance, buckets=None)
    hf = load_hf(
        transformers.DebertaV2Model(hf_cfg),
        encoder_to_hf(flat_params(state), prefix="", layers=LAYERS, share=True, types=types),
    )
    ids = _ids(2, SEQ, VOCAB, seed=1)
    ours = np.asarray(_run(model, state, dict(input_ids=ids)))
    live = ids != 0
    np.testing.assert_allclose(ours[live], _hf_hidden(hf, ids)[live], atol=1e-5, rtol=1e-5)


def test_sequence_classification_matches_hf():
    types, share, max_distance, buckets = (C2P, P2C), True, 16, 8
    enc_cfg = encoder_config(
        attention_type=types, share=share, max_distance=max_distance, buckets=buckets
    )
    head = BertSequenceClassificationHead.default_config().set(
        num_classes=3, pooler=BertPooler.default_config().set(activation="exact_gelu")
    )
    cfg = deberta_v2_model_config(encoder_cfg=enc_cfg, head_cfg=head).set(name="deberta")
    model = cfg.instantiate(parent=None)
    state = init_state(model, seed=5)
    flat = flat_params(state)
    encoder_flat = {k[len("encoder/") :]: v for k, v in flat.items() if k.startswith("encoder/")}
    sd = encoder_to_hf(encoder_flat, prefix="deberta.", layers=LAYERS, share=share, types=types)
    sd.update(
        {
            "pooler.dense.weight": _linear(flat["head/pooler/linear/weight"]),
            "pooler.dense.bias": _vec(flat["head/pooler/linear/bias"]),
            "classifier.weight": _linear(flat["head/output/weight"]),
            "classifier.bias": _vec(flat["head/output/bias"]),
        }
    )
    hf_cfg = hf_config(
        attention_type=types,
        share=share,
        max_distance=max_distance,
        buckets=buckets,
        eps=1e-12,  # bert_model_config's eps.
        num_labels=3,
        pooler_hidden_size=DIM,
        pooler_hidden_act="gelu",
        pooler_dropout=0.0,
    )
    hf = load_hf(transformers.DebertaV2ForSequenceClassification(hf_cfg), sd)
    ids = _ids(3, SEQ, VOCAB, seed=2, pad_from=(None, 7, 4))
    labels = np.array([0, 2, 1], np.int32)
    out = _run(model, state, dict(input_batch=dict(input_ids=ids)), method="predict")
    loss, _ = _run(model, state, dict(input_batch=dict(input_ids=ids, target_labels=labels)))
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
            labels=torch.tensor(labels, dtype=torch.long),
        )
    np.testing.assert_allclose(np.asarray(out["logits"]), ref.logits.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(ref.loss), rtol=1e-5)


def test_relative_position_bucket_matches_hf():
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    cases = ((4, 10, 10), (5, 5, 10), (6, 8, 12), (8, 8, 16), (8, 64, 70), (256, 512, 600))
    for buckets, max_distance, length in cases:
        x = torch.zeros(1, length, 2)
        ref = build_relative_position(x, x, bucket_size=buckets, max_position=max_distance)
        ours = deberta_relative_position_bucket(
            query_len=length,
            key_len=length,
            num_directional_buckets=buckets,
            max_distance=max_distance,
        )
        np.testing.assert_array_equal(np.asarray(ours), ref[0].numpy() + buckets)


def _attention_cfg(**kwargs) -> DisentangledSelfAttention.Config:
    cfg = deberta_v2_self_attention_config(num_heads=HEADS, max_distance=8, **kwargs)
    return cfg.set(
        name="attention",
        query_dim=DIM,
        key_dim=DIM,
        value_dim=DIM,
        pos_emb=Embedding.default_config().set(num_embeddings=16, dim=DIM),
    )


def test_bad_configs_name_the_config_path():
    with pytest.raises(ValueError, match=r"attention\.attention_type has duplicates"):
        _attention_cfg(attention_type=[C2P, C2P]).instantiate(parent=None)
    # Entries that are not DisentangledAttentionType fail the config's type check.
    with pytest.raises(InvalidConfigValueError, match=r"Config\)\.attention_type expects"):
        _attention_cfg(attention_type=["c2p"])
    with pytest.raises(InvalidConfigValueError, match=r"Config\)\.attention_type expects"):
        _attention_cfg(attention_type=C2P)
    with pytest.raises(ValueError, match=r"attention\.max_distance must be at least 2"):
        _attention_cfg().set(max_distance=1).instantiate(parent=None)
    with pytest.raises(ValueError, match=r"attention\.num_directional_buckets must be None"):
        _attention_cfg(num_directional_buckets=1).instantiate(parent=None)
    with pytest.raises(ValueError, match=r"attention: causal/mask are not supported"):
        _attention_cfg().set(causal=True).instantiate(parent=None)
    with pytest.raises(ValueError, match="share_projections needs input_linear to be a QKVLinear"):
        deberta_v2_self_attention_config(
            num_heads=HEADS,
            max_distance=8,
            base_cfg=DisentangledSelfAttention.default_config().set(
                input_linear=FusedQKVLinear.default_config()
            ),
        )
    with pytest.raises(ValueError, match=r"attention\.input_linear must have separate"):
        _attention_cfg(share_projections=False).set(
            input_linear=FusedQKVLinear.default_config()
        ).instantiate(parent=None)
    # Too few relative position embeddings for 2 * buckets.
    layer = _attention_cfg(num_directional_buckets=16).instantiate(parent=None)
    state = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    x = jnp.ones((1, 4, DIM))
    with pytest.raises(ValueError, match=r"attention\.pos_emb has 16 embeddings, fewer than"):
        _run(layer, state, dict(query=x))
    with pytest.raises(NotImplementedError, match="query_len == key_len"):
        _run(layer, state, dict(query=x, key=x[:, :3], value=x[:, :3]))


def test_config_helpers():
    cfg = deberta_v2_encoder_config(dim=DIM, vocab_size=VOCAB, num_layers=3, max_distance=64)
    assert cfg.transformer.klass is RepeatedTransformerLayer
    assert cfg.relative_pos_emb.num_embeddings == 128 and cfg.emb.pos_emb is None
    assert cfg.emb.norm.eps == 1e-7
    attention = cfg.transformer.layer.self_attention.attention
    assert attention.klass is DisentangledSelfAttention
    assert attention.pos_emb.shared_module == "relative_pos_emb"
    cfg = deberta_v2_encoder_config(
        dim=DIM,
        vocab_size=VOCAB,
        num_layers=3,
        max_distance=64,
        num_directional_buckets=8,
        stack_cls=StackedTransformerLayer,
    )
    assert cfg.transformer.klass is StackedTransformerLayer
    assert cfg.transformer.layer.self_attention.attention.klass is DisentangledSelfAttention
    assert cfg.relative_pos_emb.num_embeddings == 16
    att = deberta_v2_self_attention_config(num_heads=2, max_distance=8, share_projections=False)
    assert att.pos_q_proj is None and att.dropout.rate == 0.1
    model = deberta_v2_model_config(encoder_cfg=cfg)
    assert model.param_init.init_by_param_name[".*weight$"].distribution == "normal"


# AXLearn's deberta_test reads `load_golden("axlearn.common.deberta_test", ...)`: params (our
# layout), inputs and reference outputs. The file shipped in axlearn/experiments/testdata is
# written here (AXLEARN_UPDATE_GOLDENS=1) from HF DeBERTa V2 modules loaded with our
# (initialized, perturbed) weights; the slow test below recomputes and compares it.
GOLDEN_MODULE = "axlearn.common.deberta_test"
UPDATE_ENV = "AXLEARN_UPDATE_GOLDENS"
# deberta_test's build_cfg: vocab 26, hidden 32, 8 heads, 12 layers, query_len 16, pad id 0.
G_VOCAB, G_DIM, G_HEADS, G_LAYERS, G_LEN = 26, 32, 8, 12, 16
G_TYPES = (C2P, P2C)


def _g_params(model, seed: int) -> dict:
    """Our perturbed initial params, rounded to multiples of 1/256 so the golden file compresses."""
    return {k: np.round(v * 256) / 256 for k, v in flat_params(init_state(model, seed)).items()}


def _golden_key(prefix: str, sp: bool, ndb: Optional[int], md: int, stack=None) -> str:
    key = f"{prefix}_sp{sp}_ndb{ndb}_md{md}"
    if stack is not None:
        key += "_Repeated" if stack is RepeatedTransformerLayer else "_Stacked"
    return key


def _g_hf_config(sp: bool, ndb: Optional[int], md: int, **kwargs):
    kwargs.setdefault("max_pos", G_LEN)
    return hf_config(
        attention_type=G_TYPES,
        share=sp,
        max_distance=md,
        buckets=ndb or md,
        dim=G_DIM,
        heads=G_HEADS,
        layers=G_LAYERS,
        vocab=G_VOCAB,
        **kwargs,
    )


def _attention_cases(rng) -> dict:
    from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_deberta

    cases = {}
    batch, head_dim = 2, G_DIM // G_HEADS
    for sp in (True, False):
        for ndb in (None, 8):
            for md in (64, 8):
                num_pos = ndb or md
                cfg = deberta_v2_self_attention_config(
                    num_heads=G_HEADS,
                    max_distance=md,
                    hidden_dropout=0.0,
                    attention_dropout=0.0,
                    share_projections=sp,
                    num_directional_buckets=ndb,
                    attention_type=list(G_TYPES),
                ).set(
                    name="test",
                    query_dim=G_DIM,
                    key_dim=G_DIM,
                    value_dim=G_DIM,
                    pos_emb=Embedding.default_config().set(num_embeddings=2 * num_pos, dim=G_DIM),
                )
                layer = cfg.instantiate(parent=None)
                params = _g_params(layer, seed=len(cases))
                sd = {}
                attention_to_hf(params, "", "", sd, share=sp, types=G_TYPES)
                hf = load_hf(hf_deberta.DisentangledSelfAttention(_g_hf_config(sp, ndb, md)), sd)
                rel_emb = rng.standard_normal((2 * num_pos, G_DIM)).astype(np.float32)
                q, k = (
                    rng.standard_normal((batch, G_LEN, G_HEADS, head_dim)).astype(np.float32)
                    for _ in range(2)
                )

                def heads_first(x):
                    return torch.tensor(x).permute(0, 2, 1, 3).reshape(-1, G_LEN, head_dim)

                rel_pos = hf_deberta.build_relative_position(
                    heads_first(q), heads_first(k), bucket_size=num_pos, max_position=md
                )
                with torch.no_grad():
                    ref = hf.disentangled_attention_bias(
                        heads_first(q), heads_first(k), rel_pos, torch.tensor(rel_emb), 3
                    )
                cases[_golden_key("test_disentangled_attention_bias", sp, ndb, md)] = dict(
                    params=params,
                    inputs=dict(q_proj=q, k_proj=k, relative_pos_emb=rel_emb),
                    outputs=dict(ref=ref.reshape(batch, G_HEADS, G_LEN, G_LEN).numpy()),
                )
                query, key = (
                    rng.standard_normal((batch, G_LEN, G_DIM)).astype(np.float32) for _ in range(2)
                )
                with torch.no_grad():
                    _, probs = hf(
                        torch.tensor(key),
                        torch.ones(batch, 1, G_LEN, G_LEN, dtype=torch.bool),
                        output_attentions=True,
                        query_states=torch.tensor(query),
                        rel_embeddings=torch.tensor(rel_emb),
                    )
                cases[_golden_key("test_disentangled_self_attention", sp, ndb, md)] = dict(
                    params=params,
                    inputs=dict(query=query, key=key, relative_pos_emb=rel_emb),
                    outputs=dict(probs=probs.numpy()),
                )
    return cases


def _g_ids(rng, batch: int, seq: int, pad_from) -> np.ndarray:
    ids = rng.integers(1, G_VOCAB, size=(batch, seq)).astype(np.int32)
    for row, start in enumerate(pad_from):
        ids[row, start:] = 0
    return ids


def _g_encoder_config(sp: bool, ndb: Optional[int], md: int, stack=None, max_pos=G_LEN):
    return encoder_config(
        attention_type=list(G_TYPES),
        share=sp,
        max_distance=md,
        buckets=ndb,
        max_pos=max_pos,
        stack_cls=stack,
        dim=G_DIM,
        heads=G_HEADS,
        layers=G_LAYERS,
        vocab=G_VOCAB,
    )


def _encoder_cases(rng) -> dict:
    cases = {}
    for sp in (True, False):
        for ndb in (None, 8):
            for md in (64, 8):
                for stack in (StackedTransformerLayer, RepeatedTransformerLayer):
                    model = _g_encoder_config(sp, ndb, md, stack).instantiate(parent=None)
                    params = _g_params(model, seed=len(cases))
                    sd = encoder_to_hf(params, prefix="", layers=G_LAYERS, share=sp, types=G_TYPES)
                    hf = load_hf(transformers.DebertaV2Model(_g_hf_config(sp, ndb, md)), sd)
                    # Ours: 1e-7 in the embedding norm, LayerNorm's default 1e-8 elsewhere.
                    for name, module in hf.named_modules():
                        if isinstance(module, torch.nn.LayerNorm):
                            module.eps = 1e-7 if name == "embeddings.LayerNorm" else 1e-8
                    ids = _g_ids(rng, 2, G_LEN, pad_from=(G_LEN, 10))
                    cases[_golden_key("test_encoder", sp, ndb, md, stack)] = dict(
                        params={f"encoder/{k}": v for k, v in params.items()},
                        inputs=dict(input_ids=ids, padding_mask=(ids != 0).astype(np.int32)),
                        outputs=dict(last_hidden_state=_hf_hidden(hf, ids)),
                    )
    return cases


def _model_cases(rng) -> dict:
    from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_deberta

    cases = {}
    pooler = BertPooler.default_config().set(name="pooler", input_dim=1536, activation="exact_gelu")
    pooler = pooler.instantiate(parent=None)
    params = _g_params(pooler, seed=100)
    hf_pooler = hf_deberta.ContextPooler(
        transformers.DebertaV2Config(
            hidden_size=1536, pooler_hidden_size=1536, pooler_dropout=0.0, pooler_hidden_act="gelu"
        )
    )
    sd = {
        "dense.weight": _linear(params["linear/weight"]),
        "dense.bias": _vec(params["linear/bias"]),
    }
    hf_pooler = load_hf(hf_pooler, sd)
    inputs = rng.standard_normal((2, 5, 1536)).astype(np.float32)
    with torch.no_grad():
        ref = hf_pooler(torch.tensor(inputs)).numpy()
    cases["test_context_pooler"] = dict(
        params=params, inputs=dict(inputs=inputs), outputs=dict(ref=ref)
    )

    seq = 64
    head = BertSequenceClassificationHead.default_config().set(
        num_classes=2, pooler=BertPooler.default_config().set(activation="exact_gelu")
    )
    cfg = deberta_v2_model_config(
        encoder_cfg=_g_encoder_config(True, None, seq, max_pos=seq), head_cfg=head
    ).set(name="deberta_model")
    model = cfg.instantiate(parent=None)
    params = _g_params(model, seed=101)
    encoder_flat = {k[len("encoder/") :]: v for k, v in params.items() if k.startswith("encoder/")}
    sd = encoder_to_hf(encoder_flat, prefix="deberta.", layers=G_LAYERS, share=True, types=G_TYPES)
    sd.update(
        {
            "pooler.dense.weight": _linear(params["head/pooler/linear/weight"]),
            "pooler.dense.bias": _vec(params["head/pooler/linear/bias"]),
            "classifier.weight": _linear(params["head/output/weight"]),
            "classifier.bias": _vec(params["head/output/bias"]),
        }
    )
    hf_cfg = _g_hf_config(
        True,
        None,
        seq,
        max_pos=seq,
        eps=1e-12,
        num_labels=2,
        pooler_hidden_size=G_DIM,
        pooler_hidden_act="gelu",
        pooler_dropout=0.0,
    )
    hf = load_hf(transformers.DebertaV2ForSequenceClassification(hf_cfg), sd)
    ids = _g_ids(rng, 4, seq, pad_from=(seq, 50, 33, 20))
    labels = rng.integers(0, 2, size=4).astype(np.int32)
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
            labels=torch.tensor(labels, dtype=torch.long),
            output_hidden_states=True,
        )
    cases["test_deberta_v2_sequence_classification"] = dict(
        params=params,
        inputs=dict(input_ids=ids, padding_mask=(ids != 0).astype(np.int32), target_labels=labels),
        outputs=dict(
            last_hidden_state=out.hidden_states[-1].numpy(),
            logits=out.logits.numpy(),
            loss=out.loss.numpy(),
        ),
    )
    return cases


def _golden_cases() -> dict:
    torch.manual_seed(0)
    rng = np.random.default_rng(2023)
    return {**_attention_cases(rng), **_encoder_cases(rng), **_model_cases(rng)}


def _flat_case(case: dict) -> dict:
    """{"group/a/b": array} of a nested dict."""
    return {k: np.asarray(v) for k, v in utils.flatten_items(case)}


@pytest.mark.slow  # 34 cases, 17 of 12-layer HF models (about 2 minutes on 2 loaded cores).
def test_axlearn_deberta_goldens_hold_hf_outputs():
    """The shipped deberta_test golden equals fresh HF outputs of the same weights and inputs."""
    cases = _golden_cases()
    path = golden_path(GOLDEN_MODULE)
    if os.environ.get(UPDATE_ENV):
        arrays = {}
        for name, case in cases.items():
            arrays.update({f"{name}/{k}": v for k, v in _flat_case(case).items()})
        np.savez_compressed(path, **arrays)
    assert len(cases) == 34
    for name, case in cases.items():
        stored = _flat_case(load_golden(GOLDEN_MODULE, name))
        fresh = _flat_case(case)
        assert set(stored) == set(fresh), name
        for key, value in fresh.items():
            np.testing.assert_allclose(stored[key], value, atol=1e-5, err_msg=f"{name} {key}")
