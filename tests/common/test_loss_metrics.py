"""Tests of axlearn.common.loss_metrics.filter_module_outputs against hand-built expectations."""

import numpy as np
import pytest

from axlearn.common.loss_metrics import filter_module_outputs

_OUTPUTS = {
    "decoder": {"tok": {"a": 1, "b": np.arange(3), "c": 3}, "labels": 7},
    "other": {"x": 5},
}


def test_leaf_and_subtree_selection():
    assert filter_module_outputs(_OUTPUTS, path_regex="(?:.*/?)(labels)") == {"labels": 7}
    got = filter_module_outputs(_OUTPUTS, path_regex="(?:.*/?)tok/(.*)")
    assert sorted(got) == ["a", "b", "c"] and got["c"] == 3
    np.testing.assert_array_equal(got["b"], np.arange(3))
    got = filter_module_outputs(_OUTPUTS, path_regex="(?:.*/?)(tok/(?:a|c))")
    assert got == {"tok": {"a": 1, "c": 3}}


def test_default_and_errors():
    assert filter_module_outputs({}, path_regex="(labels)", default=None) is None
    with pytest.raises(ValueError, match="No paths matched"):
        filter_module_outputs({}, path_regex="(labels)")
    for regex in ["(.*/)(labels)", ".*labels"]:
        with pytest.raises(ValueError, match="exactly one matching group"):
            filter_module_outputs(_OUTPUTS, path_regex=regex)
    with pytest.raises(ValueError, match="Multiple paths"):
        filter_module_outputs({"p": {"y": 1}, "q": {"y": 2}}, path_regex="(?:.*/?)(y)")


def test_modality_loss_metrics_masks_targets():
    import jax
    import jax.numpy as jnp

    from axlearn.common.embedding import ModalityVocabInfo
    from axlearn.common.loss_metrics import BaseLossMetrics, ModalityLossMetrics
    from axlearn.common.module import functional

    class MaskedCount(BaseLossMetrics):
        """Loss = weighted count of live targets; echoes the batch it got."""

        def forward(self, input_batch, *, predict_outputs, module_outputs):
            del predict_outputs, module_outputs
            self.add_summary("seen", 1)
            return jnp.sum(input_batch["live_targets"]), input_batch

    # Input labels: -1 is padding, 7 and 8 are image placeholders.
    labels = np.array([[3, 7, -1, 8], [8, 1, 2, -1]])
    # What the embedding layer wrote: placeholders replaced by real ids.
    real = np.array([[3, 20, 0, 21], [22, 1, 2, 0]])
    weights = np.array([[0.5, 1.0, 1.0, 2.0], [1.0, 0.0, 1.0, 1.0]], np.float32)
    base = ModalityLossMetrics.default_config().set(name="m", inner=MaskedCount.default_config())

    def run(cfg, batch):
        inputs = dict(
            input_batch=batch,
            predict_outputs={},
            module_outputs={"emb": {"target_labels": jnp.asarray(real)}},
        )
        layer = cfg.instantiate(parent=None)
        return functional(layer, jax.random.PRNGKey(0), {}, inputs, is_training=True)

    (loss, out), oc = run(base, dict(target_labels=jnp.asarray(labels)))
    np.testing.assert_array_equal(out["live_targets"], labels >= 0)
    np.testing.assert_array_equal(out["target_labels"], real)
    assert float(loss) == 6
    assert oc.summaries == {"inner": {"seen": 1}}

    image = ModalityVocabInfo(
        modality_name="image", placeholder_start=7, placeholder_end=9, vocab_start=20, vocab_end=30
    )
    batch = dict(target_labels=jnp.asarray(labels), live_targets=jnp.asarray(weights))
    (loss, out), _ = run(base.clone(modality_vocab_info=image), batch)
    expected = weights * ((labels >= 7) & (labels < 9))
    np.testing.assert_allclose(out["live_targets"], expected)
    assert out["live_targets"].dtype == jnp.float32
    np.testing.assert_allclose(float(loss), expected.sum())

    with pytest.raises(ValueError, match="m: input_batch must contain 'target_labels'"):
        run(base, dict(live_targets=jnp.asarray(weights)))
    missing = base.clone(target_labels_pattern="(?:.*/?)(labels_x)")
    with pytest.raises(ValueError, match="target_labels_pattern"):
        run(missing, dict(target_labels=jnp.asarray(labels)))
