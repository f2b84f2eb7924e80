"""Tests for the `axlearn` command (axlearn/cli/main.py, axlearn/cli/config_commands.py)."""

import os
import re
import subprocess
import sys

import pytest

from axlearn.cli.main import main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_DIR = os.path.join(REPO_ROOT, "tests", "testdata", "experiment_registry")
FAKE = "axlearn_test_fake_experiment"


@pytest.fixture(autouse=True)
def fake_modules_on_path(monkeypatch):
    """Makes the fake experiment modules under tests/testdata importable (undone afterwards)."""
    monkeypatch.syspath_prepend(FAKE_DIR)
    yield
    for name in list(sys.modules):
        if name.startswith("axlearn_test_"):
            del sys.modules[name]


def _expected_dump(config_name: str) -> str:
    sys.path.insert(0, FAKE_DIR)
    try:
        import axlearn_test_fake_experiment  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.remove(FAKE_DIR)
    return axlearn_test_fake_experiment.named_trainer_configs()[config_name]().debug_string()


def test_config_dump_prints_debug_string(capsys):
    assert main(["config", "dump", f"--module={FAKE}", "--config=fake_small"]) == 0
    out = capsys.readouterr().out
    assert out == _expected_dump("fake_small") + "\n"
    # The hand-written dump of the fake config: sorted keys, defaults printed, class names quoted.
    assert out == (
        "klass: 'axlearn_test_fake_experiment.FakeTrainer'\n"
        "max_step: 10\n"
        "model.dim: 64\n"
        "model.dropout: 0.0\n"
        "model.klass: 'axlearn_test_fake_experiment.FakeModel'\n"
        "model.num_layers: 2\n"
    )


def test_config_dump_space_separated_flags(capsys):
    assert main(["config", "dump", "--module", FAKE, "--config", "fake_tiny"]) == 0
    assert "model.dim: 8\n" in capsys.readouterr().out


def test_config_dump_to_file(tmp_path, capsys):
    out_file = tmp_path / "dump.txt"
    args = ["config", "dump", f"--module={FAKE}", "--config=fake_tiny", f"--output={out_file}"]
    assert main(args) == 0
    assert capsys.readouterr().out == ""
    assert out_file.read_text() == _expected_dump("fake_tiny") + "\n"


def test_config_list(capsys):
    assert main(["config", "list", f"--module={FAKE}"]) == 0
    assert capsys.readouterr().out == "fake_small\nfake_tiny\n"


def test_unknown_config_error(capsys):
    assert main(["config", "dump", f"--module={FAKE}", "--config=fake_smal"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "axlearn config: error: Unknown config 'fake_smal' in experiment module "
        "'axlearn_test_fake_experiment'. Did you mean: fake_small? "
        "Available configs (2): fake_small, fake_tiny\n"
    )


def test_unknown_module_error(capsys):
    assert main(["config", "dump", "--module=nope.tiny", "--config=x"]) == 1
    assert capsys.readouterr().err == (
        "axlearn config: error: No experiment module found for --module='nope.tiny'; "
        "tried: axlearn.experiments.nope.tiny, nope.tiny. `axlearn config list` lists the "
        "experiment modules.\n"
    )


def test_not_an_experiment_module_error(capsys):
    assert main(["config", "list", "--module=axlearn_test_not_an_experiment"]) == 1
    assert "is not an experiment module" in capsys.readouterr().err


def test_config_fn_must_return_a_config(monkeypatch, capsys):
    import types  # pylint: disable=import-outside-toplevel

    fake = types.ModuleType("axlearn.experiments.axlearn_test_returns_str")
    fake.named_trainer_configs = lambda: {"bad": lambda: "not a config"}
    monkeypatch.setitem(sys.modules, "axlearn.experiments.axlearn_test_returns_str", fake)
    assert main(["config", "dump", "--module=axlearn_test_returns_str", "--config=bad"]) == 1
    assert capsys.readouterr().err == (
        "axlearn config: error: Config function 'bad' of 'axlearn_test_returns_str' "
        "returned str, not a config\n"
    )


@pytest.mark.parametrize(
    "argv",
    [[], ["config"], ["config", "dump", "--config=x"], ["config", "dump", "--module=x"], ["bad"]],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "usage: axlearn" in capsys.readouterr().err


def _run(args, cwd):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_module_entry_point_in_subprocess_is_light():
    # `python -m axlearn.cli.main` from a directory holding the experiment module: the current
    # directory is searched, and neither jax, TensorFlow nor seqio is imported for a dump.
    code = (
        "import sys; from axlearn.cli.main import main; "
        "rc = main(['config', 'dump', '--module=axlearn_test_fake_experiment', "
        "'--config=fake_tiny']); "
        "heavy = sorted(m for m in ('jax', 'tensorflow', 'seqio') if m in sys.modules); "
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    result = _run([sys.executable, "-c", code], cwd=FAKE_DIR)
    assert result.returncode == 0, result.stderr
    assert "model.dim: 8\n" in result.stdout
    assert "HEAVY []" in result.stdout


def test_python_dash_m_main():
    result = _run(
        [sys.executable, "-m", "axlearn.cli.main", "config", "list", f"--module={FAKE}"],
        cwd=FAKE_DIR,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "fake_small\nfake_tiny\n"


def test_console_script_is_installed():
    # `pip install -e .` installs the `axlearn` console script next to the interpreter.
    script = os.path.join(os.path.dirname(sys.executable), "axlearn")
    if not os.path.exists(script):
        pytest.fail(f"console script not installed at {script}; run `pip install -e .`")
    result = _run([script, "config", "list", f"--module={FAKE}"], cwd=FAKE_DIR)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "fake_small\nfake_tiny\n"


def test_version_matches_pyproject(capsys):
    import importlib.metadata
    import tomllib

    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"axlearn {version} (jax {importlib.metadata.version('jax')}, Python ")


@pytest.mark.parametrize(
    "argv,code,expected",
    [
        (["config", "dump", "--module=" + "a" * 10_000_000, "--config=x"], 2, "argument 3 "),
        (
            [
                "hf",
                "import",
                "/tmp",
                "--module=m",
                "--config=c",
                "--trainer_dir=/t",
                "--config_override=max_step=" + "9" * 10_000_000,
            ],
            2,
            "argument 7 .* is 10000027 characters",
        ),
        (
            ["config", "dump", "--module=text.gpt.tiny", "--config=" + "a" * 60_000],
            1,
            r"characters cut\].*Available configs",
        ),
        (
            ["hf", "export", "--trainer_dir=/tmp/" + "a" * 60_000, "--output=/tmp/o"],
            1,
            r"File name too long|does not exist",
        ),
    ],
)
def test_oversized_arguments_are_one_short_line(argv, code, expected, capsys):
    """Unclear case: a gigantic --config_override (10 MB) or argument: no traceback, one line."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and len(err) < 4200, len(err)
    assert re.search(expected, err), err[:300]
    assert "Traceback" not in err
