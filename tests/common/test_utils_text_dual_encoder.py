"""Tests of axlearn.common.utils_text_dual_encoder (the BERT stream encoder against HF BertModel)
and of state_builder.ChainBuilder that its init-state builders use."""

import jax
import numpy as np
import pytest
import torch
import transformers

from axlearn.common.attention import RepeatedTransformerLayer, StackedTransformerLayer
from axlearn.common.layers import L2Norm, Linear
from axlearn.common.module import functional as F
from axlearn.common.param_init import WeightInitializer
from axlearn.common.state_builder import (
    Builder,
    ChainBuilder,
    Converter,
    RestoreAndConvertBuilder,
)
from axlearn.common.text_dual_encoder import POSITIVE_EMBEDDINGS, POSITIVE_INPUT_IDS
from axlearn.common.utils_text_dual_encoder import (
    HF_PARAM_INIT,
    bert_text_embedding_stream_encoder_config,
    init_state_builder_config,
    init_state_builder_siamese_model_config,
)
from tests.common.hf_bert_conversion import (
    BERT_NAMES,
    check_golden,
    encoder_weights,
    numpy_state_dict,
    state_from_flat,
)

VOCAB, DIM, HEADS, LAYERS, MAX_POS = 40, 16, 4, 2, 10


def _cfg(**kwargs):
    return bert_text_embedding_stream_encoder_config(
        pad_token_id=0,
        vocab_size=VOCAB,
        max_seq_len=MAX_POS,
        num_layers=LAYERS,
        num_heads=HEADS,
        hidden_dim=DIM,
        **kwargs,
    )


