"""Tests of axlearn.common.t5 against Hugging Face `transformers` T5 models built on CPU.

Our (randomly initialized, perturbed) parameters are copied into HF's T5ForConditionalGeneration
/ T5EncoderModel built from a tiny T5Config (no download); logits agree within 1e-5 (float32).
HF's query weights carry T5's folded 1/sqrt(per_head_dim) scale, so ours are divided by it.
The bucket function is checked against a scalar, hand-written NumPy version.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from axlearn.common import t5
from axlearn.common.attention_bias import NEG_INF
from axlearn.common.golden import golden_path, load_golden
from axlearn.common.module import functional as F

VOCAB, DIM, HEADS, LAYERS = 40, 12, 3, 2
# HF's names of the feed-forward activation of each arch.
_HF_FF = {"t5-v1-1": "gated-gelu", "t5-v1": "relu", "t5-ul2": "gated-silu"}


def _np_bucket(rel: int, *, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of one relative position, written from the paper's description."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            bucket = num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    log_part = np.log(np.float32(n) / np.float32(exact)) / np.log(max_distance / exact)
    return bucket + min(exact + int(np.float32(log_part) * (num_buckets - exact)), num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 20), (28, 15), (8, 9)])
def test_relative_position_bucket_matches_numpy(bidirectional, num_buckets, max_distance):
    rel = np.arange(-300, 301)
    expected = [
        _np_bucket(
            int(r), bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        for r in rel
    ]
    actual = t5.t5_relative_position_bucket(
        jnp.asarray(rel),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    np.testing.assert_array_equal(np.asarray(actual), expected)
    assert actual.dtype == jnp.int32
    assert int(actual.min()) >= 0 and int(actual.max()) < num_buckets


def test_relative_position_bucket_small_cases():
    # Bidirectional, 8 buckets: 0..1 exact before/at the query, 4 + (1..) after it.
    out = t5.t5_relative_position_bucket(jnp.array([0, -1, 1, 2, -2]), num_buckets=8)
    np.testing.assert_array_equal(np.asarray(out), [0, 1, 5, 6, 2])
    # Unidirectional: keys after the query share bucket 0.
    out = t5.t5_relative_position_bucket(jnp.array([5, 1, 0, -1]), bidirectional=False)
    np.testing.assert_array_equal(np.asarray(out), [0, 0, 0, 1])


def test_relative_positional_embedding_adds_bias_table():
    layer = (
        t5.T5RelativePositionalEmbedding.default_config()
        .set(name="rel", dim=2, num_buckets=8, max_distance=16, bidirectional=False)
        .instantiate(parent=None)
    )
    state = _random_state(layer)
    mask = np.zeros((1, 1, 3, 4), np.float32)
    mask[0, 0, 0, 3] = NEG_INF
    out, _ = jax.jit(
        lambda st, m: F(layer, inputs=[m], state=st, is_training=False, prng_key=None)
    )(state, mask)
    assert out.shape == (1, 2, 3, 4)
    table = np.asarray(state["emb"]["weight"])  # [buckets, heads].
    for i in range(3):
        for j in range(4):
            b = _np_bucket(j - i, bidirectional=False, num_buckets=8, max_distance=16)
            if (i, j) == (0, 3):
                assert np.all(np.asarray(out[0, :, i, j]) < -1e14)
            else:
                np.testing.assert_allclose(np.asarray(out[0, :, i, j]), table[b], rtol=1e-6)


def test_transformer_stack_config_archs():
    cfg = t5.t5_transformer_stack_config()
    ff = cfg.layer.feed_forward
    assert ff.activation == ("nn.gelu", "linear") and ff.structure == "prenorm"
    assert cfg.layer.self_attention.attention.input_linear.layer.bias is False
    assert t5.t5_transformer_stack_config("t5-v1").layer.feed_forward.activation == "nn.relu"
    assert t5.t5_transformer_stack_config("t5-ul2").layer.feed_forward.activation[0] == "nn.silu"
    assert t5.t5_transformer_stack_config(hidden_dim=7).layer.feed_forward.hidden_dim == 7
    with pytest.raises(ValueError, match="unsupported arch 't5-v9'"):
        t5.t5_transformer_stack_config("t5-v9")


def _model_config(arch: str) -> t5.T5EncoderDecoderModel.Config:
    return t5.t5_encoder_decoder_config(
        vocab_size=VOCAB,
        dim=DIM,
        num_encoder_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_attention_heads=HEADS,
        dropout_rate=0.0,
        stack_cfg=t5.t5_transformer_stack_config(arch=arch),
    ).set(name="t5")


def _random_state(layer, seed: int = 0) -> dict:
    """Random parameters for `layer` drawn with NumPy (no JAX initialization to compile).

    Matrices have unit-variance-preserving scales; vectors (norm scales) are 1 + noise, so
    their conversion is tested.
    """
    rng = np.random.default_rng(seed)

    def draw(spec):
        shape = tuple(spec.shape)
        if len(shape) == 1:
            return (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    specs = layer.create_parameter_specs_recursively()
    return jax.tree_util.tree_map(draw, specs, is_leaf=lambda x: hasattr(x, "mesh_axes"))


def _attention_to_hf(p: dict, prefix: str) -> dict:
    """Our attention {i_proj: {q,k,v}_proj [dim, heads, d]; o_proj [dim, heads, d]} -> HF's."""
    att = p["attention"]
    out = {}
    per_head_dim = att["i_proj"]["q_proj"]["weight"].shape[-1]
    for ours, hf in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
        w = np.asarray(att["i_proj"][ours]["weight"])
        w = w.reshape(w.shape[0], -1).T
        if hf == "q":
            w = w / math.sqrt(per_head_dim)
        out[f"{prefix}.{hf}.weight"] = w
    w = np.asarray(att["o_proj"]["weight"])
    out[f"{prefix}.o.weight"] = w.reshape(w.shape[0], -1)
    return out


