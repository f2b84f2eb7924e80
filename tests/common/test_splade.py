"""Tests axlearn.common.splade: SPLADE pooling of an HF BERT MLM head's logits, in NumPy.

The MLM head is Hugging Face's `BertLMPredictionHead` built from a config (no download); the
pooling (max or sum over live tokens of log(1 + relu(logits))) and the FLOPS regularizer of its
output are written here in NumPy. The same data is AXLearn's splade_test golden, shipped in
axlearn/experiments/testdata (regenerate with AXLEARN_UPDATE_GOLDENS=1).
"""

import jax
import numpy as np
import pytest
import torch
import transformers
from transformers.models.bert.modeling_bert import BertLMPredictionHead

from axlearn.common.layers import Linear
from axlearn.common.loss import flops_loss
from axlearn.common.module import functional as F
from axlearn.common.splade import SpladePooling
from tests.common.hf_bert_conversion import check_golden, numpy_state_dict, state_from_flat

GOLDEN_MODULE = "axlearn.common.splade_test"
DIM, VOCAB = 32, 64


def _np_splade(logits: np.ndarray, live: np.ndarray, mode: str) -> np.ndarray:
    """[batch, 1, vocab] SPLADE weights of [batch, seq, vocab] logits and a [batch, seq] mask."""
    act = np.log1p(np.maximum(logits, 0.0)) * live[..., None]
    pooled = act.max(axis=1) if mode == "max" else act.sum(axis=1)
    return pooled[:, None]


def _golden_cases() -> dict:
    """AXLearn's splade_test cases: {name: params (our layout), inputs, outputs} from HF."""
    cases = {}
    rng = np.random.default_rng(7)
    for seed, mode in enumerate(("max", "sum")):
        # nn.gelu is tanh-approximated ("gelu_new"); our LayerNorm's eps is 1e-8.
        cfg = transformers.BertConfig(
            hidden_size=DIM, vocab_size=VOCAB, hidden_act="gelu_new", layer_norm_eps=1e-8
        )
        torch.manual_seed(seed)
        head = BertLMPredictionHead(cfg)
        with torch.no_grad():
            # Outside a full model the head's `bias` is not tied to the decoder's: set both.
            head.decoder.bias.normal_(0.0, 0.5)
            head.bias.copy_(head.decoder.bias)
            head.transform.LayerNorm.weight.add_(0.1 * torch.randn(DIM))
            head.transform.LayerNorm.bias.normal_(0.0, 0.1)
        head.eval()
        sd = numpy_state_dict(head)
        params = {
            "vocab_mapping/transform/linear/weight": sd["transform.dense.weight"].T,
            "vocab_mapping/transform/linear/bias": sd["transform.dense.bias"],
            "vocab_mapping/transform/norm/scale": sd["transform.LayerNorm.weight"],
            "vocab_mapping/transform/norm/bias": sd["transform.LayerNorm.bias"],
            "vocab_mapping/inner_head/weight": sd["decoder.weight"].T,
            "vocab_mapping/output_bias": sd["decoder.bias"],
        }
        for padded in (False, True):
            tokens = rng.normal(size=(3, 6, DIM)).astype(np.float32)
            # Torch-style mask, as AXLearn's test expects: 1 = valid token.
            mask = np.ones((3, 6), np.float32)
            if padded:
                mask[0, 4:] = 0
                mask[2, 1:] = 0
            with torch.no_grad():
                logits = head(torch.tensor(tokens)).numpy()
            inputs = dict(tokens=tokens)
            if padded:
                inputs["paddings"] = mask
            name = f"test_splade_pooling_{mode}_{'with_padding' if padded else 'no_padding'}"
            cases[name] = dict(
                params=_nest(params),
                inputs=inputs,
                outputs=dict(values=_np_splade(logits, mask, mode)),
            )
    return cases


def _nest(flat: dict) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _layer(mode: str):
    cfg = SpladePooling.default_config().set(
        name="splade", input_dim=DIM, output_dim=VOCAB, splade_mode=mode
    )
    cfg.vocab_mapping.inner_head = Linear.default_config().set(
        bias=False, input_dim=DIM, output_dim=VOCAB
    )
    return cfg.instantiate(parent=None)


@pytest.mark.parametrize("mode", ["max", "sum"])
def test_splade_pooling_matches_hf_head_and_numpy(mode):
    cases = _golden_cases()
    check_golden(GOLDEN_MODULE, cases, atol=1e-6)
    layer = _layer(mode)
    for padded in (False, True):
        case = cases[f"test_splade_pooling_{mode}_{'with_padding' if padded else 'no_padding'}"]
        flat = {
            k: v
            for k, v in jax.tree_util.tree_flatten_with_path(case["params"])[0]
            for k in [jax.tree_util.keystr(k, simple=True, separator="/")]
        }
        state = state_from_flat(layer, flat)
        paddings = 1.0 - case["inputs"]["paddings"] if padded else None
        out, _ = F(
            layer,
            inputs=dict(tokens=case["inputs"]["tokens"], paddings=paddings),
            state=state,
            is_training=False,
            prng_key=jax.random.PRNGKey(0),
        )
        expected = case["outputs"]["values"]
        assert out.shape == (3, 1, VOCAB)
        np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)
        # The FLOPS regularizer of the SPLADE vectors: sum_j (mean_i |w_ij|)^2.
        loss, sparse = flops_loss(embeddings=out)
        np.testing.assert_allclose(loss, np.sum(expected[:, 0].mean(axis=0) ** 2), rtol=1e-4)
        np.testing.assert_allclose(sparse, np.mean(np.sum(expected[:, 0] == 0, axis=-1)))


def test_splade_pooling_config_errors():
    cfg = SpladePooling.default_config().set(name="splade", input_dim=DIM, output_dim=VOCAB)
    with pytest.raises(ValueError, match="splade.splade_mode='mean' is not supported"):
        cfg.clone(splade_mode="mean").instantiate(parent=None)
    with pytest.raises(NotImplementedError, match="num_outputs=2"):
        cfg.clone(num_outputs=2).instantiate(parent=None)
    # By default the MLM head's output layer is the shared token embedding's attend.
    assert cfg.vocab_mapping.inner_head.shared_module == SpladePooling.SHARED_EMB_NAME
    assert cfg.vocab_mapping.inner_head.method_map == dict(forward="attend")
