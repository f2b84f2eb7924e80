"""Tests of axlearn.common.encoder against Hugging Face `transformers` BertModel and NumPy."""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from axlearn.common import bert, utils
from axlearn.common.attention import StackedTransformerLayer
from axlearn.common.config import config_class
from axlearn.common.encoder import CausalEncoder, Encoder, EncoderModel
from axlearn.common.golden import load_golden
from axlearn.common.layers import (
    BaseClassificationHead,
    Embedding,
    LayerNorm,
    Linear,
    set_layer_norm_eps_recursively,
)
from axlearn.common.module import functional as F
from tests.common.hf_bert_conversion import (
    BERT_NAMES,
    check_golden,
    encoder_weights,
    numpy_state_dict,
    state_from_flat,
)

VOCAB, DIM, HEADS, LAYERS, FFN, MAX_POS, TYPES, EPS, PAD = 40, 16, 4, 2, 32, 12, 2, 1e-12, 0


def _encoder_config(cls=Encoder, num_layers: int = LAYERS):
    """A BERT-shaped encoder: learned positions and types, post-norm layers, exact GELU."""
    cfg = cls.default_config().set(name="encoder", dim=DIM, vocab_size=VOCAB, pad_token_id=PAD)
    cfg.emb.set(
        type_emb=Embedding.default_config().set(num_embeddings=TYPES),
        pos_emb=Embedding.default_config().set(num_embeddings=MAX_POS),
        norm=LayerNorm.default_config().set(eps=EPS),
    )
    layer = StackedTransformerLayer.default_config().layer
    layer.self_attention.structure = "postnorm"
    layer.self_attention.norm = LayerNorm.default_config().set(eps=EPS)
    layer.self_attention.attention.num_heads = HEADS
    layer.feed_forward.set(
        hidden_dim=FFN,
        activation="exact_gelu",
        structure="postnorm",
        norm=LayerNorm.default_config().set(eps=EPS),
    )
    cfg.transformer = StackedTransformerLayer.default_config().set(
        num_layers=num_layers, layer=layer
    )
    return cfg


def _run(layer, state, method="forward", static: Optional[dict] = None, **inputs):
    """Runs `method` jitted on `inputs`; `static` inputs (e.g. Python bools) are not traced."""

    def fn(state, inputs):
        out, _ = F(
            layer,
            is_training=False,
            method=method,
            state=state,
            prng_key=jax.random.PRNGKey(0),
            inputs={**inputs, **(static or {})},
        )
        return out

    return jax.jit(fn)(state, inputs)


