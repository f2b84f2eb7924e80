"""Tests for axlearn/common/experiment_registry.py: `--module` / `--config` lookup."""

import os
import sys
import types

import pytest

from axlearn.common import experiment_registry
from axlearn.common.experiment_registry import (
    ExperimentModuleNotFoundError,
    NotAnExperimentModuleError,
    UnknownTrainerConfigError,
    candidate_module_names,
    get_named_trainer_config,
    load_experiment_module,
    named_trainer_configs,
)

TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "testdata")
FAKE = "axlearn_test_fake_experiment"


@pytest.fixture(autouse=True)
def fake_modules_on_path(monkeypatch):
    """Makes the fake experiment modules under tests/testdata importable (undone afterwards)."""
    monkeypatch.syspath_prepend(os.path.join(TESTDATA, "experiment_registry"))
    yield
    for name in list(sys.modules):
        if name.startswith("axlearn_test_"):
            del sys.modules[name]


def test_candidate_names():
    full = "axlearn.experiments.text.gpt.tiny"
    assert candidate_module_names("text.gpt.tiny") == [full, "text.gpt.tiny"]
    assert candidate_module_names(full) == [full]
    short = "my_pkg.exps"
    assert candidate_module_names(short) == [f"axlearn.experiments.{short}", short]


@pytest.mark.parametrize("bad", ["", "text..tiny", "text/gpt/tiny", "text.gpt.tiny.py", ".tiny"])
def test_invalid_module_name(bad):
    with pytest.raises(ValueError, match="--module must be a dotted Python module path"):
        load_experiment_module(bad)


def test_full_module_path():
    mod = load_experiment_module(FAKE)
    assert mod.__name__ == FAKE
    assert sorted(named_trainer_configs(FAKE)) == ["fake_small", "fake_tiny"]


def test_short_form_relative_to_experiments(monkeypatch):
    # A module inside the real `axlearn.experiments` package, registered without a file.
    fake = types.ModuleType("axlearn.experiments.axlearn_test_short")
    fake.named_trainer_configs = lambda: {"short_cfg": lambda: "built"}
    monkeypatch.setitem(sys.modules, "axlearn.experiments.axlearn_test_short", fake)
    assert load_experiment_module("axlearn_test_short") is fake
    assert load_experiment_module("axlearn.experiments.axlearn_test_short") is fake
    fn = get_named_trainer_config("short_cfg", config_module="axlearn_test_short")
    assert fn() == "built"


def test_short_form_wins_over_top_level_module(monkeypatch):
    short = types.ModuleType("axlearn.experiments.axlearn_test_fake_experiment")
    short.named_trainer_configs = lambda: {}
    monkeypatch.setitem(sys.modules, "axlearn.experiments.axlearn_test_fake_experiment", short)
    assert load_experiment_module(FAKE) is short


def test_real_experiments_package_module_is_found():
    # `axlearn.experiments` is a real (installed) package: a name under it imports for real.
    import axlearn.experiments  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel

    with pytest.raises(ExperimentModuleNotFoundError, match=r"axlearn\.experiments\.no_such"):
        load_experiment_module("no_such_experiment")


def test_get_named_trainer_config():
    fn = get_named_trainer_config("fake_tiny", config_module=FAKE)
    cfg = fn()
    assert cfg.model.dim == 8
    assert cfg.debug_string().splitlines()[0] == (
        "klass: 'axlearn_test_fake_experiment.FakeTrainer'"
    )
    # Each call builds a fresh config.
    assert fn() is not cfg and fn() == cfg


def test_unknown_module_lists_what_was_tried():
    with pytest.raises(ExperimentModuleNotFoundError) as e:
        load_experiment_module("nope.gpt.tiny")
    assert str(e.value) == (
        "No experiment module found for --module='nope.gpt.tiny'; "
        "tried: axlearn.experiments.nope.gpt.tiny, nope.gpt.tiny. Did you mean: text.gpt.tiny? "
        "`axlearn config list` lists the experiment modules."
    )
    # It is an ImportError, so callers catching import failures still catch it.
    assert isinstance(e.value, ImportError)


