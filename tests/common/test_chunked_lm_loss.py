"""Tests of axlearn.common.chunked_lm_loss and of causal_lm.Model's `logits_chunk_size`.

References: `loss.cross_entropy` of the full logits (the plain path), NumPy, and the plain
model path (logits_chunk_size=None) with the same parameters and batches.
"""

import gzip
import json
import os

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common import chunked_lm_loss
from axlearn.common.chunked_lm_loss import chunked_lm_head_loss
from axlearn.common.loss import cross_entropy
from axlearn.common.module import functional
from axlearn.common.utils import flatten_items
from axlearn.experiments.text.gpt.model_builders import transformer_lm_config

_DATA = os.path.join(os.path.dirname(chunked_lm_loss.__file__), os.pardir, "data")


def _rel_err(a, b) -> float:
    """max |a - b| / max |b| (the tolerance unit of the issue: relative to the reference)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _head_problem(seed=0, batch=3, seq=10, dim=16, vocab=50):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(batch, seq, dim)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(vocab, dim)) * 0.5, jnp.float32)
    labels = jnp.asarray(rng.integers(-1, vocab, size=(batch, seq)), jnp.int32)
    labels = labels.at[0, -4:].set(0)  # Padding (label 0 is the pad id below).
    return hidden, weight, labels


def _plain(hidden, weight, labels, *, z_loss_scale, soft_cap=None):
    logits = jnp.einsum("btd,vd->btv", hidden, weight)
    if soft_cap:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    live = (labels >= 0) & (labels != 0)
    loss, parts = cross_entropy(logits, labels, live_targets=live, z_loss_scale=z_loss_scale)
    correct = (jnp.argmax(logits, -1) == labels) & live
    parts = dict(parts, accuracy=correct.sum() / jnp.maximum(1.0, live.sum()))
    return loss, parts


def _chunked(hidden, weight, labels, *, chunk_size, z_loss_scale, soft_cap=None):
    live = (labels >= 0) & (labels != 0)
    return chunked_lm_head_loss(
        hidden,
        weight,
        labels,
        live_targets=live,
        chunk_size=chunk_size,
        z_loss_scale=z_loss_scale,
        soft_cap=soft_cap,
    )


# 10 positions: chunks that divide (1, 5, 10), that do not (3, 4: padded) and that exceed (64).
@pytest.mark.parametrize(
    "chunk_size,z_loss_scale,soft_cap",
    [(1, 0.0, None), (5, 1e-2, None), (3, 1e-2, None), (4, 1e-3, 3.0), (10, 0.0, 3.0),
     (64, 1e-2, None)],
)  # fmt: skip
def test_head_loss_equals_plain_fp32(chunk_size, z_loss_scale, soft_cap):
    hidden, weight, labels = _head_problem()
    kw = dict(z_loss_scale=z_loss_scale, soft_cap=soft_cap)
    (loss_p, parts_p), grads_p = jax.value_and_grad(
        lambda h, w: _plain(h, w, labels, **kw), argnums=(0, 1), has_aux=True
    )(hidden, weight)
    (loss_c, parts_c), grads_c = jax.jit(
        jax.value_and_grad(
            lambda h, w: _chunked(h, w, labels, chunk_size=chunk_size, **kw),
            argnums=(0, 1),
            has_aux=True,
        )
    )(hidden, weight)
    assert _rel_err(loss_c, loss_p) < 1e-6
    for key in ("cross_entropy", "z_loss", "accuracy", "num_targets"):
        assert _rel_err(parts_c[key], parts_p[key]) < 1e-6, key
    assert _rel_err(parts_c["per_target_loss"], parts_p["per_target_loss"]) < 1e-6
    for got, want in zip(grads_c, grads_p):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert _rel_err(got, want) < 1e-6
    # Without a gradient (the primal path) the values are the same.
    loss_f, parts_f = _chunked(hidden, weight, labels, chunk_size=chunk_size, **kw)
    assert _rel_err(loss_f, loss_p) < 1e-6
    assert _rel_err(parts_f["accuracy"], parts_p["accuracy"]) < 1e-6


def test_head_loss_matches_numpy_and_scales_with_cotangent():
    hidden, weight, labels = _head_problem(seed=3)
    logits = np.einsum("btd,vd->btv", np.float64(hidden), np.float64(weight))
    log_z = np.log(np.exp(logits).sum(-1))
    lab = np.asarray(labels)
    live = (lab >= 0) & (lab != 0)
    ce = log_z - np.take_along_axis(logits, np.maximum(lab, 0)[..., None], -1)[..., 0]
    want = ((ce + 0.1 * log_z**2) * live).sum() / live.sum()
    loss, _ = _chunked(hidden, weight, labels, chunk_size=4, z_loss_scale=0.1)
    np.testing.assert_allclose(float(loss), want, rtol=1e-6)
    # d(3 * loss) = 3 * d(loss): the backward pass scales the forward's gradients.
    g1 = jax.grad(lambda h: _chunked(h, weight, labels, chunk_size=4, z_loss_scale=0.1)[0])(hidden)
    g3 = jax.grad(lambda h: 3 * _chunked(h, weight, labels, chunk_size=4, z_loss_scale=0.1)[0])(
        hidden
    )
    np.testing.assert_allclose(g3, 3 * g1, rtol=1e-6, atol=1e-9)


def test_no_full_logits_in_forward_or_backward():
    """No intermediate of the value-and-grad computation has the [batch, seq, vocab] shape."""
    hidden, weight, labels = _head_problem(batch=2, seq=12, dim=8, vocab=40)

    def shapes(fn):
        jaxpr = jax.make_jaxpr(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(hidden, weight)
        found = set()

        def visit(jp):
            for eqn in jp.eqns:
                for var in eqn.outvars:
                    found.add(tuple(getattr(var.aval, "shape", ())))
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    visit(sub)

        visit(jaxpr.jaxpr)
        return found

    full = (2, 12, 40)
    assert full in shapes(lambda h, w: _plain(h, w, labels, z_loss_scale=1e-3))
    chunked = shapes(lambda h, w: _chunked(h, w, labels, chunk_size=4, z_loss_scale=1e-3))
    assert full not in chunked
    assert (2, 4, 40) in chunked  # One chunk's logits.


@pytest.mark.parametrize("bad", [0, -8, 2.5, "256"])
def test_bad_chunk_size_is_rejected_naming_the_value(bad):
    hidden, weight, labels = _head_problem()
    with pytest.raises(ValueError, match=rf"model\.logits_chunk_size={bad!r} must be a positive"):
        chunked_lm_head_loss(
            hidden,
            weight,
            labels,
            live_targets=labels > 0,
            chunk_size=bad,
            config_path="model.logits_chunk_size",
        )


# ------------------------------------------------------------------------------------------------
# The model: logits_chunk_size vs the plain path.
# ------------------------------------------------------------------------------------------------

_VOCAB = 4096  # The shipped sentencepiece vocabulary's size (for the real batch).


def _model_pair(**kwargs):
    base = dict(
        num_layers=2,
        model_dim=32,
        num_heads=4,
        num_kv_heads=2,
        hidden_dim=48,
        vocab_size=_VOCAB,
        rope_theta=500.0,
        qk_norm=True,
        z_loss_scale=1e-3,
    )
    base.update(kwargs)
    chunk_size = base.pop("chunk_size", 8)
    plain = transformer_lm_config(**base).set(name="model")
    chunked = plain.clone(logits_chunk_size=chunk_size)
    return plain.instantiate(parent=None), chunked.instantiate(parent=None)


def _loss_and_grads(model, params, batch):
    def loss_fn(params):
        (loss, _), collection = functional(
            model, jax.random.PRNGKey(7), params, dict(input_batch=batch), is_training=True
        )
        return loss, collection.summaries

    return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)


def _random_batch(batch=3, seq=24):
    ids = jax.random.randint(jax.random.PRNGKey(1), (batch, seq), 2, _VOCAB)
    labels = jnp.roll(ids, -1, axis=1).at[:, -1].set(-1)
    ids = ids.at[1, 15:].set(0)  # Right padding (pad id 0) in row 1.
    labels = labels.at[1, 14:].set(0)
    return dict(input_ids=ids, target_labels=labels, target_num_bytes=jnp.array([70, 40, 66]))


def _real_batch(batch=4, seq=32):
    """Shipped text (the embedded corpus) tokenized with the shipped vocabulary, right-padded."""
    import sentencepiece  # pylint: disable=import-outside-toplevel

    sp = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(_DATA, "tokenizers", "sentencepiece", "bpe_4k_python_docs.model")
    )
    rows = []
    with gzip.open(os.path.join(_DATA, "python_docs", "corpus.jsonl.gz"), "rt") as f:
        for line in f:
            ids = sp.encode(json.loads(line)["text"])
            rows.append(ids[: seq + 1 - 7 * len(rows)])  # Shorter rows: more padding.
            if len(rows) == batch:
                break
    ids = np.zeros((batch, seq + 1), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    assert (ids == 0).any() and (ids[:, -1] == 0).any()
    return dict(input_ids=jnp.asarray(ids[:, :-1]), target_labels=jnp.asarray(ids[:, 1:]))


_METRICS = ("loss", "cross_entropy_loss", "z_loss", "perplexity", "accuracy", "num_targets")


# 8 divides the random batch's 24 positions; 5 does not divide the real batch's 32 (padded).
@pytest.mark.parametrize("which,chunk_size", [("random", 8), ("real", 5)])
def test_model_chunked_equals_plain_fp32(which, chunk_size):
    plain, chunked = _model_pair(chunk_size=chunk_size)
    params = jax.jit(plain.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    batch = _random_batch() if which == "random" else _real_batch()
    (loss_p, sum_p), grads_p = _loss_and_grads(plain, params, batch)
    (loss_c, sum_c), grads_c = _loss_and_grads(chunked, params, batch)
    assert _rel_err(loss_c, loss_p) < 1e-6
    for key in _METRICS + (("bits_per_byte",) if which == "random" else ()):
        # exp() multiplies the loss's relative error by the loss (~9 here): perplexity gets more.
        tol = 5e-6 if key == "perplexity" else 1e-6
        assert _rel_err(sum_c[key].mean, sum_p[key].mean) < tol, key
        assert float(sum_c[key].weight) == float(sum_p[key].weight), key
    assert 0 < float(sum_p["accuracy"].mean) or which == "random"
    for (path, g_c), (_, g_p) in zip(flatten_items(grads_c), flatten_items(grads_p)):
        # Relative to the gradient's scale (elementwise relative error is meaningless near 0).
        assert _rel_err(g_c, g_p) < 1e-5, path


@pytest.mark.slow
def test_model_chunked_equals_plain_bf16():
    """bf16 compute (as train_dtype=bfloat16): loss, metrics and gradients within bf16 tolerance.

    Both paths compute the same bf16 logits (a dot over dim per logit) and the loss in float32, so
    the loss agrees to float32 rounding; the gradients differ by the order in which bf16 products
    are summed (the head's weight gradient is accumulated chunk by chunk in float32 here, in one
    bf16 matmul in the plain path): a few bf16 ulps (2**-8 = 0.4%) relative to the gradient's
    scale, hence 2e-2.
    """
    plain, chunked = _model_pair(chunk_size=8)
    params = jax.jit(plain.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    batch = _real_batch()
    (loss_p, sum_p), grads_p = _loss_and_grads(plain, params, batch)
    (loss_c, sum_c), grads_c = _loss_and_grads(chunked, params, batch)
    assert _rel_err(loss_c, loss_p) < 1e-5
    for key in _METRICS:
        assert _rel_err(sum_c[key].mean, sum_p[key].mean) < 1e-5, key
    for (path, g_c), (_, g_p) in zip(flatten_items(grads_c), flatten_items(grads_p)):
        assert g_c.dtype == g_p.dtype == jnp.bfloat16, path
        assert _rel_err(g_c, g_p) < 2e-2, path


@pytest.mark.slow
def test_model_untied_head_and_eval_path():
    plain, chunked = _model_pair(chunk_size=8, tied_embedding=False)
    params = jax.jit(plain.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    assert "lm_head" in params["decoder"]
    batch = _random_batch()
    (loss_p, _), grads_p = _loss_and_grads(plain, params, batch)
    (loss_c, _), grads_c = _loss_and_grads(chunked, params, batch)
    assert _rel_err(loss_c, loss_p) < 1e-6
    head_p = grads_p["decoder"]["lm_head"]["weight"]
    assert _rel_err(grads_c["decoder"]["lm_head"]["weight"], head_p) < 1e-5
    # return_aux asks for the logits: the full path runs and gives the same loss.
    (loss_aux, aux), _ = functional(
        chunked,
        jax.random.PRNGKey(7),
        params,
        dict(input_batch=batch, return_aux=True),
        is_training=False,
    )
    assert aux["logits"].shape == (3, 24, _VOCAB)
    assert _rel_err(loss_aux, loss_p) < 1e-6


@pytest.mark.slow
def test_compiled_temp_memory_is_smaller():
    """A vocabulary-dominated model: the compiled grad step needs less temporary memory."""
    plain, chunked = _model_pair(chunk_size=8, model_dim=64, num_layers=1)
    params = jax.jit(plain.initialize_parameters_recursively)(jax.random.PRNGKey(0))
    batch = _random_batch(batch=8, seq=64)

    def temp_bytes(model):
        def loss_fn(params):
            (loss, _), _ = functional(
                model, jax.random.PRNGKey(7), params, dict(input_batch=batch), is_training=True
            )
            return loss

        compiled = jax.jit(jax.grad(loss_fn)).lower(params).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    full_logits_bytes = 8 * 64 * _VOCAB * 4
    plain_bytes, chunked_bytes = temp_bytes(plain), temp_bytes(chunked)
    assert plain_bytes >= full_logits_bytes
    assert chunked_bytes < 0.5 * plain_bytes, (chunked_bytes, plain_bytes)


def test_chunked_loss_with_loss_metrics_is_rejected():
    from axlearn.common.causal_lm import metrics_config

    cfg = transformer_lm_config(
        num_layers=1, model_dim=16, num_heads=2, hidden_dim=32, vocab_size=64
    ).set(name="model", logits_chunk_size=8, metrics=metrics_config())
    with pytest.raises(ValueError) as e:
        cfg.instantiate(parent=None)
    assert str(e.value) == (
        "model.logits_chunk_size=8 needs the built-in loss, but model.metrics is set (its "
        "metrics read the full logits): unset one of them."
    )
