"""An experiment written against AXLearn's public API (tests/testdata/axlearn_style_experiment.py)
dumps, instantiates and trains a few steps unchanged."""

from __future__ import annotations

import importlib.util
import os

import jax
import numpy as np
import pytest

from axlearn.common.trainer import select_mesh_config

_FILE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
    "testdata",
    "axlearn_style_experiment.py",
)
_NAME = "axlearn-style-tiny"


def _module():
    spec = importlib.util.spec_from_file_location("axlearn_style_experiment", _FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dumps_with_axlearn_names():
    cfg = _module().named_trainer_configs()[_NAME]()
    dump = dict(line.split(": ", 1) for line in cfg.debug_string().splitlines())
    assert (
        dump["input.source.fn"]
        == "'axlearn.experiments.text.gpt.common.mixture_train_input_source'"
    )
    assert dump["input.source.preprocessor.fn"] == "'axlearn.common.input_lm.lm_text_preprocessor'"
    assert dump["input.input_dispatcher.global_logical_batch_size"] == "16"
    assert dump["mesh_rules[0][1].klass"] == (
        "'axlearn.common.trainer_config_modifier.ChainConfigModifier'"
    )
    prefix = "model.decoder.transformer.layer.self_attention.attention.kv_cache"
    assert dump[f"{prefix}.klass"] == "'axlearn.common.kv_cache.kv_cache.KVCache'"
    assert dump["model.metrics.klass"] == "'axlearn.common.causal_lm.CompositeLossMetrics'"
    # The mesh rule applies its chain.
    assert select_mesh_config(cfg, mesh_selector="cpu-fsdp").mesh_shape == (1, 1, 1, -1, 1, 1)


@pytest.mark.slow
def test_trains_a_few_steps(tmp_path):
    cfg = _module().named_trainer_configs()[_NAME]()
    steps = 4
    cfg.set(dir=str(tmp_path), max_step=steps)
    cfg.evalers = {}  # Evaluation is not part of this check; the file itself is unchanged.
    trainer = cfg.instantiate(parent=None)
    output = trainer.run(jax.random.PRNGKey(0))
    loss = float(output["loss"])
    # From about ln(4096) = 8.3 (a uniform prediction); finite and not diverged.
    assert np.isfinite(loss) and 5.0 < loss < 9.5
