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
    old = launch_trainer.trainer_config_from_dir(
        trainer_dir, step=10, check_dump=False, module="tests.common.trainer_mp_experiment"
    )
    new = launch_trainer.trainer_config_from_dir(
        trainer_dir, step=12, check_dump=False, module="tests.common.trainer_mp_experiment"
    )
    assert new.model.decoder.transformer.num_layers == 3
    assert old.model.decoder.transformer.num_layers != 3


SECRET = "hunter2-SECRET-in-a-run-file"


def _flags_dir(tmp_path, flags_text: str) -> str:
    trainer_dir = str(tmp_path / "run")
    os.makedirs(trainer_dir, exist_ok=True)
    with open(os.path.join(trainer_dir, "launch_trainer_flags"), "w", encoding="utf-8") as f:
        f.write(flags_text)
    return trainer_dir


def test_insecure_record_module_is_imported_only_when_named(tmp_path, monkeypatch):
    """Insecure: the module a run record names was imported, so its code ran. Now only the
    module named on the command line (or one of axlearn's own experiments) is imported."""
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    ran = tmp_path / "ran"
    (code_dir / "planted_experiment.py").write_text(
        f"open({str(ran)!r}, 'w').write('ran')\n"
        "def named_trainer_configs():\n    return {}\n"
    )
    monkeypatch.syspath_prepend(str(code_dir))
    trainer_dir = _flags_dir(
        tmp_path, json.dumps(dict(module="planted_experiment", config="gpt-tiny-test"))
    )
    with pytest.raises(launch_trainer.TrainerDirError) as e:
        launch_trainer.trainer_config_from_dir(trainer_dir, step=None, check_dump=False)
    message = str(e.value)
    assert "\n" not in message
    assert "names the experiment module planted_experiment, which is not one of axlearn's" in (
        message
    )
    assert "pass --module=planted_experiment" in message
    assert not ran.exists()  # Its code did not run.
    with pytest.raises(launch_trainer.TrainerDirError, match="pass --module=planted_experiment"):
        launch_trainer.trainer_config_from_dir(
            trainer_dir, check_dump=False, module="text.gpt.tiny"
        )
    assert not ran.exists()


def test_record_with_axlearn_experiment_or_named_module_is_rebuilt(tmp_path):
    trainer_dir = _flags_dir(
        tmp_path, json.dumps(dict(module="text.gpt.tiny", config="gpt-tiny", data_dir="FAKE"))
    )
    cfg = launch_trainer.trainer_config_from_dir(trainer_dir, check_dump=False)
    assert cfg.dir == trainer_dir
    trainer_dir = _flags_dir(
        tmp_path,
        json.dumps(dict(module="tests.common.trainer_mp_experiment", config="gpt-tiny-test")),
    )
    cfg = launch_trainer.trainer_config_from_dir(
        trainer_dir, check_dump=False, module="tests.common.trainer_mp_experiment"
    )
    assert cfg.dir == trainer_dir


@pytest.mark.parametrize(
    "text,reason",
    [
        (json.dumps(dict(module=7, config="c")), "names no valid --module"),
        (json.dumps(dict(module="text.gpt.tiny", config=["c"])), "names no --module/--config"),
        (json.dumps(dict(module="text.gpt.tiny", config="gpt-tiny", config_override="x=1")),
         "field 'config_override' is not a list of strings"),
        (json.dumps([SECRET]), "not a JSON object of flags"),
        ("[" * 100_000 + "]" * 100_000, "launch_trainer_flags"),
        ('{"module": "' + SECRET * 100_000 + '"}', "launch_trainer_flags"),
        (b"\xff\xfe".decode("latin-1") + SECRET, "launch_trainer_flags"),
    ],
)  # fmt: skip
def test_bad_launch_flags_are_one_line_without_content(tmp_path, text, reason):
    trainer_dir = _flags_dir(tmp_path, text)
    with pytest.raises(launch_trainer.TrainerDirError) as e:
        launch_trainer.trainer_config_from_dir(trainer_dir, check_dump=False)
    message = str(e.value)
    assert reason in message and "\n" not in message and SECRET not in message


def test_linked_record_files_are_refused(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(dict(module="text.gpt.tiny", config="gpt-tiny", x=SECRET)))
    trainer_dir = str(tmp_path / "run")
    os.makedirs(trainer_dir)
    os.symlink(outside, os.path.join(trainer_dir, "launch_trainer_flags"))
    with pytest.raises(launch_trainer.TrainerDirError, match="link") as e:
        launch_trainer.trainer_config_from_dir(trainer_dir, check_dump=False)
    assert SECRET not in str(e.value)


def test_insecure_config_comparison_never_logs_the_files_content(tmp_path, caplog):
    """Insecure: generate/eval/hf export compared the run's config dump with a file the run dir
    names and logged that file's first "fields" (secrets). Now only field names of the rebuilt
    config and a count are logged."""
    trainer_dir = _flags_dir(
        tmp_path, json.dumps(dict(module="text.gpt.tiny", config="gpt-tiny", data_dir="FAKE"))
    )
    fresh = launch_trainer.trainer_config_from_dir(trainer_dir, check_dump=False)
    dump = fresh.debug_string().replace("max_step: ", f"max_step: '{SECRET}' # ", 1)
    dump += f"\n{SECRET}_field: '{SECRET}'\n"
    with open(os.path.join(trainer_dir, "trainer_config"), "w", encoding="utf-8") as f:
        f.write(dump)
    with caplog.at_level("WARNING"):
        launch_trainer.trainer_config_from_dir(trainer_dir)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "max_step" in logged and "1 fields only in the run's dump" in logged
    assert SECRET not in logged
