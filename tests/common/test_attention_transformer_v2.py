"""Tests of structure="v2" (norms by NormPosition) of the transformer attention and FFN layers.

Each v2 layout is checked against the structure it equals ({IN_NORM}: prenorm, {OUT_NORM}:
postnorm, {IN_NORM, RES_NORM}: hybridnorm; those are checked against NumPy in test_attention.py)
with the same parameters, and all three norms against a NumPy RMS norm of the hybrid output.
"""

import jax
import numpy as np
import pytest

from axlearn.common.attention import (
    NormPosition,
    TransformerAttentionLayer,
    TransformerFeedForwardLayer,
)
from axlearn.common.attention_bias import CausalAttentionBias
from axlearn.common.layers import RMSNorm
from axlearn.common.module import functional

DIM = 8
_RENAMES = {
    "prenorm": {"norm": "in_norm"},
    "postnorm": {"norm": "out_norm"},
    "hybridnorm": {"prenorm": "in_norm", "postnorm": "res_norm"},
}
_NORMS = {
    "prenorm": [NormPosition.IN_NORM],
    "postnorm": [NormPosition.OUT_NORM],
    "hybridnorm": [NormPosition.IN_NORM, NormPosition.RES_NORM],
}


def _ffn(**kwargs):
    return TransformerFeedForwardLayer.default_config().set(
        name="ffn", input_dim=DIM, hidden_dim=16, **kwargs
    )


def _attn(**kwargs):
    cfg = TransformerAttentionLayer.default_config().set(
        name="attn", target_dim=DIM, source_dim=DIM, **kwargs
    )
    cfg.attention.set(num_heads=2, mask=CausalAttentionBias.default_config())
    return cfg


def _run(cfg, params, inputs):
    layer = cfg.instantiate(parent=None)
    if params is None:
        params = layer.initialize_parameters_recursively(jax.random.PRNGKey(0))
    out, _ = functional(layer, jax.random.PRNGKey(1), params, inputs, is_training=False)
    return out, params


def _renamed(params, renames):
    return {renames.get(k, k): v for k, v in params.items()}


@pytest.mark.parametrize("structure", ["prenorm", "postnorm", "hybridnorm"])
@pytest.mark.parametrize("kind", ["ffn", "attention"])
def test_v2_equals_named_structures(structure, kind):
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, DIM))
    make = _ffn if kind == "ffn" else _attn
    inputs = dict(inputs=x) if kind == "ffn" else dict(target=x)
    ref, params = _run(make(structure=structure, norm=RMSNorm.default_config()), None, inputs)
    norms = {p: RMSNorm.default_config() for p in _NORMS[structure]}
    out, _ = _run(make(structure="v2", norm=norms), _renamed(params, _RENAMES[structure]), inputs)
    if kind == "attention":
        ref, out = ref.data, out.data
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_v2_all_norms_matches_numpy_out_norm():
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 5, DIM))
    hybrid, params = _run(
        _ffn(structure="hybridnorm", norm=RMSNorm.default_config()), None, dict(inputs=x)
    )
    params = _renamed(params, _RENAMES["hybridnorm"])
    scale = np.linspace(0.5, 1.5, DIM).astype(np.float32)
    params["out_norm"] = dict(scale=scale)
    norms = {p: RMSNorm.default_config() for p in NormPosition}
    out, _ = _run(_ffn(structure="v2", norm=norms), params, dict(inputs=x))
    h = np.asarray(hybrid, np.float64)
    eps = RMSNorm.default_config().eps
    ref = h / np.sqrt((h**2).mean(-1, keepdims=True) + eps) * scale
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_v2_needs_norm_dict():
    with pytest.raises(ValueError, match="ffn: structure='v2' needs norm as a dict"):
        _ffn(structure="v2").instantiate(parent=None)
    with pytest.raises(ValueError, match="norm key 'mid' must be a NormPosition"):
        _ffn(structure="v2", norm={"mid": RMSNorm.default_config()}).instantiate(parent=None)
