"""Tests experiments/example_experiment.py, the experiment module users copy.

Its config differs from gpt-tiny's exactly in the fields it changes (and the values derived from
`max_step`), and `axlearn config dump --module=experiments.example_experiment` finds it from the
repository root, as the file's docstring says.
"""

import os
import subprocess
import sys

from axlearn.common.experiment_registry import get_named_trainer_config

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_GOLDEN = os.path.join(
    REPO_ROOT, "experiments", "testdata", "axlearn.experiments.text.gpt.tiny", "gpt-tiny.txt"
)


def _lines(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.splitlines())


def test_example_changes_only_what_it_says():
    fn = get_named_trainer_config("gpt-tiny-deeper", config_module="experiments.example_experiment")
    ours = _lines(fn().debug_string())
    with open(TINY_GOLDEN, encoding="utf-8") as f:
        tiny = _lines(f.read())
    assert ours.keys() == tiny.keys()
    changed = {k: (tiny[k], ours[k]) for k in ours if ours[k] != tiny[k]}
    assert changed.pop("model.decoder.transformer.num_layers") == ("2", "4")
    assert changed.pop("learner.optimizer.inner.learning_rate.peak_lr") == ("0.003", "0.002")
    assert changed.pop("name") == ("'gpt_trainer'", "'gpt_tiny_deeper'")
    # Everything else that changed is max_step (300 -> 600) or derived from it: the warmup is
    # 10% of the steps.
    assert changed.pop("learner.optimizer.inner.learning_rate.warmup_steps") == ("30", "60")
    assert changed and all(v == ("300", "600") for v in changed.values()), changed
    assert "max_step" in changed


def test_cli_finds_the_example_from_the_repo_root():
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    args = ["config", "dump", "--module=experiments.example_experiment", "--config=gpt-tiny-deeper"]
    proc = subprocess.run(
        [sys.executable, "-m", "axlearn.cli.main", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "model.decoder.transformer.num_layers: 4" in proc.stdout.splitlines()
