"""Tests of axlearn.common.attention.RematRegexSavePatterns against the layers' remat names."""

import re

import jax

from axlearn.common.attention import RematRegexSavePatterns, build_remat_spec
from axlearn.common.module import functional
from axlearn.common.utils import save_and_offload_only_these_names_regex
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config


def _remat_names():
    """The remat names a decoder layer tags (from a jaxpr of its forward)."""
    cfg = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=2, hidden_dim=32, vocab_size=50, stack="stack"
    )
    model = cfg.set(name="model").instantiate(parent=None)
    layer = model.decoder.transformer.layer0
    params = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
    layer_params = params["decoder"]["transformer"]["layer0"]

    def run(p, x):
        return functional(layer, None, p, dict(data=x), is_training=False)[0].data

    jaxpr = jax.make_jaxpr(run)(layer_params, jax.ShapeDtypeStruct((1, 4, 16), "float32"))
    # checkpoint_name equations print as `name[name=GroupedQueryAttention.q_proj]`.
    return set(re.findall(r"name\[name=([\w.]+)\]", str(jaxpr)))


def test_patterns_match_layer_remat_names():
    names = _remat_names()
    assert "GroupedQueryAttention.q_proj" in names
    assert "TransformerFeedForwardLayer.linear2" in names

    def matched(pattern):
        return {n for n in names if re.fullmatch(pattern.value, n)}

    P = RematRegexSavePatterns
    assert matched(P.QKV_PROJ) == {f"GroupedQueryAttention.{x}_proj" for x in "qkv"}
    assert matched(P.O_PROJ) == {"GroupedQueryAttention.o_proj"}
    assert matched(P.CONTEXT) == {"GroupedQueryAttention.context"}
    assert matched(P.LINEAR1_X) == {f"TransformerFeedForwardLayer.linear1_{i}" for i in (0, 1)}
    assert matched(P.SELF_ATTENTION) == matched(P.QKV_PROJ) | matched(P.O_PROJ) | matched(P.CONTEXT)
    assert matched(P.FEED_FORWARD) == matched(P.LINEAR1_X) | matched(P.LINEAR2_X)
    # The default remat spec saves exactly the self-attention pattern.
    spec = build_remat_spec(
        transformer_lm_config(
            num_layers=1, model_dim=16, num_heads=2, hidden_dim=32, vocab_size=50
        ).decoder.transformer
    )
    assert spec.policy.names_which_can_be_saved == P.SELF_ATTENTION.value
    assert callable(
        save_and_offload_only_these_names_regex(
            names_which_can_be_saved=P.FEED_FORWARD.value,
            names_which_can_be_offloaded=None,
            offload_src="device",
            offload_dst="pinned_host",
        )
    )