def _ff_to_hf(p: dict, prefix: str) -> dict:
    out = {f"{prefix}.wo.weight": np.asarray(p["linear2"]["weight"]).T}
    if "linear1" in p:
        out[f"{prefix}.wi.weight"] = np.asarray(p["linear1"]["weight"]).T
    else:
        out[f"{prefix}.wi_0.weight"] = np.asarray(p["linear1_0"]["weight"]).T
        out[f"{prefix}.wi_1.weight"] = np.asarray(p["linear1_1"]["weight"]).T
    return out


def _encoder_to_hf(enc: dict, prefix: str = "encoder") -> dict:
    sd = {
        f"{prefix}.block.0.layer.0.SelfAttention.relative_attention_bias.weight": np.asarray(
            enc["relative_pos_emb"]["emb"]["weight"]
        ),
        f"{prefix}.final_layer_norm.weight": np.asarray(enc["output"]["norm"]["scale"]),
    }
    for i in range(LAYERS):
        layer = enc["transformer"][f"layer{i}"]
        block = f"{prefix}.block.{i}.layer"
        sd.update(_attention_to_hf(layer["self_attention"], f"{block}.0.SelfAttention"))
        sd[f"{block}.0.layer_norm.weight"] = np.asarray(layer["self_attention"]["norm"]["scale"])
        sd.update(_ff_to_hf(layer["feed_forward"], f"{block}.1.DenseReluDense"))
        sd[f"{block}.1.layer_norm.weight"] = np.asarray(layer["feed_forward"]["norm"]["scale"])
    return sd


def _to_hf_state_dict(state: dict) -> dict:
    """Our T5EncoderDecoderModel state -> HF T5ForConditionalGeneration's state dict."""
    emb = np.asarray(state["shared_token_emb"]["weight"])
    dec = state["decoder"]
    sd = {
        "shared.weight": emb,
        "encoder.embed_tokens.weight": emb,
        "decoder.embed_tokens.weight": emb,
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": np.asarray(
            dec["relative_pos_emb"]["emb"]["weight"]
        ),
        "decoder.final_layer_norm.weight": np.asarray(dec["output_norm"]["scale"]),
        "lm_head.weight": np.asarray(dec["lm_head"]["weight"]),
    }
    sd.update(_encoder_to_hf(state["encoder"]))
    for i in range(LAYERS):
        layer = dec["transformer"][f"layer{i}"]
        block = f"decoder.block.{i}.layer"
        sd.update(_attention_to_hf(layer["self_attention"], f"{block}.0.SelfAttention"))
        sd[f"{block}.0.layer_norm.weight"] = np.asarray(layer["self_attention"]["norm"]["scale"])
        sd.update(_attention_to_hf(layer["cross_attention"], f"{block}.1.EncDecAttention"))
        sd[f"{block}.1.layer_norm.weight"] = np.asarray(layer["cross_attention"]["norm"]["scale"])
        sd.update(_ff_to_hf(layer["feed_forward"], f"{block}.2.DenseReluDense"))
        sd[f"{block}.2.layer_norm.weight"] = np.asarray(layer["feed_forward"]["norm"]["scale"])
    return sd


def _hf_config(arch: str, d_ff: int, vocab: int = VOCAB) -> transformers.T5Config:
    return transformers.T5Config(
        vocab_size=vocab,
        d_model=DIM,
        d_kv=DIM // HEADS,
        d_ff=d_ff,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        feed_forward_proj=_HF_FF[arch],
        tie_word_embeddings=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )


