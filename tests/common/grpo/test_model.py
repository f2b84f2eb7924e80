"""Tests axlearn/common/grpo/model.py: GrpoModel's loss vs NumPy, the reference, the helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.grpo import model as grpo_model
from axlearn.common.module import functional
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _cfg(**kwargs):
    policy = transformer_lm_config(
        num_layers=1,
        model_dim=16,
        num_heads=1,
        hidden_dim=32,
        vocab_size=12,
        stack="stack",
        tied_embedding=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    return grpo_model.GrpoModel.default_config().set(name="model", policy=policy, **kwargs)


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 12, size=(4, 7)).astype(np.int32)
    ids[:, 0] = 1
    ids[1, 5:] = 0  # A sample that stopped (pad after its EOS).
    ids[1, 4] = 1
    mask = np.zeros((4, 6), np.float32)
    mask[:, 3:] = 1
    mask[1, 4:] = 0
    return dict(
        input_ids=ids[:, :-1],
        target_labels=ids[:, 1:],
        completion_mask=mask,
        reference_log_probs=np.log(rng.uniform(0.05, 0.5, (4, 6))).astype(np.float32),
        advantages=np.asarray([1.0, -1.0, 0.5, -0.5], np.float32),
        rewards=np.asarray([1.0, 0.0, 0.75, 0.25], np.float32),
    )


def test_forward_loss_gradients_and_frozen_reference():
    model = _cfg(kl_coef=0.1, temperature=0.7).instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    for p, r in zip(jax.tree.leaves(params["policy"]), jax.tree.leaves(params["reference"])):
        np.testing.assert_array_equal(p, r)
    batch = _batch()

    def loss_fn(params):
        (loss, aux), collection = functional(
            model, prng_key=None, state=params, inputs=dict(input_batch=batch), is_training=True
        )
        return loss, (aux, collection.summaries)

    (loss, (aux, summaries)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    logits, _ = functional(
        model.policy,
        prng_key=None,
        state=params["policy"],
        inputs=dict(input_batch=dict(input_ids=batch["input_ids"])),
        method="predict",
        is_training=True,
    )
    logp = _np_log_softmax(np.asarray(logits["logits"], np.float64) / 0.7)
    logp = np.take_along_axis(logp, batch["target_labels"][..., None], -1)[..., 0]
    # Ratio 1 (one update per rollout): per token -(A - beta * k3), averaged per sample.
    delta = batch["reference_log_probs"] - logp
    k3 = np.exp(delta) - delta - 1
    mask = batch["completion_mask"]
    per_token = -(batch["advantages"][:, None] - 0.1 * k3)
    want = ((per_token * mask).sum(1) / np.maximum(mask.sum(1), 1)).mean()
    np.testing.assert_allclose(loss, want, rtol=1e-4)
    np.testing.assert_allclose(aux["kl"], ((k3 * mask).sum(1) / mask.sum(1)).mean(), rtol=1e-4)
    np.testing.assert_allclose(summaries["reward_mean"].mean, 0.5)
    np.testing.assert_allclose(summaries["completion_length"].mean, mask.sum(1).mean())
    assert all((g == 0).all() for g in jax.tree.leaves(grads["reference"]))
    assert any((g != 0).any() for g in jax.tree.leaves(grads["policy"]))
    # The reference's log-probs: the reference model's, at the temperature.
    ref, _ = functional(
        model,
        prng_key=None,
        state=params,
        inputs=dict(input_batch=batch),
        method="reference_log_probs",
        is_training=False,
    )
    np.testing.assert_allclose(ref, logp, rtol=1e-4, atol=1e-5)


def test_forward_names_missing_keys():
    model = _cfg().instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    batch = _batch()
    del batch["advantages"]
    with pytest.raises(KeyError, match=r"model: input_batch has no \['advantages'\]"):
        functional(
            model, prng_key=None, state=params, inputs=dict(input_batch=batch), is_training=True
        )


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("temperature", 0.0, r"^model.temperature=0.0: must be > 0"),
        ("clip_epsilon", 0.0, r"^model.clip_epsilon=0.0: must be > 0"),
        ("kl_coef", -1.0, r"^model.kl_coef=-1.0: must be >= 0"),
    ],
)
def test_bad_fields_name_the_config_path(field, value, message):
    with pytest.raises(ValueError, match=message):
        _cfg(**{field: value}).instantiate(parent=None)


def test_rollout_helpers():
    prefix = np.asarray([[1, 5, 2, 0], [1, 6, 7, 2]], np.int32)
    sequences = np.arange(2 * 2 * 5, dtype=np.int32).reshape(2, 2, 5) + 20
    ids = np.asarray(grpo_model.rollout_ids(jnp.asarray(prefix), jnp.asarray(sequences)))
    assert ids.shape == (4, 6)
    np.testing.assert_array_equal(ids[:, 0], [1, 1, 1, 1])
    np.testing.assert_array_equal(ids[3, 1:], sequences[1, 1])
    rows = np.asarray([[1, 5, 2, 3, 1, 0, 0], [1, 6, 7, 2, 4, 4, 1]], np.int32)
    mask = np.asarray(grpo_model.completion_mask(prefix, rows, group_size=1, pad_id=0))
    # Prompt 0 ends at position 2 (then pad): positions 3.. that are not pad are sampled.
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1]])
    prompts, completions = grpo_model.split_completions(
        rows, prefix, group_size=1, pad_id=0, eos_id=1
    )
    np.testing.assert_array_equal(prompts[0], [1, 5, 2])
    np.testing.assert_array_equal(completions[0], [3])
    np.testing.assert_array_equal(completions[1], [4, 4])
