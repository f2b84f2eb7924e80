"""axlearn/common/golden_config.py and per_param_settings.per_param_settings_golden_text:
AXLearn's `_init.txt` / `_regularizer.txt` formats."""

import os

import optax
import pytest

from axlearn.common import golden_config, optimizers
from axlearn.common.config import config_for_function
from axlearn.common.per_param_settings import per_param_settings_golden_text
from axlearn.experiments.text.gpt import c4_trainer, tiny


def test_golden_text_format_headers_dedupe_and_pruning():
    records = [
        dict(description="weight_decay_scale", path="root.optimizer", settings={"w": 1, "b": 1}),
        # A later registration of the same description and path replaces the first.
        dict(
            description="weight_decay_scale",
            path="root.optimizer",
            settings={"w": 1, "norm": {"scale": 0.0}, "frozen": optax.MaskedNode(), "e": {}},
        ),
        dict(description="update_scale", path="root.optimizer", settings={"w": 0.25}),
        dict(description="l2_regularizer_scale", path=None, settings={"w": 0.5}),
    ]
    text = per_param_settings_golden_text(
        records, descriptions=("weight_decay_scale", "l2_regularizer_scale")
    )
    assert text.splitlines() == [
        "=" * 20 + "weight_decay_scale root.optimizer" + "=" * 20,
        "norm/scale: 0.0",
        "w: 1",  # The int default prints as 1, as in AXLearn's goldens.
        "=" * 20 + "l2_regularizer_scale 0" + "=" * 20,  # No path: keyed by its index.
        "w: 0.5",
    ]
    assert per_param_settings_golden_text(records, descriptions=("nothing",)) == ""


def test_init_and_regularizer_text_of_a_named_config():
    config_fn = tiny.named_trainer_configs()["gpt-tiny"]
    init = golden_config.init_text(config_fn).splitlines()
    # Creation order (embedding first, output norm after the layers), not sorted order.
    assert init[0] == (
        "decoder/emb/token_emb/weight: normal(0, 1.0 / fan_out), shape=[4096, 128], "
        "axes=FanAxes(in_axis=-2, out_axis=-1, batch_axis=())"
    )
    assert init[-1] == "decoder/output_norm/scale: constant(1.0)"
    assert len(init) == 1 + 2 * 9 + 1  # Embedding, 2 layers of 9 parameters, output norm.

    reg = golden_config.regularizer_text(config_fn).splitlines()
    assert reg[0] == "====================weight_decay_scale root.optimizer===================="
    assert reg[1:3] == ["decoder/emb/token_emb/weight: 1", "decoder/output_norm/scale: 1"]
    assert len(reg) == 1 + len(init)

    # A per-parameter rule prints its float scales; an unmatched parameter keeps the int 1.
    cfg = config_fn()
    cfg.learner.optimizer = config_for_function(optimizers.adamw_optimizer).set(
        learning_rate=0.1,
        b1=0.9,
        b2=0.95,
        eps=1e-8,
        weight_decay=0.1,
        weight_decay_per_param_scale=config_for_function(optimizers.per_param_scale_by_path).set(
            description="weight_decay_scale", scale_by_path=[(".*norm/scale", 0.0)]
        ),
    )
    lines = golden_config.regularizer_text(cfg).splitlines()
    assert "decoder/output_norm/scale: 0.0" in lines
    assert "decoder/emb/token_emb/weight: 1.0" in lines  # per_param_scale_by_path's default.


def test_check_functions_compare_and_update(tmp_path, monkeypatch):
    config_fn = tiny.named_trainer_configs()["gpt-tiny"]
    golden = str(tmp_path / "gpt-tiny_init.txt")
    for name in golden_config.UPDATE_ENVS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(AssertionError, match="Golden file not found: .*UPDATE_GOLDEN=1"):
        golden_config.check_init(config_fn, golden)
    monkeypatch.setenv("UPDATE_GOLDEN", "1")
    golden_config.check_init(config_fn, golden)
    monkeypatch.delenv("UPDATE_GOLDEN")
    golden_config.check_init(config_fn, golden)  # Now equal.
    with open(golden, "a", encoding="utf-8") as f:
        f.write("extra: line\n")
    with pytest.raises(AssertionError, match="Golden file mismatch"):
        golden_config.check_init(config_fn, golden)
    assert os.path.getsize(golden) > 0


AXLEARN_DUMPS = os.path.join(os.path.dirname(__file__), "..", "testdata", "axlearn_dumps")


def _axlearn_dump(name: str) -> str:
    with open(os.path.join(AXLEARN_DUMPS, name), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("name", ["fuji-7B-v3", "fuji-70B-v3"])
def test_init_dump_equals_axlearn_published(name):
    ours = golden_config.init_text(c4_trainer.named_trainer_configs()[name])
    assert ours.rstrip("\n") == _axlearn_dump(f"{name}_init.txt").rstrip("\n")


def test_regularizer_dump_matches_axlearn_published():
    ours = golden_config.regularizer_text(c4_trainer.named_trainer_configs()["fuji-70B-v2"])
    theirs = _axlearn_dump("fuji-70B-v2_regularizer.txt")
    # Every line of AXLearn's (older) dump, header included, in the same order; ours adds only
    # the untied lm_head, which that dump predates.
    ours_lines = ours.splitlines()
    assert [line for line in ours_lines if line in theirs.splitlines()] == theirs.splitlines()
    assert sorted(set(ours_lines) - set(theirs.splitlines())) == ["decoder/lm_head/weight: 1"]
