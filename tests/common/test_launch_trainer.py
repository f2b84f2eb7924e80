"""Tests for axlearn/common/launch_trainer.py and launch_trainer_main: the command line path.

Runs `python -m axlearn.common.launch_trainer_main` as subprocesses: once as one process, once as
2 processes on 127.0.0.1 (jax.distributed over CPU), and checks that both train the same losses
and that the trainer dir holds `trainer_config` and `launch_trainer_flags`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.common import trainer_test_utils as tu

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = "tests.common.trainer_mp_experiment"


def test_get_named_trainer_config_is_patchable_module_global(monkeypatch):
    from axlearn.common import (  # pylint: disable=import-outside-toplevel
        experiment_registry,
        launch_trainer,
    )

    assert launch_trainer.get_named_trainer_config is experiment_registry.get_named_trainer_config
    calls = []

    def fake(config_name, *, config_module):
        calls.append((config_name, config_module))
        return lambda: "built"

    monkeypatch.setattr(launch_trainer, "get_named_trainer_config", fake)
    fn = launch_trainer._named_trainer_config_fn("some.module", "cfg-x")  # pylint: disable=protected-access
    assert fn() == "built" and calls == [("cfg-x", "some.module")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(trainer_dir: str, *extra: str, devices: int = 1) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    cmd = [
        sys.executable,
        "-m",
        "axlearn.common.launch_trainer_main",
        f"--module={MODULE}",
        "--config=gpt-tiny-test",
        f"--trainer_dir={trainer_dir}",
        "--data_dir=FAKE",
        "--jax_backend=cpu",
        *extra,
    ]
    return subprocess.Popen(
        cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _wait(procs, timeout=900):
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-6000:]
    return outs


@pytest.mark.slow
def test_one_vs_two_processes(tmp_path):
    one_dir, two_dir = str(tmp_path / "one"), str(tmp_path / "two")
    port = _free_port()
    procs = [
        _launch(
            two_dir,
            f"--distributed_coordinator=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={i}",
        )
        for i in range(2)
    ]
    _wait(procs)
    (out,) = _wait([_launch(one_dir, devices=2)])
    assert "Run summary" in out and "step 5/5" in out
    one = [r["loss"] for r in tu.read_metrics(one_dir)]
    two = [r["loss"] for r in tu.read_metrics(two_dir)]
    assert len(one) == len(two) == 5
    np.testing.assert_allclose(two, one, rtol=1e-4)
    # The launcher writes the config dump and the flags into the trainer dir (process 0 only).
    with open(os.path.join(two_dir, "trainer_config"), encoding="utf-8") as f:
        dump = f.read()
    assert "klass: 'axlearn.common.trainer.SpmdTrainer'" in dump
    assert "input.klass: 'axlearn.common.input_fake.FakeLmInput'" in dump
    assert f"dir: '{two_dir}'" in dump
    with open(os.path.join(two_dir, "launch_trainer_flags"), encoding="utf-8") as f:
        launch_flags = json.load(f)
    assert launch_flags["module"] == MODULE and launch_flags["config"] == "gpt-tiny-test"
    assert launch_flags["num_processes"] == 2 and launch_flags["data_dir"] == "FAKE"
    summary = json.load(open(os.path.join(two_dir, "run_summary.json"), encoding="utf-8"))
    assert summary["environment"]["process_count"] == 2
    assert summary["environment"]["device_count"] == 2


@pytest.mark.slow
def test_config_override_and_quiet_start(tmp_path):
    trainer_dir = str(tmp_path / "run")
    (out,) = _wait(
        [_launch(trainer_dir, "--config_override=max_step=3", "--config_override=name='trainer'")]
    )
    assert "step 3/3" in out and "step 4/" not in out
    assert len(tu.read_metrics(trainer_dir)) == 3
    # The dump records the overrides (a run is reproducible from its directory)...
    with open(os.path.join(trainer_dir, "trainer_config"), encoding="utf-8") as f:
        dump = f.read().splitlines()
    assert "max_step: 3" in dump and "name: 'trainer'" in dump
    with open(os.path.join(trainer_dir, "launch_trainer_flags"), encoding="utf-8") as f:
        assert json.load(f)["config_override"] == ["max_step=3", "name='trainer'"]
    # ...and start-up output points to the dump and the parameter table instead of printing them.
    assert "input.batcher.global_batch_size" not in out
    assert f"written to {trainer_dir}/trainer_config" in out
    with open(os.path.join(trainer_dir, "model_parameters.txt"), encoding="utf-8") as f:
        table = f.read()
    assert table.startswith("Model parameters: ")
    assert "decoder/emb/token_emb/weight" in table and "decoder/emb/token_emb/weight" not in out


def test_config_override_bad_path_fails_before_training(tmp_path):
    proc = _launch(str(tmp_path / "run"), "--config_override=max_steps=3")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 78, out[-3000:]  # exit_codes.CONFIG_ERROR_EXIT_CODE.
    assert "max_steps" in out and "did you mean max_step?" in out
    assert "step 1/" not in out


def _launch_flags(**kwargs):
    """The flag values `apply_launch_settings` reads, without parsing the global flags."""
    # pylint: disable-next=import-outside-toplevel
    import types

    values = dict(
        trainer_dir=None,
        mesh_selector=None,
        trace_at_steps=[],
        trainer_watchdog_timeout_seconds=3600,
        data_dir=None,
        restore_step=None,
        restore_fallback=None,
    )
    values.update(kwargs)
    return types.SimpleNamespace(**values)


def test_launch_flag_errors_name_the_flag(tmp_path):
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.launch_trainer import apply_launch_settings
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    def cfg():
        return tu.bigram_trainer_config(str(tmp_path)).set(
            mesh_rules=[("tpu-v5.*", (1, 1, -1, 1)), ("gpu-.*", (1, 1, -1, 1))]
        )

    with pytest.raises(ValueError, match=r"--trace_at_steps=x,y: expects a comma-separated"):
        apply_launch_settings(cfg(), flag_values=_launch_flags(trace_at_steps=["x", "y"]))
    with pytest.raises(
        ValueError, match=r"--mesh_selector=tpu-v4-8 matches none.*tpu-v5.*closest selectors"
    ):
        apply_launch_settings(cfg(), flag_values=_launch_flags(mesh_selector="tpu-v4-8"))
    # An explicit mesh_shape override: no rule is applied, no error.
    explicit = apply_launch_settings(
        cfg().set(mesh_shape=(1, 1, 1, -1)),
        flag_values=_launch_flags(
            mesh_selector="tpu-v4-8", config_override=["mesh_shape=(1,1,1,-1)"]
        ),
    )
    assert explicit.mesh_shape == (1, 1, 1, 8)
    # Matching, and no rules at all: fine.
    apply_launch_settings(cfg(), flag_values=_launch_flags(mesh_selector="gpu-a3"))
    apply_launch_settings(
        cfg().set(mesh_rules=None), flag_values=_launch_flags(mesh_selector="tpu-v4-8")
    )
    out = apply_launch_settings(
        cfg(), flag_values=_launch_flags(restore_step=4, restore_fallback="previous")
    )
    assert out.restore_step == 4 and out.checkpointer.restore_fallback == "previous"


def test_trainer_config_from_dir_rebuilds_the_run(trained_dir, tmp_path):
    import shutil

    from axlearn.common import launch_trainer
    from tests.trained_run import MODULE

    cfg = launch_trainer.trainer_config_from_dir(trained_dir, module=MODULE)
    # The run's own overrides (tests/trained_run.py drops QK-norm) are re-applied...
    attention = cfg.model.decoder.transformer.layer.self_attention.attention
    assert attention.query_scale.norm is None and cfg.max_step == 6
    dump_path = os.path.join(trained_dir, "trainer_config")
    with open(dump_path, encoding="utf-8") as f:
        saved = f.read()
    assert launch_trainer._check_against_dump(cfg.debug_string(), saved, dump_path) == []
    # ...then the caller's.
    assert (
        launch_trainer.trainer_config_from_dir(
            trained_dir, config_overrides=["max_step=2"], module=MODULE
        ).max_step
        == 2
    )
    # A dump that differs (the code changed since the run) is reported field by field.
    copy = str(tmp_path / "copy")
    shutil.copytree(trained_dir, copy, ignore=shutil.ignore_patterns("checkpoints", "summaries"))
    with open(os.path.join(copy, "trainer_config"), encoding="utf-8") as f:
        lines = ["max_step: 7" if line == "max_step: 6" else line for line in f.read().split("\n")]
    with open(os.path.join(copy, "trainer_config"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    with open(os.path.join(copy, "trainer_config"), encoding="utf-8") as f:
        changed = f.read()
    diffs = launch_trainer._check_against_dump(
        cfg.debug_string(), changed, os.path.join(copy, "trainer_config")
    )
    assert diffs == ["max_step"]  # Named by field, never with the file's values.
    with pytest.raises(launch_trainer.TrainerDirError, match="launch_trainer_flags does not exist"):
        launch_trainer.trainer_config_from_dir(str(tmp_path))


def test_shortened_max_step_names_derived_fields_and_saves_and_evaluates_the_last_step(
    tmp_path, caplog
):
    """Issue 29 case 8: --config_override=max_step=N below the experiment's: the start says which
    fields still hold the old number, and the run evaluates and saves step N although the
    policies (every 1000 steps) would not."""
    # pylint: disable=import-outside-toplevel
    import jax

    from axlearn.common import launch_trainer
    from axlearn.common.checkpointer import latest_checkpoint_step
    from axlearn.common.config.override import apply_overrides

    trainer_dir = str(tmp_path / "run")
    cfg = tu.bigram_trainer_config(trainer_dir, max_step=1000, checkpoint_every=1000)
    cfg.evalers["val"].eval_policy.max_step = 1000
    apply_overrides(cfg, ["max_step=3"])
    with caplog.at_level("WARNING"):
        found = launch_trainer.warn_derived_max_step(cfg, 1000)
    assert sorted(found) == [
        "checkpointer.save_policy.n",
        "evalers['val'].eval_policy.max_step",
        "evalers['val'].eval_policy.n",
    ]
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "max_step=3 (the experiment's max_step is 1000)" in message
    assert "evalers['val'].eval_policy.max_step" in message and "saves step 3" in message
    assert launch_trainer.max_step_overridden(["max_step=3"])
    assert not launch_trainer.max_step_overridden(["max_steps=3", "a.max_step=3"])
    trainer = cfg.set(save_and_eval_last_step=True).instantiate(parent=None)
    trainer.run(jax.random.PRNGKey(0))
    assert latest_checkpoint_step(os.path.join(trainer_dir, "checkpoints")) == 3
    records = tu.read_metrics(trainer_dir)
    assert [r["step"] for r in records if r.get("perf/overhead/eval", 0) > 0] == [3]
    assert os.listdir(os.path.join(trainer_dir, "summaries", "val"))


_CUSTOM_MODULE = """
from axlearn.experiments.text.gpt.tiny import tiny_trainer_config


