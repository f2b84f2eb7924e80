"""Tests of axlearn.common.causal_lm (and the model builders it is configured with)."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from axlearn.common.golden_config import drop_newer_axlearn_lines
from axlearn.common.module import functional
from axlearn.common.utils import flatten_items
from axlearn.experiments.text.gpt.model_builders import (
    honeycrisp_model_config,
    transformer_lm_config,
)

VOCAB, BATCH, LENGTH = 64, 2, 10
_TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata")


_MODELS = {}


def _model(**kwargs):
    """A small model (cached per kwargs so that tests share instances and compiled functions)."""
    key = repr(sorted(kwargs.items()))
    if key not in _MODELS:
        defaults = dict(
            num_layers=2,
            model_dim=32,
            num_heads=4,
            num_kv_heads=2,
            hidden_dim=48,
            vocab_size=VOCAB,
            rope_theta=500.0,
            qk_norm=True,
            z_loss_scale=1e-3,
        )
        defaults.update(kwargs)
        cfg = transformer_lm_config(**defaults)
        _MODELS[key] = cfg.set(name="model").instantiate(parent=None)
    return _MODELS[key]


def _params(model, seed=0):
    return jax.jit(model.initialize_parameters_recursively)(jax.random.PRNGKey(seed))


_LOSS_FNS = {}


def _loss_fn(model, *, is_training=False):
    key = (id(model), is_training)
    if key not in _LOSS_FNS:

        @jax.jit
        def run(params, batch):
            (loss, aux), collection = functional(
                model,
                jax.random.PRNGKey(5),
                params,
                dict(input_batch=batch, return_aux=True),
                is_training=is_training,
            )
            return loss, aux, collection.summaries

        _LOSS_FNS[key] = run
    return _LOSS_FNS[key]


def _batch(seed=1):
    ids = jax.random.randint(jax.random.PRNGKey(seed), (BATCH, LENGTH), 2, VOCAB)
    labels = jnp.roll(ids, -1, axis=1)
    labels = labels.at[:, -1].set(-1).at[1, 6:].set(0)  # No target: -1 and the pad id.
    return dict(input_ids=ids, target_labels=labels, target_num_bytes=jnp.array([30, 11]))


def test_honeycrisp_dump_matches_reference():
    """The model config rebuilt from the real classes prints the reference dump's lines."""
    ours = ["model." + line for line in honeycrisp_model_config().debug_string().split("\n")]
    # The reference predates the default KVCache of every attention layer (a newer AXLearn line).
    ours = drop_newer_axlearn_lines(ours)
    with open(os.path.join(_TESTDATA, "honeycrisp_model_config.txt"), encoding="utf-8") as f:
        reference = f.read().splitlines()
    assert ours == reference


def test_honeycrisp_parameter_count_from_abstract_shapes():
    model = honeycrisp_model_config().set(name="model").instantiate(parent=None)
    shapes = jax.eval_shape(model.initialize_parameters_recursively, jax.random.PRNGKey(0))
    flat = dict(flatten_items(shapes))
    assert sum(math.prod(x.shape) for x in flat.values()) == 2_737_739_264
    prefix = "decoder/transformer/repeat/layer/"
    expected = {
        "decoder/emb/token_emb/weight": (49152, 3072),
        "decoder/output_norm/scale": (3072,),
        prefix + "self_attention/norm/scale": (26, 3072),
        prefix + "self_attention/attention/i_proj/i_proj/qkv_proj/weight": (26, 3072, 40, 128),
        prefix + "self_attention/attention/o_proj/weight": (26, 3072, 24, 128),
        prefix + "self_attention/attention/scale_query/norm/scale": (26, 128),
        prefix + "self_attention/attention/scale_key/norm/scale": (26, 128),
        prefix + "feed_forward/norm/scale": (26, 3072),
        prefix + "feed_forward/linear1_0/weight": (26, 3072, 8064),
        prefix + "feed_forward/linear1_1/weight": (26, 3072, 8064),
        prefix + "feed_forward/linear2/weight": (26, 8064, 3072),
    }
    assert {k: v.shape for k, v in flat.items()} == expected