def test_bert_stream_encoder_matches_hf_bert_cls_state():
    hf_cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * DIM,
        max_position_embeddings=MAX_POS,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        hidden_act="gelu_new",  # jax.nn.gelu's tanh approximation ("nn.gelu").
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_cfg, add_pooling_layer=False).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    layer = _cfg(output_dim=DIM, output_proj=None, output_norm=None)
    layer = layer.set(name="bert").instantiate(parent=None)
    flat = encoder_weights(
        numpy_state_dict(hf), "", dim=DIM, heads=HEADS, layers=LAYERS, names=BERT_NAMES
    )
    state = {"text_encoder": state_from_flat(layer.text_encoder, flat)}
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(3, 8)).astype(np.int32)
    ids[1, 5:] = 0
    out, _ = F(
        layer,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        state=state,
        inputs=dict(input_batch={POSITIVE_INPUT_IDS: ids[:, None]}),
    )
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
        ).last_hidden_state.numpy()[:, :1]
    np.testing.assert_allclose(np.asarray(out[POSITIVE_EMBEDDINGS]), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("remat", [False, True])
def test_bert_stream_encoder_defaults(remat):
    cfg = _cfg(output_dim=8, remat=remat)
    assert cfg.output_proj.klass is Linear and cfg.output_proj.bias
    assert cfg.output_norm.klass is L2Norm
    # The defaults are copies: editing one config leaves the next one's default alone.
    cfg.output_proj.bias = False
    assert _cfg(output_dim=8).output_proj.bias
    text = cfg.text_encoder
    assert text.encoder.emb.type_emb.num_embeddings == 2
    stack = text.encoder.transformer
    assert stack.klass is (RepeatedTransformerLayer if remat else StackedTransformerLayer)
    assert (stack.layer.remat_spec is not None) == remat
    layer = cfg.set(name="s").instantiate(parent=None)
    state = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    ids = np.ones((2, 3, 5), np.int32)
    out, _ = F(
        layer,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        state=state,
        inputs=dict(input_batch={POSITIVE_INPUT_IDS: ids}),
    )
    norms = np.linalg.norm(np.asarray(out[POSITIVE_EMBEDDINGS]), axis=-1)
    np.testing.assert_allclose(norms, np.ones((2, 3)), rtol=1e-5)


def test_hf_param_init_is_unscaled_normal():
    init = HF_PARAM_INIT.init_by_param_name
    (weight_init,) = init.values()
    assert weight_init.klass is WeightInitializer
    assert (weight_init.fan, weight_init.scale, weight_init.distribution) == (None, 0.02, "normal")


class _AddBuilder(Builder):
    """Adds `value` to every leaf and records its path as built."""

    from axlearn.common.config import config_class as _config_class

    @_config_class
    class Config(Builder.Config):
        """Configures _AddBuilder."""

        value: float = 1.0  # Added to every leaf.
        drop: bool = False  # Whether to drop the "b" leaf (a structure change).

    def input_state_type(self):
        return Builder.StateType.TENSORS

    def __call__(self, state):
        tree = {k: v + self.config.value for k, v in state.trainer_state.items()}
        if self.config.drop:
            tree.pop("b")
        return Builder.State(
            step=state.step + 1, trainer_state=tree, built_keys=state.built_keys | {self.path()}
        )


def _state():
    return Builder.State(
        step=0, trainer_state={"a": np.zeros(2), "b": np.ones(2)}, built_keys=set()
    )


def test_chain_builder_applies_builders_in_order_and_checks_structure():
    cfg = init_state_builder_config(
        left_encoder_init_state_builder=_AddBuilder.default_config().set(value=1.0),
        right_encoder_init_state_builder=_AddBuilder.default_config().set(value=10.0),
    )
    assert cfg.klass is ChainBuilder
    chain = cfg.set(name="chain").instantiate(parent=None)
    assert chain.input_state_type() == Builder.StateType.TENSORS
    out = chain(_state())
    assert out.step == 2 and len(out.built_keys) == 2
    np.testing.assert_array_equal(out.trainer_state["b"], [12.0, 12.0])
    bad = ChainBuilder.default_config().set(
        name="chain", builders=[_AddBuilder.default_config().set(drop=True)]
    )
    with pytest.raises(ValueError, match=r"chain: .*b="):
        bad.instantiate(parent=None)(_state())
    lenient = bad.set(validation=None).instantiate(parent=None)
    assert set(lenient(_state()).trainer_state) == {"a"}
    with pytest.raises(ValueError, match=r"chain: builders is empty"):
        ChainBuilder.default_config().set(name="chain", builders=[]).instantiate(parent=None)


def test_init_state_builder_configs():
    left = _AddBuilder.default_config()
    converter = Converter.default_config()
    assert init_state_builder_config() is None
    assert init_state_builder_config(right_encoder_init_state_builder=left).builders == [left]
    wrapped = init_state_builder_config(left_encoder_init_state_builder=left, converter=converter)
    assert wrapped.klass is RestoreAndConvertBuilder
    assert wrapped.builder.klass is ChainBuilder and wrapped.converter == converter
    assert init_state_builder_siamese_model_config() is None
    assert init_state_builder_siamese_model_config(shared_encoder_init_state_builder=left) == left
    siamese = init_state_builder_siamese_model_config(
        shared_encoder_init_state_builder=left, converter=converter
    )
    assert siamese.klass is RestoreAndConvertBuilder and siamese.builder == left


# AXLearn's utils_text_dual_encoder_test reads this golden (regenerated here from HF BertModel).
GOLDEN_MODULE = "axlearn.common.utils_text_dual_encoder_test"
_GOLDEN_IDS = 64  # The ids the inputs use; the other token embeddings are zeros.


def _golden_case() -> dict:
    """AXLearn's test_bert_stream_encoder_config setup (dim 32, 3 layers, 8 heads) from HF."""
    hf_cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=8,
        intermediate_size=128,
        max_position_embeddings=12,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        hidden_act="gelu_new",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(6)
    hf = transformers.BertModel(hf_cfg, add_pooling_layer=False)
    with torch.no_grad():
        hf.embeddings.word_embeddings.weight[_GOLDEN_IDS:] = 0
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn_like(p))
    hf.eval()
    rng = np.random.default_rng(6)
    ids = rng.integers(1, _GOLDEN_IDS, size=(3, 12)).astype(np.int32)
    ids[0, 9:] = 0
    ids[2, 4:] = 0
    with torch.no_grad():
        ref = hf(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0, dtype=torch.long),
        ).last_hidden_state.numpy()
    params = encoder_weights(numpy_state_dict(hf), "", dim=32, heads=8, layers=3, names=BERT_NAMES)
    return dict(params=params, inputs=dict(input_ids=ids), outputs=dict(emb=ref[:, 0]))


def test_axlearn_stream_encoder_golden_holds_hf_outputs():
    """The shipped golden equals fresh HF outputs, and the config helper matches it."""
    case = _golden_case()
    check_golden(GOLDEN_MODULE, {"test_bert_stream_encoder_config": case}, atol=1e-6)
    layer = bert_text_embedding_stream_encoder_config(
        pad_token_id=0,
        vocab_size=30522,
        max_seq_len=12,
        num_layers=3,
        num_heads=8,
        hidden_dim=32,
        output_dim=32,
        output_proj=None,
        output_norm=None,
    )
    layer = layer.set(name="test").instantiate(parent=None)
    state = {"text_encoder": state_from_flat(layer.text_encoder, case["params"])}
    out, _ = F(
        layer,
        is_training=False,
        prng_key=jax.random.PRNGKey(0),
        state=state,
        inputs=dict(input_batch={POSITIVE_INPUT_IDS: case["inputs"]["input_ids"][:, None]}),
    )
    np.testing.assert_allclose(
        np.asarray(out[POSITIVE_EMBEDDINGS])[:, 0], case["outputs"]["emb"], atol=1e-5, rtol=1e-5
    )