def _random_state(layer, seed: int = 0):
    """Random parameters of the layer's specs (faster here than its initializers)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda spec: (0.3 * rng.standard_normal(spec.shape)).astype(np.float32),
        layer.create_parameter_specs_recursively(),
    )


def _hf_bert():
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        max_position_embeddings=MAX_POS,
        type_vocab_size=TYPES,
        layer_norm_eps=EPS,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # Non-trivial norms and biases, so their conversion is tested.
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model


def _from_hf(model) -> dict:
    """Our Encoder's state from an HF BertModel's weights."""
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    head_dim = DIM // HEADS

    def norm(prefix):
        return dict(scale=sd[prefix + ".weight"], bias=sd[prefix + ".bias"])

    def heads_in(prefix):  # torch Linear [out, in] -> [in, heads, head_dim].
        return dict(
            weight=sd[prefix + ".weight"].T.reshape(DIM, HEADS, head_dim),
            bias=sd[prefix + ".bias"].reshape(HEADS, head_dim),
        )

    def linear(prefix):
        return dict(weight=sd[prefix + ".weight"].T, bias=sd[prefix + ".bias"])

    layers = {}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        o = sd[p + "attention.output.dense.weight"]  # [DIM, DIM(heads * head_dim)].
        layers[f"layer{i}"] = dict(
            self_attention=dict(
                norm=norm(p + "attention.output.LayerNorm"),
                attention=dict(
                    i_proj=dict(
                        q_proj=heads_in(p + "attention.self.query"),
                        k_proj=heads_in(p + "attention.self.key"),
                        v_proj=heads_in(p + "attention.self.value"),
                    ),
                    o_proj=dict(
                        weight=o.reshape(DIM, HEADS, head_dim),
                        bias=sd[p + "attention.output.dense.bias"],
                    ),
                ),
            ),
            feed_forward=dict(
                norm=norm(p + "output.LayerNorm"),
                linear1=linear(p + "intermediate.dense"),
                linear2=linear(p + "output.dense"),
            ),
        )
    return dict(
        emb=dict(
            token_emb=dict(weight=sd["embeddings.word_embeddings.weight"]),
            type_emb=dict(weight=sd["embeddings.token_type_embeddings.weight"]),
            pos_emb=dict(weight=sd["embeddings.position_embeddings.weight"]),
            norm=norm("embeddings.LayerNorm"),
        ),
        transformer=layers,
    )


def _as_state(flat_state: dict, specs) -> dict:
    """The layer's state tree (its specs' structure) from our converted weights, by path.

    Every spec must have exactly one converted weight of its shape, and vice versa.
    """
    flat_specs = dict(utils.flatten_items(specs))
    assert set(flat_specs) == set(flat_state)
    for path, spec in flat_specs.items():
        assert tuple(spec.shape) == flat_state[path].shape, path
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: flat_state[jax.tree_util.keystr(kp, simple=True, separator="/")], specs
    )


def test_encoder_matches_hf_bert():
    layer = _encoder_config().instantiate(parent=None)
    hf = _hf_bert()
    state = _as_state(
        dict(utils.flatten_items(_from_hf(hf))), layer.create_parameter_specs_recursively()
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(3, 10)).astype(np.int32)
    ids[1, 7:] = PAD
    ids[2, 4:] = PAD
    types = rng.integers(0, TYPES, size=ids.shape).astype(np.int32)
    ours = np.asarray(_run(layer, state, input_ids=ids, token_type_ids=types))
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            token_type_ids=torch.tensor(types, dtype=torch.long),
            attention_mask=torch.tensor(ids != PAD, dtype=torch.long),
        ).last_hidden_state.numpy()
    live = ids != PAD  # Padding queries are not compared (HF lets them attend everything).
    np.testing.assert_allclose(ours[live], ref[live], atol=1e-5, rtol=1e-5)
    # Tied logits: hidden states times the token embedding table.
    logits = np.asarray(_run(layer, state, method="attend", x=ours))
    np.testing.assert_allclose(
        logits, ours @ np.asarray(state["emb"]["token_emb"]["weight"]).T, atol=1e-4, rtol=1e-5
    )


def test_attention_biases_mask_padding_and_segments():
    layer = _encoder_config().instantiate(parent=None)
    ids = np.array([[5, 6, PAD]], np.int32)
    biases = np.asarray(_run(layer, {}, method="compute_attention_logit_biases", input_ids=ids))[
        0, 0
    ]
    assert np.all(biases[:2, :2] == 0) and np.all(biases[:2, 2] < -1e9)
    with pytest.raises(ValueError, match="segment_ids and positions must be given together"):
        _run(
            layer,
            {},
            method="compute_attention_logit_biases",
            input_ids=ids,
            segment_ids=jnp.ones_like(ids),
        )


def test_causal_encoder_cls_tokens_do_not_change_the_prefix():
    plain = _encoder_config(CausalEncoder, num_layers=1).instantiate(parent=None)
    with_cls = (
        _encoder_config(CausalEncoder, num_layers=1).set(num_cls_tokens=2).instantiate(parent=None)
    )
    state = _random_state(with_cls, 1)
    assert state["cls_token"].shape == (1, 2, DIM)
    ids = np.array([[3, 4, 5, 6]], np.int32)
    out = _run(with_cls, state, input_ids=ids)["hidden_states"]
    plain_state = {k: v for k, v in state.items() if k != "cls_token"}
    ref = _run(plain, plain_state, input_ids=ids)["hidden_states"]
    assert out.shape == (1, 6, DIM)
    # Causal: appended tokens leave the earlier positions' states unchanged.
    np.testing.assert_allclose(out[:, :4], ref, atol=1e-5)
    # Token 0's state does not depend on later tokens.
    other = _run(plain, plain_state, input_ids=np.array([[3, 9, 9, 9]], np.int32))
    np.testing.assert_allclose(other["hidden_states"][:, 0], ref[:, 0], atol=1e-5)


class _FirstTokenHead(BaseClassificationHead):
    """Logits of the first token's hidden state through a linear layer (a test head)."""

    @config_class
    class Config(BaseClassificationHead.Config):
        """Configures _FirstTokenHead."""

    def __init__(self, cfg, *, parent):
        super().__init__(cfg, parent=parent)
        cfg = self.config
        self._add_child(
            "proj",
            Linear.default_config().set(input_dim=cfg.input_dim, output_dim=cfg.num_classes),
        )

    def forward(self, input_batch):
        return self.proj(input_batch["hidden_states"][..., 0, :])


