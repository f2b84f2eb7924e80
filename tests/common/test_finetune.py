"""Tests axlearn/common/finetune.py: parameter maps; a DPO run started from an SFT checkpoint."""

import jax
import numpy as np
import pytest

from axlearn.common import finetune
from axlearn.experiments.text.gpt.post_training import dpo_trainer_config, sft_trainer_config


def _spec(shape, dtype=np.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_map_parameters():
    source = {"decoder": {"emb": np.ones((2, 3), np.float32), "w": np.zeros(4, np.float32)}}
    target = {
        "policy": {"decoder": {"emb": _spec((2, 3)), "w": _spec((4,))}},
        "reference": {"decoder": {"emb": _spec((2, 3)), "w": _spec((4,))}},
    }
    out = finetune.map_parameters(source, target, finetune.DPO_FROM_CAUSAL_LM)
    assert out["policy"]["decoder"]["emb"] is source["decoder"]["emb"]
    assert out["reference"]["decoder"]["w"] is source["decoder"]["w"]
    with pytest.raises(ValueError, match=r"target 'policy/decoder/w' is \(5,\) float32 but source"):
        finetune.map_parameters(
            source, {"policy": {"decoder": {"w": _spec((5,))}}}, finetune.DPO_FROM_CAUSAL_LM
        )
    with pytest.raises(ValueError, match=r"maps to source 'decoder/x', which the source does not"):
        finetune.map_parameters(source, {"decoder": {"x": _spec((4,))}}, {"": ""})
    with pytest.raises(ValueError, match="no prefix of"):
        finetune.map_parameters(source, {"other": _spec((4,))}, {"policy/": ""})


def test_init_dpo_from_sft_checkpoint(tmp_path):
    small = dict(num_layers=1, model_dim=16)
    sft_cfg = sft_trainer_config(max_step=2, **small).set(dir=str(tmp_path / "sft"))
    sft_cfg.evalers = {}
    source = sft_cfg.instantiate(parent=None)
    source.init(jax.random.PRNGKey(7))
    source.checkpointer.save(step=0, state=source.trainer_state._asdict(), force=True)
    source.checkpointer.wait_until_finished()
    expected = jax.device_get(source.trainer_state.model)

    dpo_cfg = dpo_trainer_config(max_step=2, **small).set(dir=str(tmp_path / "dpo"))
    dpo_cfg.evalers = {}
    step_dir = finetune.init_from_trainer_dir(
        str(tmp_path / "sft"),
        dpo_cfg,
        source_model=sft_cfg.model,
        prefixes=finetune.DPO_FROM_CAUSAL_LM,
    )
    assert step_dir.endswith("step_00000000")
    target = dpo_cfg.instantiate(parent=None)
    assert target.restore_checkpoint() == 0
    state = jax.device_get(target.trainer_state)
    for name in ("policy", "reference"):
        for a, b in zip(jax.tree.leaves(state.model[name]), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(a, b)
    # The frozen reference has no optimizer state.
    paths = [str(p) for p, _ in jax.tree_util.tree_flatten_with_path(state.learner)[0]]
    assert not any("reference" in p for p in paths) and any("policy" in p for p in paths)
    with pytest.raises(ValueError, match="already holds a committed checkpoint"):
        finetune.init_from_trainer_dir(
            str(tmp_path / "sft"),
            dpo_cfg,
            source_model=sft_cfg.model,
            prefixes=finetune.DPO_FROM_CAUSAL_LM,
        )