def test_missing_dependency_of_the_module_is_not_hidden():
    # The module exists but imports something missing: that error surfaces unchanged, rather
    # than being reported as "no experiment module found".
    with pytest.raises(ModuleNotFoundError) as e:
        load_experiment_module("axlearn_test_broken_experiment")
    assert not isinstance(e.value, ExperimentModuleNotFoundError)
    assert e.value.name == "axlearn_test_dependency_that_does_not_exist"


def test_not_an_experiment_module():
    with pytest.raises(NotAnExperimentModuleError) as e:
        load_experiment_module("axlearn_test_not_an_experiment")
    assert str(e.value) == (
        "Module 'axlearn_test_not_an_experiment' (from --module='axlearn_test_not_an_experiment')"
        " is not an experiment module: it defines no function named_trainer_configs() -> "
        "dict[str, config function]"
    )


def test_unknown_config_suggests_close_names():
    with pytest.raises(UnknownTrainerConfigError) as e:
        get_named_trainer_config("fake_tny", config_module=FAKE)
    assert str(e.value) == (
        "Unknown config 'fake_tny' in experiment module 'axlearn_test_fake_experiment'. "
        "Did you mean: fake_tiny? Available configs (2): fake_small, fake_tiny"
    )
    assert isinstance(e.value, ValueError)


def test_unknown_config_without_close_names():
    with pytest.raises(UnknownTrainerConfigError) as e:
        get_named_trainer_config("zzz", config_module=FAKE)
    assert str(e.value) == (
        "Unknown config 'zzz' in experiment module 'axlearn_test_fake_experiment'. "
        "Available configs (2): fake_small, fake_tiny"
    )


@pytest.mark.parametrize(
    "returned,message",
    [
        ([("a", lambda: None)], "must return a dict, got list"),
        ({"a": 3}, "must map str names to callables, got 'a': int"),
        ({1: lambda: None}, "must map str names to callables, got 1: function"),
    ],
)
def test_malformed_named_trainer_configs(monkeypatch, returned, message):
    fake = types.ModuleType("axlearn.experiments.axlearn_test_malformed")
    fake.named_trainer_configs = lambda: returned
    monkeypatch.setitem(sys.modules, "axlearn.experiments.axlearn_test_malformed", fake)
    with pytest.raises(TypeError, match=message):
        named_trainer_configs("axlearn_test_malformed")


def test_no_static_import_of_experiments():
    # Nothing in axlearn/ imports the repository's top-level `experiments` folder (not installed).
    root = os.path.dirname(os.path.dirname(experiment_registry.__file__))
    offenders = []
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            path = os.path.join(dirpath, filename)
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    stripped = line.strip()
                    if stripped.startswith(("import experiments", "from experiments")):
                        offenders.append(f"{path}:{lineno}: {stripped}")
    assert not offenders, offenders


def test_unknown_config_of_a_big_module_is_a_short_line(monkeypatch):
    """Issue 55 case 7: 60 configs -> at most 5 suggestions, closest first, and the command
    that lists them all instead of every name (was: one 4.4 KB line)."""
    import types  # pylint: disable=import-outside-toplevel

    names = [f"fuji-{size}B-v{v}" for size in (1, 3, 7, 8, 70) for v in (1, 2, 3)]
    names = [n + s for n in names for s in ("", "-flash", "-flash-fp8", "-single-host")]
    module = types.ModuleType("axlearn_test_big_experiment")
    module.named_trainer_configs = lambda: {n: (lambda: None) for n in names}
    monkeypatch.setitem(sys.modules, "axlearn_test_big_experiment", module)
    with pytest.raises(UnknownTrainerConfigError) as e:
        get_named_trainer_config("fuji-7B-v4", config_module="axlearn_test_big_experiment")
    msg = str(e.value)
    suggested = msg.split("Did you mean: ", 1)[1].split("?", 1)[0].split(", ")
    assert len(names) == 60 and len(suggested) == 5 and suggested[0] == "fuji-7B-v1", msg
    assert msg.endswith(
        "`axlearn config list --module=axlearn_test_big_experiment` lists its 60 configs."
    )
    assert len(msg) < 300, len(msg)