def test_encoder_model_with_head_loss_matches_numpy():
    enc = _encoder_config(num_layers=1)
    cfg = EncoderModel.default_config().set(
        name="model",
        dim=DIM,
        vocab_size=VOCAB,
        encoder=enc,
        head=_FirstTokenHead.default_config().set(num_classes=3),
    )
    model = cfg.instantiate(parent=None)
    state = _random_state(model)
    ids = np.random.default_rng(1).integers(1, VOCAB, size=(2, 2, 5)).astype(np.int32)
    labels = np.array([[0, 2], [1, -1]], np.int32)  # -1: not counted.
    loss, aux = _run(
        model,
        state,
        input_batch=dict(input_ids=ids, target_labels=labels),
        static=dict(return_aux=True),
    )
    assert aux["sequence_output"].shape == (2, 2, 5, DIM)
    logits = np.asarray(aux["logits"], np.float64)
    assert logits.shape == (2, 2, 3)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    live = labels >= 0
    expected = -np.mean(
        np.take_along_axis(log_p, np.maximum(labels, 0)[..., None], -1)[..., 0][live]
    )
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    # Without a head: no loss, only sequence outputs.
    plain = cfg.clone(head=None).instantiate(parent=None)
    loss, aux = _run(
        plain,
        {"encoder": state["encoder"]},
        input_batch=dict(input_ids=ids, target_labels=labels),
        static=dict(return_aux=True),
    )
    assert loss is None and set(aux) == {"sequence_output"}


# AXLearn's encoder_test reads `load_golden("axlearn.common.encoder_test", ...)`: params (our
# layout), inputs and Hugging Face's outputs, written here from an HF BertModel built from that
# test's config (regenerate with AXLEARN_UPDATE_GOLDENS=1) and checked below.
GOLDEN_MODULE = "axlearn.common.encoder_test"
# AXLearn's encoder_test setup: dim 12, 4 heads, 2 layers, 11 positions, one token type.
_G_VOCAB, _G_DIM, _G_HEADS, _G_LAYERS, _G_LEN = 24, 12, 4, 2, 11