def test_stacked_paths():
    params = jax.eval_shape(
        _model(stack="stack", tied_embedding=False).initialize_parameters_recursively,
        jax.random.PRNGKey(0),
    )
    paths = {k for k, _ in flatten_items(params)}
    for i in (0, 1):
        assert f"decoder/transformer/layer{i}/self_attention/attention/o_proj/weight" in paths
        assert f"decoder/transformer/layer{i}/feed_forward/linear1_1/weight" in paths
    assert "decoder/lm_head/weight" in paths


def _np_log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_loss_and_metrics_match_numpy():
    model = _model()
    params = _params(model)
    batch = _batch()
    loss, aux, summaries = _loss_fn(model)(params, batch)
    logits = np.asarray(aux["logits"], np.float64)
    labels = np.asarray(batch["target_labels"])
    live = (labels > 0) & (labels != 0)
    log_probs = _np_log_softmax(logits)
    ce = -np.take_along_axis(log_probs, np.maximum(labels, 0)[..., None], -1)[..., 0]
    log_z = np.log(np.exp(logits).sum(-1))
    num = live.sum()
    expected_ce = (ce * live).sum() / num
    expected_z = (1e-3 * log_z**2 * live).sum() / num
    np.testing.assert_allclose(loss, expected_ce + expected_z, rtol=1e-5)
    np.testing.assert_allclose(summaries["cross_entropy_loss"].mean, expected_ce, rtol=1e-5)
    np.testing.assert_allclose(summaries["perplexity"].mean, np.exp(expected_ce), rtol=1e-5)
    accuracy = ((logits.argmax(-1) == labels) & live).sum() / num
    np.testing.assert_allclose(summaries["accuracy"].mean, accuracy, rtol=1e-6)
    assert float(summaries["num_targets"].mean) == num == 9 + 6
    assert float(summaries["loss"].weight) == num
    per_token = (ce + 1e-3 * log_z**2) * live
    np.testing.assert_allclose(aux["per_label_loss"], per_token, rtol=1e-5, atol=1e-6)
    bpb = per_token.sum() / 41 / np.log(2)
    np.testing.assert_allclose(summaries["bits_per_byte"].mean, bpb, rtol=1e-5)


