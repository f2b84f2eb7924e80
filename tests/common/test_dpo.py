"""Tests axlearn/common/dpo.py: DPO/IPO loss and gradients vs NumPy, the frozen reference, input."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import dpo, sft
from axlearn.common.config import config_for_function
from axlearn.common.learner import Learner
from axlearn.common.module import functional
from axlearn.common.optimizers import adam_optimizer
from axlearn.common.trainer_step import opt_params
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config


def _np_log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


RNG = np.random.default_rng(0)
PC, PR, RC, RR = (RNG.normal(size=6) * 3 - 20 for _ in range(4))


@pytest.mark.parametrize("beta,eps", [(0.1, 0.0), (0.5, 0.2)])
def test_sigmoid_loss_and_gradients_vs_numpy(beta, eps):
    def loss(pc, pr):
        return dpo.dpo_loss(
            policy_chosen=pc,
            policy_rejected=pr,
            reference_chosen=RC,
            reference_rejected=RR,
            beta=beta,
            label_smoothing=eps,
        ).loss

    h = (PC - RC) - (PR - RR)
    per_pair = -(1 - eps) * _np_log_sigmoid(beta * h) - eps * _np_log_sigmoid(-beta * h)
    value, (g_pc, g_pr) = jax.value_and_grad(loss, argnums=(0, 1))(PC, PR)
    np.testing.assert_allclose(value, per_pair.mean(), rtol=1e-5)
    # d/dh of the per-pair loss, by hand: -(1 - eps) beta s(-beta h) + eps beta s(beta h).
    d_h = (-(1 - eps) * beta * _np_sigmoid(-beta * h) + eps * beta * _np_sigmoid(beta * h)) / 6
    np.testing.assert_allclose(g_pc, d_h, rtol=1e-4)
    np.testing.assert_allclose(g_pr, -d_h, rtol=1e-4)
    out = dpo.dpo_loss(
        policy_chosen=PC, policy_rejected=PR, reference_chosen=RC, reference_rejected=RR, beta=beta
    )
    np.testing.assert_allclose(out.chosen_rewards, beta * (PC - RC), rtol=1e-5)
    np.testing.assert_allclose(out.rejected_rewards, beta * (PR - RR), rtol=1e-5)


def test_ipo_loss_and_valid_mask_vs_numpy():
    beta = 0.25
    h = (PC - RC) - (PR - RR)
    valid = np.array([1, 1, 0, 1, 0, 1], bool)
    out = dpo.dpo_loss(
        policy_chosen=PC,
        policy_rejected=PR,
        reference_chosen=RC,
        reference_rejected=RR,
        beta=beta,
        loss_type="ipo",
        valid=valid,
    )
    per_pair = (h - 1 / (2 * beta)) ** 2
    np.testing.assert_allclose(out.loss, per_pair[valid].mean(), rtol=1e-5)
    grad = jax.grad(
        lambda pc: (
            dpo.dpo_loss(
                policy_chosen=pc,
                policy_rejected=PR,
                reference_chosen=RC,
                reference_rejected=RR,
                beta=beta,
                loss_type="ipo",
                valid=valid,
            ).loss
        )
    )(PC)
    np.testing.assert_allclose(grad, np.where(valid, 2 * (h - 1 / (2 * beta)) / 4, 0), rtol=1e-4)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        dpo.dpo_loss(
            policy_chosen=PC,
            policy_rejected=PR,
            reference_chosen=RC,
            reference_rejected=RR,
            beta=0.1,
            loss_type="hinge",
        )


def test_sequence_log_probs_and_gradient_vs_numpy():
    logits = RNG.normal(size=(2, 4, 5)).astype(np.float32)
    labels = np.array([[-1, 3, 0, 2], [4, -1, 1, 1]], np.int32)  # -1 and pad 0 are no targets.
    live = (labels > 0).astype(np.float64)
    logp = _np_log_softmax(logits.astype(np.float64))
    picked = np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0]
    expected = (picked * live).sum(-1)
    np.testing.assert_allclose(dpo.sequence_log_probs(logits, labels), expected, rtol=1e-5)
    # d sum_b w_b logp_b / d logits = w_b (onehot - softmax) on live positions.
    w = np.array([0.3, -1.2])
    grad = jax.grad(lambda x: jnp.sum(dpo.sequence_log_probs(x, labels) * w))(logits)
    onehot = np.eye(5)[np.maximum(labels, 0)]
    ref = w[:, None, None] * live[..., None] * (onehot - np.exp(logp))
    np.testing.assert_allclose(grad, ref, atol=1e-5)


def _model_cfg():
    policy = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=1, hidden_dim=32, vocab_size=16, stack="stack"
    )
    return dpo.DpoModel.default_config().set(name="model", policy=policy, beta=0.5)


def _batch():
    a = dpo.preference_example([5, 6], [7, 8, 9], [5, 6], eos_id=1)
    b = dpo.preference_example([10], [11, 12], [13], eos_id=1)
    rows = {}
    for side in ("chosen", "rejected"):
        padded = sft.pad_rows([a[side], b[side], a[side]], max_len=8, pad_id=0)
        rows[f"{side}_input_ids"] = padded["input_ids"]
        rows[f"{side}_target_labels"] = padded["target_labels"]
    # The third pair is an empty (padding) row: no targets.
    for side in ("chosen", "rejected"):
        rows[f"{side}_target_labels"][2] = -1
    return rows


def test_dpo_model_loss_gradients_and_frozen_reference():
    cfg = _model_cfg()
    model = cfg.instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(0))
    # The reference starts as a copy of the policy (own buffers).
    for p, r in zip(jax.tree.leaves(params["policy"]), jax.tree.leaves(params["reference"])):
        np.testing.assert_array_equal(p, r)
    # Perturb the policy so that it differs from the reference.
    params["policy"] = jax.tree.map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(3), x.shape), params["policy"]
    )
    batch = _batch()

    @jax.jit
    def run(params):
        def loss_fn(params):
            (loss, aux), collection = functional(
                model,
                prng_key=None,
                state=params,
                inputs=dict(input_batch=batch),
                is_training=True,
            )
            return loss, (aux, collection.summaries)

        (loss, (aux, summaries)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)

        def logits(name):
            ids = jnp.concatenate([batch["chosen_input_ids"], batch["rejected_input_ids"]])
            out, _ = functional(
                getattr(model, name),
                prng_key=None,
                state=params[name],
                inputs=dict(input_batch=dict(input_ids=ids)),
                method="predict",
                is_training=False,
            )
            return out["logits"]

        return loss, summaries, grads, logits("policy"), logits("reference")

    loss, summaries, grads, pol_logits, ref_logits = jax.device_get(run(params))
    labels = np.concatenate([batch["chosen_target_labels"], batch["rejected_target_labels"]])
    live = labels > 0

    def seq(lg):
        logp = _np_log_softmax(np.asarray(lg, np.float64))
        return (np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0] * live).sum(
            -1
        )

    pol, ref = seq(pol_logits), seq(ref_logits)
    h = (pol[:3] - ref[:3]) - (pol[3:] - ref[3:])
    valid = np.array([True, True, False])
    np.testing.assert_allclose(loss, -_np_log_sigmoid(0.5 * h[valid]).mean(), rtol=1e-4)
    margin = 0.5 * h[valid]
    np.testing.assert_allclose(summaries["rewards/margin"].mean, margin.mean(), rtol=1e-4)
    assert float(summaries["rewards/accuracy"].mean) == float((margin > 0).mean())
    assert float(summaries["rewards/accuracy"].weight) == 2.0
    # No gradient reaches the reference; the policy gets one.
    assert all((g == 0).all() for g in jax.tree.leaves(grads["reference"]))
    assert any((g != 0).any() for g in jax.tree.leaves(grads["policy"]))
    # The learner rule keeps no optimizer state for the reference.
    learner = (
        Learner.default_config()
        .set(
            name="learner",
            optimizer=config_for_function(adam_optimizer).set(
                learning_rate=0.1, b1=0.9, b2=0.99, eps=1e-8
            ),
            update_rules=dpo.FROZEN_REFERENCE_RULES,
        )
        .instantiate(parent=None)
    )
    state = learner.init(opt_params(params, model.create_parameter_specs_recursively()))
    paths = [str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    assert paths and not any("reference" in p for p in paths)
    assert any("policy" in p for p in paths)


def test_dpo_model_bad_config():
    with pytest.raises(ValueError, match=r"^model.loss_type='hinge'"):
        _model_cfg().set(loss_type="hinge").instantiate(parent=None)
    with pytest.raises(ValueError, match=r"^model.beta=0"):
        _model_cfg().set(beta=0).instantiate(parent=None)


def _input_cfg(path, **kwargs):
    return dpo.PreferenceInput.default_config().set(
        name="input",
        path=path,
        global_batch_size=2,
        max_len=16,
        vocab=sft.CharVocabulary.default_config().set(alphabet="abcdefgh>"),
        template=sft.ChatTemplate.default_config().set(prompt_format="{prompt}>"),
        **kwargs,
    )


def test_preference_input(tmp_path):
    records = [
        dict(prompt="ab", chosen="ba", rejected="ab"),
        dict(prompt="c", chosen="cc", rejected="c"),
    ]
    path = tmp_path / "prefs.json"
    path.write_text(json.dumps(records * 3))
    it = iter(_input_cfg(str(path), is_training=False, split="all").instantiate(parent=None))
    batch = next(it)
    assert set(batch) == set(dpo.PREFERENCE_KEYS)
    # "ab>" then "ba": s = [1, a, b, >, b, a, 1] with a=2, b=3, > = 10.
    np.testing.assert_array_equal(batch["chosen_input_ids"][0, :7], [1, 2, 3, 10, 3, 2, 0])
    np.testing.assert_array_equal(batch["chosen_target_labels"][0, :7], [-1, -1, -1, 3, 2, 1, -1])
    np.testing.assert_array_equal(batch["rejected_target_labels"][0, :7], [-1, -1, -1, 2, 3, 1, -1])
    assert len(list(it)) == 2  # One pass: 6 pairs in batches of 2.


def test_preference_record_without_rejected(tmp_path):
    path = tmp_path / "prefs.json"
    path.write_text(
        json.dumps([dict(prompt="ab", chosen="ba", rejected="ab"), dict(prompt="c", chosen="cc")])
    )
    with pytest.raises(ValueError, match=r"^input: record 1 of .*prefs.json has no 'rejected'"):
        _input_cfg(str(path), is_training=True).instantiate(parent=None)