def _load(hf_model, sd: dict):
    """Loads `sd` into `hf_model`, giving it an untied LM head if `sd` has one.

    transformers 5 always ties T5's lm_head to `shared` (T5 1.1 checkpoints untie it), so the
    head is replaced by a fresh Linear holding our head weight.
    """
    sd = {k: torch.tensor(np.asarray(v, np.float32)) for k, v in sd.items()}
    head = sd.pop("lm_head.weight", None)
    missing, unexpected = hf_model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    # HF ties embed_tokens (and lm_head) to shared; nothing else may be left out.
    assert all(k.endswith(("embed_tokens.weight", "lm_head.weight")) for k in missing), missing
    if head is not None:
        hf_model.lm_head = torch.nn.Linear(head.shape[1], head.shape[0], bias=False)
        with torch.no_grad():
            hf_model.lm_head.weight.copy_(head)
    return hf_model.eval()


def _inputs(batch: int = 3, source_len: int = 9, target_len: int = 7, vocab: int = VOCAB):
    rng = np.random.default_rng(0)
    source = rng.integers(2, vocab, size=(batch, source_len)).astype(np.int32)
    source[1, 6:] = 0  # Source padding.
    source[2, 4:] = 0
    target = rng.integers(2, vocab, size=(batch, target_len + 1)).astype(np.int32)
    target[:, 0] = 0  # T5's decoder start token.
    labels = target[:, 1:].copy()
    target = target[:, :-1]
    target[2, 5:] = 0  # Trailing target padding.
    labels[2, 5:] = -100
    return source, target, labels


@pytest.mark.parametrize("arch", ["t5-v1-1", "t5-v1"])
def test_encoder_decoder_matches_hf(arch):
    cfg = _model_config(arch)
    model = cfg.instantiate(parent=None)
    state = _random_state(model)
    d_ff = state["encoder"]["transformer"]["layer0"]["feed_forward"]["linear2"]["weight"].shape[0]
    hf = _load(
        transformers.T5ForConditionalGeneration(_hf_config(arch, d_ff)), _to_hf_state_dict(state)
    )
    source, target, labels = _inputs()
    batch = dict(source=dict(input_ids=source), target=dict(input_ids=target), target_labels=labels)
    (loss, aux), _ = jax.jit(
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
            labels=torch.tensor(labels, dtype=torch.long),
        )
    live = (labels >= 0)[..., None]
    np.testing.assert_allclose(
        np.asarray(aux["logits"]) * live, ref.logits.numpy() * live, atol=1e-5, rtol=1e-5
    )
    np.testing.assert_allclose(float(loss), float(ref.loss), rtol=1e-5)
    # Encoder and decoder read one shared token table; the head is untied.
    assert not jax.tree_util.tree_leaves(state["encoder"]["emb"]) and "lm_head" in state["decoder"]


def test_encoder_matches_hf():
    cfg = t5.t5_encoder_config(
        vocab_size=VOCAB, dim=DIM, num_layers=LAYERS, num_attention_heads=HEADS
    ).set(name="enc")
    assert cfg.pad_token_id == 0
    encoder = cfg.instantiate(parent=None)
    state = _random_state(encoder, seed=3)
    d_ff = state["transformer"]["layer0"]["feed_forward"]["linear2"]["weight"].shape[0]
    sd = _encoder_to_hf(state)
    sd["shared.weight"] = np.asarray(state["emb"]["token_emb"]["weight"])
    hf_cfg = _hf_config("t5-v1-1", d_ff)
    hf = transformers.T5EncoderModel(hf_cfg)
    # T5Encoder's RMSNorm default eps (1e-8 unless set); match it in HF.
    eps = encoder.transformer.layer0.self_attention.norm.config.eps
    for module in hf.modules():
        if hasattr(module, "variance_epsilon"):
            module.variance_epsilon = eps
    hf = _load(hf, sd)
    source, _, _ = _inputs()
    out, _ = jax.jit(
        lambda st, x: F(
            encoder,
            inputs=dict(input_ids=x),
            state=st,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
        )
    )(state, source)
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(source, dtype=torch.long),
            attention_mask=torch.tensor(source != 0, dtype=torch.long),
        ).last_hidden_state.numpy()
    live = (source != 0)[..., None]
    np.testing.assert_allclose(np.asarray(out) * live, ref * live, atol=1e-5, rtol=1e-5)


