"""The post-training runs composed with LoRA and with their mesh rules.

`LoraConfigModifier` on each of `sft-tiny-strings`, `dpo-tiny-strings` and `grpo-copy-digits`:
a few steps on the 8 host CPU devices under the configs' `cpu-fsdp` mesh rule
(`--mesh_selector=cpu-fsdp`) train only the policy's adapters: every base weight and the whole
frozen reference (its adapters included) stay bit-identical, the adapters move, the reference has
no optimizer state and the trainable/frozen counts are in model_parameters.txt.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from axlearn.common import trainer_metrics, utils
from axlearn.common.learner import UpdateType
from axlearn.common.lora_config_modifier import ADAPTER_PARAM_REGEX, LoraConfigModifier
from axlearn.common.mesh_resolution import resolve_mesh
from axlearn.experiments.text.gpt import post_training

STEPS = 2
# name -> (the config fn's small-run arguments, whether the model has a frozen reference).
_RUNS = {
    "sft-tiny-strings": (dict(max_step=STEPS, global_batch_size=8, max_len=64), False),
    "dpo-tiny-strings": (dict(max_step=STEPS, global_batch_size=8, max_len=40), True),
    "grpo-copy-digits": (dict(max_step=STEPS, num_prompts=8, group_size=2), True),
}


def lora_config(name: str, trainer_dir: str, *, mesh_selector: str = "cpu-fsdp"):
    """A small run of the named config with rank-4 LoRA, the mesh rule applied, no evalers.

    Args:
        name: The post-training config name.
        trainer_dir: The trainer directory.
        mesh_selector: The `--mesh_selector`.

    Returns:
        The trainer config.
    """
    kwargs, _ = _RUNS[name]
    fn = getattr(post_training, name.split("-")[0] + "_trainer_config")
    cfg = fn(**kwargs).set(dir=trainer_dir)
    cfg.evalers = {}
    cfg = LoraConfigModifier.default_config().set(rank=4, alpha=8.0).instantiate()(cfg)
    cfg, _ = resolve_mesh(cfg, mesh_selector=mesh_selector, config_name=name)
    return cfg


def _leaves(tree) -> dict[str, np.ndarray]:
    return dict(utils.flatten_items(jax.device_get(tree)))


def test_mesh_rule_selects_fsdp_for_each_config():
    for name in _RUNS:
        cfg = post_training.named_trainer_configs()[name]()
        cfg = LoraConfigModifier.default_config().instantiate()(cfg)
        cfg, res = resolve_mesh(cfg, mesh_selector="cpu-fsdp", config_name=name)
        assert res.rule == "cpu-fsdp" and cfg.mesh_shape == post_training._mesh(fsdp=-1), res


@pytest.mark.parametrize("name", ["dpo-tiny-strings", "grpo-copy-digits"])
def test_reference_stays_frozen_before_the_adapter_rule(name):
    cfg = LoraConfigModifier.default_config().instantiate()(
        post_training.named_trainer_configs()[name]()
    )
    rules = cfg.learner.update_rules
    # First match wins: the reference's adapters fall under the reference rule.
    assert rules[0] == ("reference/.*", UpdateType.NO_UPDATE), rules
    assert rules[1] == (ADAPTER_PARAM_REGEX, UpdateType.ALL_UPDATES) and rules[-1][0] == ".*"


@pytest.mark.slow  # One trainer compile per config: ~1 min each on 2 busy cores.
@pytest.mark.parametrize("name", sorted(_RUNS))
def test_lora_trains_only_the_policy_adapters(name, tmp_path):
    assert jax.device_count() == 8
    _, has_reference = _RUNS[name]
    cfg = lora_config(name, str(tmp_path / "run"))
    fresh = cfg.clone(dir=str(tmp_path / "fresh")).instantiate(parent=None)
    fresh.init(jax.random.PRNGKey(0))
    initial = _leaves(fresh.trainer_state.model)
    trainer = cfg.instantiate(parent=None)
    output = trainer.run(jax.random.PRNGKey(0))
    assert np.isfinite(float(output["loss"])), output
    # The cpu-fsdp rule's mesh: fsdp over the 8 devices.
    assert jax.tree.leaves(trainer.trainer_state.model)[0].sharding.mesh.shape["fsdp"] == 8
    final = _leaves(trainer.trainer_state.model)
    assert final.keys() == initial.keys()
    adapters = {p for p in final if "/adapter/" in p}
    assert adapters and any(p.startswith("reference/") for p in adapters) == has_reference
    policy_adapters = {p for p in adapters if not p.startswith("reference/")}
    for path, value in final.items():
        if path in policy_adapters:
            continue
        # Base weights and the whole reference (adapters included): bit-identical.
        assert value.tobytes() == initial[path].tobytes(), path
    # Every policy adapter's up-projection (zero at init) moved.
    ups = [p for p in policy_adapters if "/lora_up/" in p]
    assert ups and all(not np.array_equal(final[p], initial[p]) for p in ups), ups
    # Optimizer state only for the policy's adapters.
    learner_paths = list(_leaves(trainer.trainer_state.learner))
    assert not any("reference/" in p for p in learner_paths)
    mu = [p for p in learner_paths if "/mu/" in p or p.endswith("/mu")]
    assert mu and all("/adapter/" in p for p in mu), mu
    counts = trainer_metrics.trainable_parameter_counts(
        trainer.trainer_state.model, learner=trainer.learner
    )
    sizes = {p: v.size for p, v in final.items()}
    assert counts["trainable"] == sum(sizes[p] for p in policy_adapters)
    assert counts["frozen"] == sum(sizes.values()) - counts["trainable"]
    with open(os.path.join(tmp_path, "run", "model_parameters.txt"), encoding="utf-8") as f:
        header = f.read().splitlines()[1]
    total = sum(sizes.values())
    assert header.startswith(f"Trainable parameters: {counts['trainable']:,} of {total:,} "), header