def _golden_hf_bert():
    config = transformers.BertConfig(
        vocab_size=_G_VOCAB,
        hidden_size=_G_DIM,
        num_hidden_layers=_G_LAYERS,
        num_attention_heads=_G_HEADS,
        intermediate_size=4 * _G_DIM,
        max_position_embeddings=_G_LEN,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        hidden_act="gelu_new",  # bert_transformer_config's activation (tanh approximation).
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=PAD,
    )
    torch.manual_seed(7)
    model = transformers.BertModel(config, add_pooling_layer=False)
    torch.manual_seed(8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _left_aligned(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row, the elements of `x` where `mask`, moved to the front; zeros after (NumPy)."""
    out = np.zeros_like(x)
    for row in range(x.shape[0]):
        kept = x[row][mask[row]]
        out[row, : len(kept)] = kept
    return out


def _encoder_golden_cases() -> dict:
    """{test name: case} of AXLearn's encoder_test: the full encoder and packed embeddings."""
    hf = _golden_hf_bert()
    flat = encoder_weights(
        numpy_state_dict(hf), "", dim=_G_DIM, heads=_G_HEADS, layers=_G_LAYERS, names=BERT_NAMES
    )
    rng = np.random.default_rng(11)
    # No padding: AXLearn's test compares every position (HF's padding queries differ).
    ids = rng.integers(1, _G_VOCAB, size=(3, _G_LEN)).astype(np.int32)
    with torch.no_grad():
        hidden = hf(input_ids=torch.tensor(ids, dtype=torch.long)).last_hidden_state.numpy()
    cases = {
        "test_against_hf_encoder": dict(
            params=flat, inputs=dict(input_ids=ids), outputs=dict(last_hidden_state=hidden)
        )
    }
    emb_params = {k: v for k, v in flat.items() if k.startswith("encoder/emb/")}
    for num_segments in (1, 2, 3):
        batch = 3
        ids = np.zeros((batch, _G_LEN), np.int32)
        segments = np.zeros_like(ids)
        positions = np.zeros_like(ids)
        for row in range(batch):
            used = _G_LEN - int(rng.integers(0, 3))  # Trailing padding (id 0).
            cuts = np.sort(rng.choice(np.arange(1, used), size=num_segments - 1, replace=False))
            start = 0
            for seg, end in enumerate([*cuts, used]):
                segments[row, start:end] = seg
                positions[row, start:end] = np.arange(end - start)
                start = end
            segments[row, used:] = num_segments - 1
            positions[row, used:] = np.arange(used, _G_LEN) - (cuts[-1] if len(cuts) else 0)
            ids[row, :used] = rng.integers(1, _G_VOCAB, size=used)
        types = np.zeros_like(ids)
        outputs = {}
        for seg in range(num_segments):
            seg_ids = _left_aligned(ids, segments == seg)
            with torch.no_grad():
                outputs[f"segment_{seg}"] = hf.embeddings(
                    input_ids=torch.tensor(seg_ids, dtype=torch.long),
                    token_type_ids=torch.tensor(_left_aligned(types, segments == seg)).long(),
                ).numpy()
        cases[f"test_embeddings_{num_segments}"] = dict(
            params=emb_params,
            inputs=dict(
                source_ids=ids,
                source_type_ids=types,
                source_segment_ids=segments,
                source_positions=positions,
            ),
            outputs=outputs,
        )
    return cases


def test_axlearn_encoder_goldens_hold_hf_outputs():
    """The shipped encoder_test golden equals fresh HF outputs, and our Encoder matches it."""
    cases = _encoder_golden_cases()
    check_golden(GOLDEN_MODULE, cases, atol=1e-6)
    cfg = Encoder.default_config().set(
        name="encoder",
        dim=_G_DIM,
        vocab_size=_G_VOCAB,
        pad_token_id=PAD,
        emb=bert.bert_embedding_config(type_vocab_size=1, max_position_embeddings=_G_LEN),
        transformer=bert.bert_transformer_config(num_layers=_G_LAYERS, num_heads=_G_HEADS),
    )
    set_layer_norm_eps_recursively(cfg, 1e-5)
    layer = cfg.instantiate(parent=None)
    golden = load_golden(GOLDEN_MODULE, "test_against_hf_encoder")
    state = state_from_flat(
        layer,
        {k[len("encoder/") :]: v for k, v in cases["test_against_hf_encoder"]["params"].items()},
    )
    out = _run(layer, state, input_ids=golden["inputs"]["input_ids"])
    np.testing.assert_allclose(
        np.asarray(out), golden["outputs"]["last_hidden_state"], atol=1e-5, rtol=1e-5
    )
    # Packed inputs: each segment's embeddings (positions restart per segment) equal HF's
    # embeddings of that segment alone.
    golden = load_golden(GOLDEN_MODULE, "test_embeddings_3")
    inputs = golden["inputs"]
    emb = _run(
        layer.emb,
        state["emb"],
        input_batch=dict(
            inputs=inputs["source_ids"],
            token_type_ids=inputs["source_type_ids"],
            positions=inputs["source_positions"],
        ),
    )
    for seg in range(3):
        mask = inputs["source_segment_ids"] == seg
        live = (_left_aligned(inputs["source_ids"], mask) != 0)[..., None]
        np.testing.assert_allclose(
            _left_aligned(np.asarray(emb), mask) * live,
            golden["outputs"][f"segment_{seg}"] * live,
            atol=1e-5,
        )


def test_causal_encoder_decoding_matches_forward():
    """init_states + extend_step token by token, and prefill_states + extend_step from each
    row's own time step, reproduce forward's causal hidden states."""
    layer = _encoder_config(CausalEncoder, num_layers=2).instantiate(parent=None)
    state = _random_state(layer, 2)
    ids = np.random.default_rng(3).integers(1, VOCAB, size=(3, 6)).astype(np.int32)
    ref = np.asarray(_run(layer, state, input_ids=ids)["hidden_states"])

    def decode(cache, time_step):
        out = np.zeros_like(ref)
        while np.any(time_step < ids.shape[1]):
            token = np.take_along_axis(ids, np.minimum(time_step, ids.shape[1] - 1)[:, None], 1)
            cache, step = _run(
                layer,
                state,
                method="extend_step",
                cached_states=cache,
                input_batch=dict(input_ids=token),
            )
            for row, t in enumerate(time_step):
                if t < ids.shape[1]:
                    out[row, t] = np.asarray(step["hidden_states"])[row, 0]
            time_step = time_step + 1
        return out

    empty = layer.init_states(batch_size=3, max_sequence_length=6)
    assert empty["input_ids"].shape == (3, 6) and np.all(np.asarray(empty["time_step"]) == 0)
    np.testing.assert_allclose(decode(empty, np.zeros(3, np.int32)), ref, atol=1e-5)
    time_step = np.array([0, 2, 5], np.int32)
    cache, prefilled = _run(
        layer, state, method="prefill_states", time_step=time_step, input_ids=ids
    )
    np.testing.assert_allclose(np.asarray(prefilled["hidden_states"]), ref, atol=1e-5)
    out = decode(cache, time_step)
    live = np.arange(6)[None, :] >= time_step[:, None]
    np.testing.assert_allclose(out[live], ref[live], atol=1e-5)
    with pytest.raises(ValueError, match=r"must be \[batch, 1\]"):
        _run(
            layer, state, method="extend_step", cached_states=empty, input_batch=dict(input_ids=ids)
        )