# AXLearn's t5_test reads `load_golden("axlearn.common.t5_test", ...)`: params in our layout,
# inputs and reference outputs. The file shipped in axlearn/experiments/testdata is written here
# from Hugging Face T5 models run on our (NumPy-drawn) parameters; regenerate it with
# AXLEARN_UPDATE_GOLDENS=1. The test below reruns HF on the stored params (no JAX compile); that
# our models match HF is tested above.
GOLDEN_MODULE = "axlearn.common.t5_test"
UPDATE_ENV = "AXLEARN_UPDATE_GOLDENS"
_GOLDEN_VOCAB = 128  # The sizes of AXLearn's t5_test (dim, heads and layers are ours).
_GOLDEN_ARCHS = ("t5-v1-1", "t5-v1", "t5-ul2")


def _flatten(tree: dict, prefix: str = "") -> dict:
    """{"a/b": array} of a nested dict's array leaves (empty dicts have none)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = np.asarray(value)
    return flat


def _golden_encoder_config():
    return t5.t5_encoder_config(
        vocab_size=_GOLDEN_VOCAB, dim=DIM, num_layers=LAYERS, num_attention_heads=HEADS
    ).set(name="test")


def _golden_model_config(arch: str):
    return t5.t5_encoder_decoder_config(
        vocab_size=_GOLDEN_VOCAB,
        dim=DIM,
        num_attention_heads=HEADS,
        num_encoder_layers=LAYERS,
        num_decoder_layers=LAYERS,
        dropout_rate=0,
        z_loss_scale=0,
        stack_cfg=t5.t5_transformer_stack_config(arch=arch),
    ).set(name="test")


def _hf_encoder_outputs(params: dict, input_ids: np.ndarray, eps: float) -> dict:
    d_ff = params["transformer"]["layer0"]["feed_forward"]["linear2"]["weight"].shape[0]
    hf = transformers.T5EncoderModel(_hf_config("t5-v1-1", d_ff, vocab=_GOLDEN_VOCAB))
    for module in hf.modules():
        if hasattr(module, "variance_epsilon"):
            module.variance_epsilon = eps
    sd = _encoder_to_hf(params)
    sd["shared.weight"] = np.asarray(params["emb"]["token_emb"]["weight"])
    hf = _load(hf, sd)
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(input_ids, dtype=torch.long),
            attention_mask=torch.tensor(input_ids != 0, dtype=torch.long),
        )
    return dict(last_hidden_state=out.last_hidden_state.numpy())


def _hf_model_outputs(arch: str, params: dict, inputs: dict) -> dict:
    d_ff = params["encoder"]["transformer"]["layer0"]["feed_forward"]["linear2"]["weight"].shape[0]
    hf = _load(
        transformers.T5ForConditionalGeneration(_hf_config(arch, d_ff, vocab=_GOLDEN_VOCAB)),
        _to_hf_state_dict(params),
    )
    labels = inputs["target_labels"]
    with torch.no_grad():
        out = hf(
            input_ids=torch.tensor(inputs["source_ids"], dtype=torch.long),
            attention_mask=torch.tensor(inputs["source_ids"] != 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(inputs["target_ids"], dtype=torch.long),
            labels=torch.tensor(np.where(labels > 0, labels, -100), dtype=torch.long),
        )
    return dict(ref_logits=out.logits.numpy(), ref_loss=out.loss.numpy())


def _golden_cases() -> dict:
    """{test name: {"params": ..., "inputs": ..., "outputs": ...}} (nested NumPy dicts)."""
    encoder_cfg = _golden_encoder_config()
    encoder = encoder_cfg.instantiate(parent=None)
    params = jax.tree_util.tree_map(np.asarray, _random_state(encoder, seed=10))
    input_ids, _, _ = _inputs(vocab=_GOLDEN_VOCAB)
    eps = encoder.transformer.layer0.self_attention.norm.config.eps
    cases = {
        "test_against_t5_encoder": dict(
            params=params,
            inputs=dict(input_ids=input_ids),
            outputs=_hf_encoder_outputs(params, input_ids, eps),
        )
    }
    for i, arch in enumerate(_GOLDEN_ARCHS):
        model = _golden_model_config(arch).instantiate(parent=None)
        params = jax.tree_util.tree_map(np.asarray, _random_state(model, seed=11 + i))
        source, target, labels = _inputs(vocab=_GOLDEN_VOCAB)
        inputs = dict(source_ids=source, target_ids=target, target_labels=np.maximum(labels, -1))
        cases[f"test_against_t5_encoder_decoder_model_{arch}"] = dict(
            params=params, inputs=inputs, outputs=_hf_model_outputs(arch, params, inputs)
        )
    return cases


def test_axlearn_t5_goldens_hold_hf_outputs():
    """The shipped t5_test golden holds HF's outputs for its params, in our models' layout."""
    path = golden_path(GOLDEN_MODULE)
    if os.environ.get(UPDATE_ENV):
        arrays = {}
        for name, case in _golden_cases().items():
            arrays.update({f"{name}/{k}": v for k, v in _flatten(case).items()})
        np.savez(path, **arrays)
    golden = load_golden(GOLDEN_MODULE, "test_against_t5_encoder")
    encoder = _golden_encoder_config().instantiate(parent=None)
    specs = _flatten(
        jax.tree_util.tree_map(
            lambda s: np.zeros(s.shape),
            encoder.create_parameter_specs_recursively(),
            is_leaf=lambda x: hasattr(x, "mesh_axes"),
        )
    )
    params = _flatten(golden["params"])
    assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in specs.items()}
    eps = encoder.transformer.layer0.self_attention.norm.config.eps
    ref = _hf_encoder_outputs(golden["params"], golden["inputs"]["input_ids"], eps)
    np.testing.assert_allclose(
        golden["outputs"]["last_hidden_state"], ref["last_hidden_state"], rtol=1e-5, atol=1e-5
    )
    for arch in _GOLDEN_ARCHS:
        golden = load_golden(GOLDEN_MODULE, f"test_against_t5_encoder_decoder_model_{arch}")
        model = _golden_model_config(arch).instantiate(parent=None)
        specs = _flatten(
            jax.tree_util.tree_map(
                lambda s: np.zeros(s.shape),
                model.create_parameter_specs_recursively(),
                is_leaf=lambda x: hasattr(x, "mesh_axes"),
            )
        )
        params = _flatten(golden["params"])
        assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in specs.items()}
        ref = _hf_model_outputs(arch, golden["params"], golden["inputs"])
        np.testing.assert_allclose(
            golden["outputs"]["ref_logits"], ref["ref_logits"], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(golden["outputs"]["ref_loss"], ref["ref_loss"], rtol=1e-5)


# AXLearn's t5_test reads `<testdata>/axlearn.common.t5_test/test_buckets_against_t5x_<b>_<n>.npy`
# (a dict {"inputs": relative positions, "outputs": buckets} saved as a NumPy object, which only
# loads with allow_pickle=True). The files shipped in axlearn/experiments/testdata hold HF's
# `T5Attention._relative_position_bucket` of every relative position of an n-token sequence with
# T5's defaults (32 buckets, max distance 128), written here (regenerate with
# AXLEARN_UPDATE_GOLDENS=1) and checked below.
_BUCKET_DIR = os.path.join(os.path.dirname(golden_path(GOLDEN_MODULE)), GOLDEN_MODULE)


def _hf_bucket_case(bidirectional: bool, seq_len: int) -> dict:
    positions = np.arange(seq_len, dtype=np.int32)
    # Memory - query, as int16 (|values| < 256) to keep the files small; the buckets are int32, the
    # dtype AXLearn's test compares with (assertNestedAllClose checks dtypes).
    relative = (positions[None, :] - positions[:, None]).astype(np.int16)
    buckets = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(  # pylint: disable=protected-access
        torch.tensor(relative, dtype=torch.long), bidirectional=bidirectional
    )
    return dict(inputs=relative, outputs=buckets.numpy().astype(np.int32))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_axlearn_t5_bucket_goldens_hold_hf_buckets(bidirectional):
    for seq_len in (20, 100, 256):
        case = _hf_bucket_case(bidirectional, seq_len)
        path = os.path.join(_BUCKET_DIR, f"test_buckets_against_t5x_{bidirectional}_{seq_len}.npy")
        if os.environ.get(UPDATE_ENV):
            os.makedirs(_BUCKET_DIR, exist_ok=True)
            # The format AXLearn's test reads: a pickled dict in a 0-d object array.
            np.save(path, np.array(case, dtype=object), allow_pickle=True)
        # Our own file (checked into this repository), so unpickling it is safe.
        stored = np.load(path, allow_pickle=True).item()
        assert set(stored) == {"inputs", "outputs"}
        np.testing.assert_array_equal(stored["inputs"], case["inputs"])
        np.testing.assert_array_equal(stored["outputs"], case["outputs"])
        assert stored["outputs"].dtype == np.int32
    # Ours on the shortest case (the bucket function is checked in full against NumPy above).
    case = _hf_bucket_case(bidirectional, 20)
    ours = t5.t5_relative_position_bucket(jnp.asarray(case["inputs"]), bidirectional=bidirectional)
    np.testing.assert_array_equal(np.asarray(ours), case["outputs"])