def test_packed_segments_equal_separate_sequences():
    model = _model()
    params = _params(model)
    a = jax.random.randint(jax.random.PRNGKey(1), (6,), 2, VOCAB)
    b = jax.random.randint(jax.random.PRNGKey(2), (4,), 2, VOCAB)
    pad = jnp.zeros((LENGTH - 6,), a.dtype)
    # Row 0: a and b packed; rows 1 and 2: a and b alone (right-padded; causal masking makes the
    # padding irrelevant to earlier positions).
    ids = jnp.stack(
        [jnp.concatenate([a, b]), jnp.concatenate([a, pad]), jnp.concatenate([b, pad, b[:2]])]
    )
    batch = dict(
        input_ids=ids,
        target_labels=ids,
        input_segment_ids=jnp.array([[1] * 6 + [2] * 4, [1] * 10, [1] * 10]),
        input_positions=jnp.array(
            [list(range(6)) + list(range(4)), list(range(10)), list(range(10))]
        ),
    )
    logits = _loss_fn(model)(params, batch)[1]["logits"]
    np.testing.assert_allclose(logits[0, :6], logits[1, :6], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(logits[0, 6:], logits[2, :4], atol=1e-5, rtol=1e-5)


def _stacked_to_repeated(params, num_layers):
    transformer = params["decoder"]["transformer"]
    layers = [transformer[f"layer{i}"] for i in range(num_layers)]
    repeated = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    decoder = dict(params["decoder"], transformer=dict(repeat=dict(layer=repeated)))
    return dict(params, decoder=decoder)


def test_repeated_equals_stacked():
    stacked = _model(stack="stack")
    repeated = _model(stack="repeat")
    params = _params(stacked)
    rep_params = _stacked_to_repeated(params, 2)
    batch = _batch()
    loss_s, aux_s, _ = _loss_fn(stacked)(params, batch)
    loss_r, aux_r, _ = _loss_fn(repeated)(rep_params, batch)
    np.testing.assert_allclose(aux_s["logits"], aux_r["logits"], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(loss_s, loss_r, rtol=1e-6)


@pytest.mark.parametrize("stack", ["repeat"])
def test_remat_same_loss_and_grads(stack):
    plain = _model(stack=stack, dropout_rate=0.1)
    remat = _model(stack=stack, dropout_rate=0.1, remat=True)
    params = _params(plain)
    batch = _batch()

    def grad_fn(model):
        def loss(params):
            (loss, _), _ = functional(
                model, jax.random.PRNGKey(7), params, dict(input_batch=batch), is_training=True
            )
            return loss

        return jax.jit(jax.value_and_grad(loss))

    loss_a, grads_a = grad_fn(plain)(params)
    loss_b, grads_b = grad_fn(remat)(params)
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
    for (path, a), (_, b) in zip(flatten_items(grads_a), flatten_items(grads_b)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5, err_msg=path)
    # The remat model really ran its layers under jax.checkpoint.
    stack_layer = remat.decoder.transformer
    layer = stack_layer.repeat.layer if stack == "repeat" else stack_layer.layer0
    assert "forward" in layer._remat_methods


def test_missing_input_ids_is_a_clear_error():
    model = _model()
    with pytest.raises(KeyError, match="input_ids"):
        functional(model, None, _params(model), dict(input_batch={}), is_training=False)


def test_score_and_decode_entry_points():
    """Model.score equals forward's per-token loss; Model.*_decode equal the decoder's."""
    model = _model()
    params = _params(model)
    batch = _batch()
    _, aux, _ = _loss_fn(model)(params, batch)

    def call(method, inputs, key=None):
        out, _ = functional(model, key, params, inputs, method=method, is_training=False)
        return out

    scores = jax.jit(lambda b: call("score", dict(input_batch=b)))(batch)
    np.testing.assert_allclose(scores["per_token_loss"], aux["per_label_loss"], atol=1e-6)
    np.testing.assert_array_equal(scores["live_targets"], (batch["target_labels"] > 0))
    logits = jax.jit(lambda b: call("extract_logits", dict(input_batch=b)))(batch)
    np.testing.assert_allclose(logits, aux["logits"], atol=1e-6)

    prefix = jnp.array([[5, 6, 7, 0, 0, 0], [8, 9, 0, 0, 0, 0]])
    key = jax.random.PRNGKey(2)
    sampled = jax.jit(
        lambda p, k: call("sample_decode", dict(input_batch=dict(prefix=p), num_decodes=2), k)
    )(prefix, key)
    direct, _ = functional(
        model.decoder,
        key,
        params["decoder"],
        dict(input_batch=dict(prefix=prefix), max_sequence_length=6, num_decodes=2),
        method="sample_decode",
        is_training=False,
    )
    assert sampled.sequences.shape == (BATCH, 2, 6)
    np.testing.assert_array_equal(sampled.sequences[:, :, 0], [[6, 6], [9, 9]])
    beams = jax.jit(
        lambda p: call("beam_search_decode", dict(input_batch=dict(prefix=p), num_decodes=2))
    )(prefix)
    assert beams.sequences.shape == beams.live_sequences.shape == (BATCH, 2, 6)
    assert direct.sequences.shape == sampled.sequences.shape
    with pytest.raises(KeyError, match="prefix"):
        call("beam_search_decode", dict(input_batch=dict(input_ids=prefix)))


def test_first_max_index_matches_numpy_argmax_with_ties():
    """first_max_index equals np.argmax (first index of the max), ties and -inf included."""
    from axlearn.common.causal_lm import first_max_index

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 300)).astype(np.float32)
    # Ties: integer-valued logits make many equal maxima; the first must win.
    logits[1] = rng.integers(0, 3, size=(5, 300)).astype(np.float32)
    logits[2, 0] = -np.inf
    logits[2, 1, 7] = np.inf
    logits[2, 2] = 0.0
    got = np.asarray(first_max_index(jnp.asarray(logits)))
    np.testing.assert_array_equal(got, np.argmax(logits, axis=-1))
    assert got.dtype == np.int32


# ---- Loss metrics (model.metrics). ----


