"""Tests axlearn/common/run_record.py: the run's record is written only once the run is known to
start, earlier records are kept (numbered), and the record a checkpoint was made with is found
from its step (what `generate`/`eval` rebuild the model from)."""

from __future__ import annotations

import json
import os

import pytest

from axlearn.cli.main import main
from axlearn.common import launch_trainer, run_record
from axlearn.common.checkpointer import StateMismatchError
from axlearn.common.config.base import InvalidConfigValueError
from tests.common import trainer_test_utils as tu


def _run(trainer_dir: str, **changes) -> None:
    cfg = tu.bigram_trainer_config(trainer_dir, max_step=changes.pop("max_step", 4))
    cfg.checkpointer.save_policy.n = 2
    for path, value in changes.items():
        node = cfg
        *parents, name = path.split(".")
        for part in parents:
            node = getattr(node, part)
        setattr(node, name, value)
    launch_trainer.run_trainer(cfg)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_a_rerun_that_does_not_train_leaves_the_record(tmp_path, capsys):
    """Case 1: a rerun that fails at restore (another model), has nothing to do (another lr at
    max_step) or is rejected (an out-of-range value) leaves `trainer_config` and the records as
    they were; a rerun that trains adds record 2 and keeps record 1 for the older steps."""
    trainer_dir = str(tmp_path / "run")
    _run(trainer_dir)
    top = os.path.join(trainer_dir, run_record.TRAINER_CONFIG_FILE)
    first = _read(top)
    assert "model.dim: 32" in first
    assert [(r["record"], r["start_step"]) for r in run_record.records(trainer_dir)] == [(1, -1)]

    with pytest.raises(StateMismatchError):
        _run(trainer_dir, max_step=6, **{"model.dim": 16})
    _run(trainer_dir, **{"learner.optimizer.learning_rate": 0.5})  # Already at max_step 4.
    with pytest.raises((ValueError, InvalidConfigValueError)):
        _run(trainer_dir, max_step=6, **{"learner.optimizer.learning_rate": -1.0})
    assert _read(top) == first
    assert len(run_record.records(trainer_dir)) == 1

    _run(trainer_dir, max_step=6, **{"learner.optimizer.learning_rate": 0.02})
    found = run_record.records(trainer_dir)
    assert [(r["record"], r["start_step"]) for r in found] == [(1, -1), (2, 4)]
    assert "learning_rate: 0.02" in _read(top)
    record_1 = _read(os.path.join(found[0]["dir"], run_record.TRAINER_CONFIG_FILE))
    assert record_1 == first
    # Steps 2 and 4 were saved under record 1, step 6 under record 2.
    assert run_record.record_dir_for_step(trainer_dir, 4) == found[0]["dir"]
    assert run_record.record_dir_for_step(trainer_dir, 6) == found[1]["dir"]
    # `axlearn checkpoint list` names the record of each step.
    capsys.readouterr()
    assert main(["checkpoint", "list", os.path.join(trainer_dir, "checkpoints")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.rsplit("  ", 1)[-1] for line in lines] == [
        "record run_records/1",
        "record run_records/1",
        "record run_records/2",
    ]
    # Another max_step is another record; a start with the same config and flags adds none.
    _run(trainer_dir, max_step=8, **{"learner.optimizer.learning_rate": 0.03})
    found = run_record.records(trainer_dir)
    assert [(r["record"], r["start_step"]) for r in found] == [(1, -1), (2, 4), (3, 6)]
    dump, flags = _read(top), json.loads(_read(os.path.join(trainer_dir, "launch_trainer_flags")))
    again = run_record.write_run_record(
        trainer_dir, trainer_config=dump, launch_flags=flags, start_step=8
    )
    assert again == found[-1]["dir"] and len(run_record.records(trainer_dir)) == 3


def _write_record(trainer_dir: str, overrides: list[str], start_step: int) -> None:
    flags = dict(
        module="tests.common.trainer_mp_experiment",
        config="gpt-tiny-test",
        config_override=overrides,
        data_dir="FAKE",
    )
    run_record.write_run_record(
        trainer_dir, trainer_config="", launch_flags=flags, start_step=start_step
    )


def test_config_of_a_step_comes_from_its_record(tmp_path):
    """Case 1: `generate`/`eval` (trainer_config_from_dir with the step they load) rebuild the
    model of the record that step was made with, not of a later start."""
    trainer_dir = str(tmp_path / "run")
    os.makedirs(trainer_dir)
    _write_record(trainer_dir, [], -1)
    _write_record(trainer_dir, ["model.decoder.transformer.num_layers=3"], 10)
    old = launch_trainer.trainer_config_from_dir(trainer_dir, step=10, check_dump=False)
    new = launch_trainer.trainer_config_from_dir(trainer_dir, step=12, check_dump=False)
    assert new.model.decoder.transformer.num_layers == 3
    assert old.model.decoder.transformer.num_layers != 3
