"""Tests axlearn.common.eval_classification against a brute-force NumPy precision-recall sweep."""

import jax
import jax.numpy as jnp
import numpy as np

from axlearn.common.eval_classification import PrecisionRecallMetricCalculator
from axlearn.common.test_utils import DummyForwardModel


def _np_at_level(labels, scores, *, level, by):
    """Brute force over thresholds (the live scores): (value, threshold) at `level`.

    by="precision": recall where precision is the smallest one >= level; by="recall": the
    converse. Ties go to the lowest threshold; (-1, None) when no threshold reaches the level.
    """
    best = None
    for t in np.sort(np.unique(scores)):
        pred = scores >= t
        tp = np.sum(pred & (labels == 1))
        precision = tp / pred.sum()
        recall = tp / max(np.sum(labels == 1), 1)
        achieved, reported = (precision, recall) if by == "precision" else (recall, precision)
        if achieved >= level and (best is None or achieved < best[0]):
            best = (achieved, reported, t)
    return (-1.0, None) if best is None else (best[1], best[2])


def _run(calc_cfg, batches):
    model = DummyForwardModel.default_config().set(name="model").instantiate(parent=None)
    calc = calc_cfg.set(name="calc").instantiate(
        parent=None, model=model, model_param_partition_specs={}
    )
    state = calc.init_state(prng_key=jax.random.PRNGKey(0), model_params={})
    outputs = []
    for batch in batches:
        out = calc.forward(batch, model_params={}, state=state)
        state = out["state"]
        outputs.append(out["output"])
    return calc.get_summaries(model_params={}, state=state, all_forward_outputs=outputs)


def test_precision_recall_metrics_match_numpy():
    rng = np.random.default_rng(0)
    n = 40
    labels = rng.integers(0, 2, (n, 2))
    scores = (labels + rng.normal(scale=0.8, size=(n, 2))).astype(np.float32)
    labels[-3:, 0] = -1  # Padding examples (a negative target in any label).
    batches = [
        dict(
            target_labels=jnp.asarray(labels[i : i + 20]),
            aux=dict(logits=jnp.asarray(scores[i : i + 20])),
        )
        for i in (0, 20)
    ]
    cfg = PrecisionRecallMetricCalculator.default_config().set(
        label_names=["a", "b"], precision_levels=[0.8, 0.99], recall_levels=[0.5, 0.9]
    )
    got = _run(cfg, batches)
    live = np.all(labels >= 0, axis=1)
    assert len(got) == 2 * 2 * 2 * 2
    for i, name in enumerate("ab"):
        y, s = labels[live, i], scores[live, i]
        for by, levels in (("precision", (0.8, 0.99)), ("recall", (0.5, 0.9))):
            other = "recall" if by == "precision" else "precision"
            for level in levels:
                key = f"{name}_{other}@{by[0]}{level * 100}"
                value, threshold = _np_at_level(y, s, level=level, by=by)
                np.testing.assert_allclose(got[key], value, atol=1e-6, err_msg=key)
                if threshold is not None:
                    np.testing.assert_allclose(got[key + "_threshold"], threshold, err_msg=key)


def test_onehot_labels_and_unreachable_level():
    # Class ids one-hot over 3 labels; label "z" never occurs, so no level is reachable.
    ids = np.array([0, 1, 0, 1, 1, 0])
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.6, 0.3, 0.2]] * 2, np.float32)
    cfg = PrecisionRecallMetricCalculator.default_config().set(
        label_names=["x", "y", "z"],
        precision_levels=[1.0],
        recall_levels=[1.0],
        expand_label_to_onehot=True,
    )
    got = _run(cfg, [dict(target_labels=jnp.asarray(ids), aux=dict(logits=jnp.asarray(scores)))])
    assert float(got["z_recall@p100.0"]) == -1.0 and float(got["z_precision@r100.0"]) == -1.0
    for i, name in enumerate("xy"):
        y = (ids == i).astype(int)
        value, threshold = _np_at_level(y, scores[:, i], level=1.0, by="recall")
        np.testing.assert_allclose(got[f"{name}_precision@r100.0"], value, atol=1e-6)
        np.testing.assert_allclose(got[f"{name}_precision@r100.0_threshold"], threshold)