def test_metrics_config_gives_the_same_loss_and_summaries():
    """model.metrics = metrics_config() computes what the built-in path computes (whose numbers
    test_loss_and_metrics_match_numpy checks against NumPy), z_loss_scale taken from the model."""
    from axlearn.common import causal_lm

    base = _model()
    cfg = base.config.clone(metrics=causal_lm.metrics_config())
    with_metrics = cfg.instantiate(parent=None)
    params = _params(base)
    batch = _batch()
    loss, aux, summaries = _loss_fn(base)(params, batch)
    loss_m, aux_m, summaries_m = _loss_fn(with_metrics)(params, batch)
    np.testing.assert_allclose(loss_m, loss, rtol=1e-6)
    np.testing.assert_allclose(aux_m["per_label_loss"], aux["per_label_loss"], rtol=1e-6)
    # The metrics child adds no summaries of its own (the model adds what it returns).
    assert jax.tree.leaves(summaries_m.pop("metrics", {})) == []
    assert set(summaries_m) == set(summaries)
    for name, value in summaries.items():
        if isinstance(value, dict):  # Child modules' summaries (e.g. the decoder's).
            for a, b in zip(jax.tree.leaves(summaries_m[name]), jax.tree.leaves(value)):
                np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=name)
            continue
        np.testing.assert_allclose(summaries_m[name].mean, value.mean, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(summaries_m[name].weight, value.weight, rtol=1e-6, err_msg=name)


def _run_metrics(metrics_cfg, input_batch, predict_outputs, module_outputs):
    metrics = metrics_cfg.set(name="metrics").instantiate(parent=None)
    (loss, outputs), _ = functional(
        metrics,
        jax.random.PRNGKey(0),
        {},
        dict(
            input_batch=input_batch,
            predict_outputs=predict_outputs,
            module_outputs=module_outputs,
        ),
        is_training=False,
    )
    return loss, outputs


def test_composite_loss_metrics_weights_children():
    from axlearn.common.causal_lm import (
        AuxLossMetrics,
        CompositeLossMetrics,
        CrossEntropyLossMetrics,
    )

    logits = np.log(np.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]], np.float32))
    batch = dict(input_ids=np.array([[2, 2]], np.int32), target_labels=np.array([[1, 1]], np.int32))
    module_outputs = {
        "decoder/layer0/aux_loss": np.float32(0.5),
        "decoder/layer1/aux_loss": np.float32(0.25),
        "decoder/layer1/other": np.float32(100.0),
    }
    cfg = CompositeLossMetrics.default_config().set(
        metrics={
            "lm": CrossEntropyLossMetrics.default_config().set(pad_token_id=0, z_loss_scale=0.0),
            "aux": AuxLossMetrics.default_config().set(aux_loss_regex=".*/aux_loss"),
        },
        loss_weights={"aux": 2.0},
    )
    loss, outputs = _run_metrics(cfg, batch, dict(logits=logits), module_outputs)
    ce = (-np.log(0.25) - np.log(0.8)) / 2  # Both labels are 1.
    aux = 0.5 + 0.25
    np.testing.assert_allclose(loss, ce + 2.0 * aux, rtol=1e-6)
    summaries = outputs["summaries"]
    np.testing.assert_allclose(summaries["loss"].mean, ce + 2.0 * aux, rtol=1e-6)
    np.testing.assert_allclose(summaries["cross_entropy_loss"].mean, ce, rtol=1e-6)
    np.testing.assert_allclose(summaries["aux_loss"].mean, aux, rtol=1e-6)
    assert float(summaries["loss"].weight) == 2  # The lm child's weight: its target count.
    # An unknown loss weight names the config path.
    bad = cfg.clone(loss_weights={"lmm": 1.0})
    with pytest.raises(ValueError, match=r"metrics.loss_weights names \['lmm'\]"):
        bad.set(name="metrics").instantiate(parent=None)


def test_metrics_config_aux_loss_regex():
    from axlearn.common import causal_lm

    cfg = causal_lm.metrics_config(aux_loss_regex=".*/aux_loss")
    assert cfg.metrics["aux"].aux_loss_regex == ".*/aux_loss"
    assert causal_lm.metrics_config().metrics["aux"].aux_loss_regex is None
