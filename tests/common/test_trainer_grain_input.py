"""SpmdTrainer with a Grain input: the position is saved as JSON per process and resumes exactly;
`--data_dir=FAKE` replaces a Grain input's source with `input_fake.fake_grain_lm_source`."""

from __future__ import annotations

import json

import jax
import numpy as np

from axlearn.common import input_fake, input_grain
from axlearn.common.checkpointer import read_index_file
from axlearn.common.config import config_for_function
from axlearn.experiments.text.gpt.tiny import tiny_grain_trainer_config
from tests.common import resume_test_utils as rtu
from tests.common import trainer_test_utils as tu


def _config(trainer_dir: str, max_step: int):
    cfg = rtu.resume_trainer_config(trainer_dir, max_step=max_step, checkpoint_every=4)
    cfg.input = input_grain.Input.default_config().set(
        source=config_for_function(input_fake.fake_grain_lm_source).set(
            is_training=True, global_batch_size=8, source_length=tu.SEQ, max_token_id=tu.VOCAB
        )
    )
    return cfg


def test_grain_input_resume_through_the_trainer(tmp_path):
    full = _config(str(tmp_path / "full"), 8).instantiate(parent=None)
    full.run(jax.random.PRNGKey(1))
    _config(str(tmp_path / "resumed"), 4).instantiate(parent=None).run(jax.random.PRNGKey(1))
    resumed = _config(str(tmp_path / "resumed"), 8).instantiate(parent=None)
    resumed.run(jax.random.PRNGKey(1))
    assert resumed.restored_steps == [4]
    a = rtu.losses_by_step(str(tmp_path / "full"))
    b = rtu.losses_by_step(str(tmp_path / "resumed"))
    assert sorted(a) == list(range(1, 9))
    assert [a[s] for s in range(1, 9)] == [b[s] for s in range(1, 9)]
    # The checkpoint holds Grain's JSON state for process 0 (no pickle).
    step_dir = tmp_path / "full" / "checkpoints" / "step_00000004"
    (leaf,) = [x for x in read_index_file(str(step_dir))["leaves"] if x["path"] == "input_iter"]
    state = json.loads((step_dir / leaf["per_process"]["0"]["file"]).read_bytes())
    assert state["format"] == "axlearn.grain_input_state" and state["num_batches"] == 4
    assert state["grain"]  # Grain's own iterator state.


def test_data_dir_fake_replaces_the_grain_source():
    cfg = tiny_grain_trainer_config()
    input_fake.replace_inputs_with_fake(cfg)
    assert cfg.input.klass is input_grain.Input
    assert cfg.input.source.fn is input_fake.fake_grain_lm_source
    assert cfg.input.source.max_token_id == 4096
    evaler_source = cfg.evalers["validation"].input.source
    assert evaler_source.is_training is False and evaler_source.total_num_batches == 2
    inp = cfg.input.set(name="input").instantiate(parent=None)
    batch = next(iter(inp))
    assert batch["input_ids"].shape == (16, 128) and batch["input_ids"].dtype == np.int32
    np.testing.assert_array_equal(batch["input_ids"][:, 1:], batch["target_labels"][:, :-1])
    assert batch["input_ids"].min() >= 1 and batch["input_ids"].max() < 4096
    ev = cfg.evalers["validation"].input.set(name="ev").instantiate(parent=None)
    assert len(list(iter(ev))) == 2
