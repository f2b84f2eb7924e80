"""`axlearn compare` across post-training runs: a short DPO run and the same run with LoRA."""

import json

import jax
import pytest

from axlearn.cli.main import main
from axlearn.common.lora_config_modifier import LoraConfigModifier
from axlearn.experiments.text.gpt import post_training

STEPS = 3


def _dpo_run(trainer_dir: str, *, lora: bool) -> None:
    cfg = post_training.dpo_trainer_config(
        max_step=STEPS, global_batch_size=8, eval_every_n_steps=STEPS
    ).set(dir=trainer_dir)
    if lora:
        cfg = LoraConfigModifier.default_config().set(rank=4, alpha=8.0).instantiate()(cfg)
    cfg.instantiate(parent=None).run(jax.random.PRNGKey(0))
    # launch_trainer_main writes the dump; compare reads it to flag differing configs.
    with open(f"{trainer_dir}/trainer_config", "w", encoding="utf-8") as f:
        f.write(cfg.debug_string())


@pytest.mark.slow  # Two DPO runs (one compile each): ~1.5 min on 2 busy cores.
def test_compare_dpo_and_dpo_with_lora(tmp_path, capsys):
    full, lora = str(tmp_path / "dpo"), str(tmp_path / "dpo-lora")
    _dpo_run(full, lora=False)
    _dpo_run(lora, lora=True)
    assert main(["compare", full, lora]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["Metric", "dpo", "(baseline)", "dpo-lora"]
    for title in (
        "Trainable parameters",
        "Final loss",
        f"DPO reward accuracy @ {STEPS}",
        f"DPO reward margin @ {STEPS}",
        f"validation rewards/accuracy @ {STEPS}",
        f"validation loss @ {STEPS}",
    ):
        assert title in out, (title, out)
    assert f"Final loss compared at step {STEPS}." in out
    assert "configs differ from the baseline's for: dpo-lora" in out
    assert main(["compare", full, lora, "--format=json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["baseline"] == "dpo"
    rows = report["rows"]
    trainable = rows["trainable_parameters"]["values"]
    # The full run trains every parameter; the LoRA run its policy's adapters only.
    assert trainable["dpo"] == rows["parameters"]["values"]["dpo"] / 2  # The reference: frozen.
    assert 0 < trainable["dpo-lora"] < trainable["dpo"] / 10, trainable
    for key in ("metric:model/rewards/accuracy", "eval:validation:rewards/accuracy"):
        assert set(rows[key]["values"]) == {"dpo", "dpo-lora"}, rows[key]
