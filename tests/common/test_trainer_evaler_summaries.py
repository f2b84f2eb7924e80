"""Tests of `SpmdTrainer.run(return_evaler_summaries=...)` (AXLearn's argument).

The forced evaler's loss is checked against a NumPy computation of the bigram LM's loss on the
eval batches with the trained parameters.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from axlearn.common.metrics import WeightedScalar
from axlearn.common.trainer_utils import evalers_to_force
from tests.common import trainer_test_utils as tu


class _WeightedBigramLm(tu.BigramLm):
    """BigramLm that also reports its loss as a WeightedScalar (which evalers accumulate)."""

    def forward(self, input_batch):
        loss, aux = super().forward(input_batch)
        live = (input_batch["target_labels"] > 0).sum()
        self.add_summary("eval_loss", WeightedScalar(loss, live))
        return loss, aux


def _trainer(tmp_path):
    cfg = tu.bigram_trainer_config(str(tmp_path), max_step=3, eval_every=10)
    cfg.model = _WeightedBigramLm.default_config().set(dtype=cfg.model.dtype)
    cfg.evalers["val2"] = cfg.evalers["val"].clone()
    return cfg.instantiate(parent=None)


def _numpy_eval_loss(trainer, evaler_name: str) -> float:
    """Token-weighted mean next-token NLL of the eval batches under the trainer's parameters."""
    params = jax.tree.map(np.asarray, trainer.trainer_state.model)
    emb, w = params["emb"]["weight"], params["proj"]["weight"]
    bias = params["proj"].get("bias")
    total, count = 0.0, 0
    for batch in iter(trainer._evalers[evaler_name].input):  # pylint: disable=protected-access
        ids, labels = np.asarray(batch["input_ids"]), np.asarray(batch["target_labels"])
        x = emb[ids].astype(np.float64) @ w
        x = np.tanh(x if bias is None else x + bias)
        logits = x @ emb.T
        shifted = logits - logits.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        nll = -np.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0]
        live = labels > 0
        total += (nll * live).sum()
        count += live.sum()
    return total / count


@pytest.mark.parametrize("value", [None, False, True, {"val"}, {"val", "val2"}])
def test_run_returns_the_forced_evalers_summaries(tmp_path, value):
    trainer = _trainer(tmp_path)
    output = trainer.run(jax.random.PRNGKey(0), return_evaler_summaries=value)
    assert output["step"] == 3
    if not value:
        assert "evaler_summaries" not in output
        return
    summaries = output["evaler_summaries"]
    forced = {"val", "val2"} if value is True else value
    # The eval policy (every 10 steps) does not fire at step 3: only forced evalers ran.
    assert {name for name, s in summaries.items() if s is not None} == forced
    assert set(summaries) == {"val", "val2"}
    for name in forced:
        got = float(summaries[name]["eval_loss"].mean)
        np.testing.assert_allclose(got, _numpy_eval_loss(trainer, name), rtol=1e-5)


def test_unknown_evaler_names_are_refused_before_training(tmp_path):
    trainer = _trainer(tmp_path)
    with pytest.raises(ValueError, match=r"names \['wrong'\].*'val', 'val2'"):
        trainer.run(jax.random.PRNGKey(0), return_evaler_summaries={"wrong"})
    assert trainer.step is None or trainer.step == 0  # Nothing trained.
    with pytest.raises(ValueError, match="must be None, a bool or a set"):
        evalers_to_force("val", ["val"], "trainer")
    assert evalers_to_force(True, ["a", "b"], "trainer") == {"a", "b"}
    assert evalers_to_force(None, ["a"], "trainer") == set()
