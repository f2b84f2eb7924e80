"""Tests axlearn/common/finetune.py: parameter maps; a DPO run started from an SFT checkpoint."""

import functools

import jax
import numpy as np
import pytest

from axlearn.common import finetune
from axlearn.common.utils import flatten_items
from axlearn.experiments.text.gpt.post_training import (
    dpo_trainer_config,
    lora_config_fn,
    sft_trainer_config,
)


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


def test_init_dpo_with_lora_from_sft_checkpoint(tmp_path):
    """A LoRA DPO run from an SFT run without LoRA: the wrapped weights come from the SFT
    checkpoint, the adapters from the new run's own init (up-projections zero), and the
    reference equals the policy."""
    small = dict(num_layers=1, model_dim=16)
    sft_cfg = sft_trainer_config(max_step=2, **small).set(dir=str(tmp_path / "sft"))
    sft_cfg.evalers = {}
    source = sft_cfg.instantiate(parent=None)
    source.init(jax.random.PRNGKey(7))
    source.checkpointer.save(step=0, state=source.trainer_state._asdict(), force=True)
    source.checkpointer.wait_until_finished()
    expected = dict(flatten_items(jax.device_get(source.trainer_state.model)))

    dpo_fn = lora_config_fn(functools.partial(dpo_trainer_config, max_step=2, **small))
    dpo_cfg = dpo_fn().set(dir=str(tmp_path / "dpo"))
    dpo_cfg.evalers = {}
    finetune.init_from_trainer_dir(
        str(tmp_path / "sft"),
        dpo_cfg,
        source_model=sft_cfg.model,
        prefixes=finetune.DPO_FROM_CAUSAL_LM,
    )
    target = dpo_cfg.instantiate(parent=None)
    assert target.restore_checkpoint() == 0
    params = dict(flatten_items(jax.device_get(target.trainer_state.model)))
    parents = finetune.lora_adapter_parents(params)
    assert len(parents) == 4  # policy and reference: i_proj and o_proj of the one layer.
    for path, value in params.items():
        name = path.split("/", 1)[1]
        if "/adapter/" in path:
            if "/lora_up/" in path:
                assert not value.any(), path
            np.testing.assert_array_equal(value, params["policy/" + name], err_msg=path)
        else:
            src = finetune.unwrapped_lora_path(name, {p.split("/", 1)[1] for p in parents})
            np.testing.assert_array_equal(value, expected[src], err_msg=path)
    assert any("/layer/qkv_proj/" in p for p in params)