def named_trainer_configs():
    return {"custom-tiny": lambda: tiny_trainer_config(max_step=3, num_layers=1, model_dim=32)}
"""


def test_custom_module_of_a_run_is_found_when_importable_else_one_line(tmp_path, monkeypatch):
    """Issue 55 case 5: `generate`/`eval` of a run of a custom module from another folder."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.launch_trainer import (
        TrainerDirError,
        _module_file,
        trainer_config_from_dir,
    )

    folder = tmp_path / "my_experiments"
    folder.mkdir()
    (folder / "nu_custom_exp.py").write_text(_CUSTOM_MODULE)
    run = tmp_path / "run"
    run.mkdir()
    record = {"module": "nu_custom_exp", "config": "custom-tiny", "config_override": []}
    record["module_file"] = str(folder / "nu_custom_exp.py")
    (run / "launch_trainer_flags").write_text(json.dumps(record))
    # A custom module is never imported without --module (a run record is a file of the run's
    # directory): one line naming --module, the folder for PYTHONPATH and the file it came from.
    monkeypatch.syspath_prepend(str(folder))  # Even when importable.
    with pytest.raises(TrainerDirError) as e:
        trainer_config_from_dir(str(run), check_dump=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert (
        f"pass --module=nu_custom_exp (it was imported from {folder / 'nu_custom_exp.py'} when "
        f"the run trained; add {folder} to PYTHONPATH: PYTHONPATH={folder} axlearn ...), or "
        "--module=MODULE"
    ) in msg, msg
    # A --module of the same module that does not import says so.
    with pytest.raises(TrainerDirError, match="--module=elsewhere.nu_custom_exp: No experiment"):
        trainer_config_from_dir(str(run), check_dump=False, module="elsewhere.nu_custom_exp")
    # Named: the record's module is found.
    cfg = trainer_config_from_dir(str(run), check_dump=False, module="nu_custom_exp")
    assert cfg.max_step == 3 and cfg.model.decoder.dim == 32 and cfg.dir == str(run)
    # The user's --module names it under another path: that one is imported.
    monkeypatch.syspath_prepend(str(tmp_path))
    (folder / "__init__.py").write_text("")
    cfg = trainer_config_from_dir(str(run), check_dump=False, module="my_experiments.nu_custom_exp")
    assert cfg.max_step == 3
    # The launcher records the file a module was imported from.
    assert _module_file("nu_custom_exp") == str(folder / "nu_custom_exp.py")
    assert _module_file("text.gpt.tiny").endswith("axlearn/experiments/text/gpt/tiny.py")


def test_launch_settings_for_hang_crash_logging_and_eval_traces(tmp_path):
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.launch_trainer import apply_launch_settings
    from tests.common import trainer_test_utils as tu  # pylint: disable=import-outside-toplevel

    cfg = tu.bigram_trainer_config(str(tmp_path))
    assert cfg.evalers, "the test needs a config with an evaler"
    out = apply_launch_settings(
        cfg,
        flag_values=_launch_flags(
            trainer_crash_on_hang_timeout_seconds=9000,
            trainer_log_every_n_steps=10,
            eval_trace_at_iters=["0", "3"],
        ),
    )
    assert out.crash_on_hang_timeout_seconds == 9000 and out.log_every_n_steps == 10
    assert all(list(e.trace_at_iters) == [0, 3] for e in out.evalers.values())
    # The config's own values win; flags left unset (or absent) change nothing.
    cfg = tu.bigram_trainer_config(str(tmp_path)).set(
        crash_on_hang_timeout_seconds=5000, log_every_n_steps=7
    )
    out = apply_launch_settings(
        cfg, flag_values=_launch_flags(trainer_crash_on_hang_timeout_seconds=9000)
    )
    assert out.crash_on_hang_timeout_seconds == 5000 and out.log_every_n_steps == 7
    out = apply_launch_settings(
        tu.bigram_trainer_config(str(tmp_path)), flag_values=_launch_flags()
    )
    assert out.crash_on_hang_timeout_seconds is None
    with pytest.raises(ValueError, match=r"--eval_trace_at_iters=a: expects a comma-separated"):
        apply_launch_settings(cfg, flag_values=_launch_flags(eval_trace_at_iters=["a"]))


def test_named_config_lookup_falls_back_to_the_experiments_package(monkeypatch):
    from axlearn.common import launch_trainer  # pylint: disable=import-outside-toplevel
    from axlearn.common.experiment_registry import (  # pylint: disable=import-outside-toplevel
        ExperimentModuleNotFoundError,
    )

    calls = []

    def fake(config_name, *, config_module):
        calls.append(config_module)
        known = {"axlearn.experiments.short.mod": {"cfg": lambda: "found"}}
        if config_module == "missing.mod":
            raise ExperimentModuleNotFoundError(
                "tried missing.mod and axlearn.experiments.missing.mod"
            )
        if config_module not in known:
            raise ImportError(config_module)
        return known[config_module][config_name]

    monkeypatch.setattr(launch_trainer, "get_named_trainer_config", fake)
    fn = launch_trainer._named_trainer_config_fn  # pylint: disable=protected-access
    assert fn("short.mod", "cfg")() == "found"
    assert calls == ["short.mod", "axlearn.experiments.short.mod"]
    # The fallback's error when it fails too; a full experiments path is not retried.
    with pytest.raises(ImportError, match="axlearn.experiments.other"):
        fn("other", "cfg")
    calls.clear()
    with pytest.raises(ImportError, match="^axlearn.experiments.x$"):
        fn("axlearn.experiments.x", "cfg")
    assert calls == ["axlearn.experiments.x"]
    # The registry's own "module not found" (which tried both names) is not retried.
    calls.clear()
    with pytest.raises(ExperimentModuleNotFoundError):
        fn("missing.mod", "cfg")
    assert calls == ["missing.mod"]
