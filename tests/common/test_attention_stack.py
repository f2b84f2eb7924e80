"""Tests of the remat choices of axlearn.common.attention.stack (remat by name).

References: the remat names a decoder layer tags (read from its jaxpr), the unremat'ed model's
loss and gradients, and XLA's memory analysis of the compiled gradient step per choice.
"""

import re

import jax
import numpy as np
import pytest

from axlearn.common.attention import (
    REMAT_CHOICES,
    StackedTransformerLayer,
    remat_choices_of,
    remat_name_of,
    remat_spec_by_name,
)
from axlearn.common.base_layer import RematSpec
from axlearn.common.module import functional
from axlearn.common.utils import flatten_items
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

_NAMES = {
    "GroupedQueryAttention.q_proj",
    "GroupedQueryAttention.k_proj",
    "GroupedQueryAttention.v_proj",
    "GroupedQueryAttention.o_proj",
    "GroupedQueryAttention.context",
    "TransformerFeedForwardLayer.linear1_0",
    "TransformerFeedForwardLayer.linear1_1",
    "TransformerFeedForwardLayer.linear2",
}


def _model_cfg(remat: str, stack: str = "repeat", num_layers: int = 2):
    cfg = transformer_lm_config(
        num_layers=num_layers,
        model_dim=32,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=128,
        vocab_size=64,
        stack=stack,
    )
    stack_cfg = cfg.decoder.transformer
    stack_cfg.layer.remat_spec = remat_spec_by_name(remat, stack_cfg=stack_cfg)
    return cfg.set(name="model")


def test_choices_save_the_named_activations():
    assert list(REMAT_CHOICES) == ["none", "save_matmuls", "save_context", "full"]
    assert remat_spec_by_name("none") is None
    full = remat_spec_by_name("full")
    assert full == RematSpec(prevent_cse=False, policy=None)
    stacked = StackedTransformerLayer.default_config()
    assert remat_spec_by_name("full", stack_cfg=stacked).prevent_cse is True

    def saved(name):
        pattern = remat_spec_by_name(name).policy.names_which_can_be_saved
        return {n for n in _NAMES if re.fullmatch(pattern, n)}

    assert saved("save_matmuls") == _NAMES
    assert saved("save_context") == {"GroupedQueryAttention.context"}
    for name in REMAT_CHOICES:
        assert remat_name_of(remat_spec_by_name(name)) == name
    assert remat_name_of(RematSpec(policy=lambda *a, **k: True)) == "custom"


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError) as e:
        remat_spec_by_name("save_everything", config_path="mesh_rules[gpu].remat")
    assert str(e.value) == (
        "mesh_rules[gpu].remat='save_everything' is not a remat choice; choose one of none, "
        "save_matmuls, save_context, full."
    )


def test_remat_choices_of_reports_layers_only():
    cfg = _model_cfg("save_context")
    assert remat_choices_of(cfg, "model") == {"model.decoder.transformer.layer": "save_context"}
    cfg = _model_cfg("full", stack="stack")
    assert remat_choices_of(cfg, "model") == {"model.decoder.transformer.layer": "full"}


@pytest.mark.slow
def test_every_choice_same_gradients_and_reports_its_memory():
    """Remat changes memory, not math: equal gradients; fewer temp bytes the less is saved."""
    batch_ids = jax.random.randint(jax.random.PRNGKey(1), (8, 64), 1, 64)
    batch = dict(input_ids=batch_ids, target_labels=jax.numpy.roll(batch_ids, -1, axis=1))
    models = {
        name: _model_cfg(name, num_layers=4).instantiate(parent=None) for name in REMAT_CHOICES
    }
    params = jax.jit(models["none"].initialize_parameters_recursively)(jax.random.PRNGKey(0))
    grads, temp = {}, {}
    for name, model in models.items():

        def loss_fn(params, model=model):
            (loss, _), _ = functional(
                model, jax.random.PRNGKey(2), params, dict(input_batch=batch), is_training=True
            )
            return loss

        compiled = jax.jit(jax.grad(loss_fn)).lower(params).compile()
        temp[name] = compiled.memory_analysis().temp_size_in_bytes
        grads[name] = compiled(params)
    for name in REMAT_CHOICES:
        for (path, a), (_, b) in zip(flatten_items(grads[name]), flatten_items(grads["none"])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=f"{name} {path}")
    # Measured here: none 16.0 MB, save_matmuls 6.2 MB, save_context 4.3 MB, full 4.5 MB (full
    # keeps less between layers but needs the whole layer's working set again in its backward).
    assert temp["save_context"] < temp["save_matmuls"] < temp["none"], temp
    assert temp["full"] < temp["save_matmuls"], temp
