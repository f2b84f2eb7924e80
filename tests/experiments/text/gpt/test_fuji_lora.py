"""Tests of axlearn.experiments.text.gpt.fuji_lora: LoRA fine-tuning trains only the adapters."""

import json

import jax
import numpy as np
import pytest

from axlearn.common import utils
from axlearn.experiments.text.gpt import c4_trainer, fuji, fuji_lora


def test_names_and_c4_trainer_unchanged():
    assert sorted(fuji_lora.named_trainer_configs()) == ["fuji-test-v3-lora", "fuji-tiny-v3-lora"]
    assert not any("lora" in name for name in c4_trainer.named_trainer_configs())
    assert not any("lora" in name for name in fuji.named_trainer_configs())


@pytest.mark.slow
def test_tiny_lora_trains_20_steps_and_frozen_weights_stay_bit_identical(tmp_path):
    def trainer(name):
        cfg = fuji_lora.named_trainer_configs()["fuji-tiny-v3-lora"]()
        cfg.set(dir=str(tmp_path / name), max_step=20)
        return cfg.instantiate(parent=None)

    key = jax.random.PRNGKey(0)
    start = trainer("init")
    start.init(key)
    initial = {p: np.asarray(v) for p, v in utils.flatten_items(start.trainer_state.model)}
    run = trainer("run")
    run.run(key)
    final = {p: np.asarray(v) for p, v in utils.flatten_items(run.trainer_state.model)}
    assert set(final) == set(initial)
    adapters = [p for p in final if "/adapter/" in p]
    assert len(adapters) == 2 * (2 + 4)  # 2 layers x (o: down, up; qkv: down, 3 ups).
    for path in final:
        if path in adapters:
            continue
        assert final[path].tobytes() == initial[path].tobytes(), path
    # The up projections started at zero and moved.
    moved = [p for p in adapters if "lora_up" in p and np.abs(final[p]).max() > 0]
    assert len(moved) == 2 * 4
    assert all(not np.any(initial[p]) for p in adapters if "lora_up" in p)
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    assert len(losses) == 20 and all(np.isfinite(losses))
    with open(tmp_path / "run" / "model_parameters.txt", encoding="utf-8") as f:
        header = f.read().splitlines()[:2]
    assert header[1].startswith("Trainable parameters: 7,168 of ")
