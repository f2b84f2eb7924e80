"""Tests axlearn/cloud/gcp/preflight.py: the launch's AOT pre-flight, and its wiring in the CLI."""

from __future__ import annotations

import pytest

from axlearn.cli import main as cli_main
from axlearn.cloud.gcp import preflight

TRAINER = ["python", "-m", "axlearn.common.launch_trainer_main"]
TINY = TRAINER + ["--module=tests.common.trainer_mp_experiment", "--config", "gpt-tiny-test"]
# 40M x 128 float32 embedding: 20 GB of parameters, more than a v5e chip's 16 GiB of HBM.
HUGE = TINY + ["--config_override=model.decoder.vocab_size=40000000"]


def test_trainer_flags():
    got = preflight.trainer_flags(HUGE + ["--config_override", "max_step=3"])
    assert got == {
        "module": "tests.common.trainer_mp_experiment",
        "config": "gpt-tiny-test",
        "config_override": ["model.decoder.vocab_size=40000000", "max_step=3"],
    }


@pytest.mark.parametrize(
    "command,instance_type,skip,reason",
    [
        (TINY, "tpu-v5litepod-1", True, "--skip_preflight"),
        (["bash", "-c", "true"], "tpu-v5litepod-1", False, "does not run launch_trainer_main"),
        (TINY, "gpu-a3-highgpu-8g", False, "GPU jobs are not"),
        (TRAINER, "tpu-v5litepod-1", False, "names no --module and --config"),
    ],
)
def test_skipped(command, instance_type, skip, reason):
    result = preflight.check_launch(command, instance_type=instance_type, num_replicas=1, skip=skip)
    assert result.status == preflight.SKIPPED and reason in result.message


@pytest.mark.slow  # Compiles the tiny trainer for a v5e chip: ~15 s alone, minutes under load.
def test_fits():
    ok = preflight.check_launch(TINY, instance_type="tpu-v5litepod-1", num_replicas=1)
    assert ok.status == preflight.FITS and ok.report.fits
    assert "fits: yes" in ok.describe()


def test_refused():
    refused = preflight.check_launch(HUGE, instance_type="tpu-v5litepod-1", num_replicas=1)
    assert refused.status == preflight.REFUSED and not refused.report.fits
    assert refused.message == refused.report.refusal_message()
    assert "TPU v5e" in refused.message


def test_cli_refuses_a_job_that_does_not_fit(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".axlearn.config").write_text(
        '[gcp]\n_active = "p:z"\n[gcp."p:z"]\nproject = "p"\nzone = "z"\npermanent_bucket = "b"\n'
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    argv = ["gcp", "launch", "--dry_run", "--name=big", "--instance_type=tpu-v5litepod-1"]
    argv += ["--image=img:1", "--"] + HUGE
    assert cli_main.main(argv) == 1
    captured = capsys.readouterr()
    assert "# Pre-flight: refused:" in captured.out  # The dry run reports it ...
    assert captured.err.startswith("axlearn gcp: error: Refused: ")  # ... and fails.
    assert captured.err.rstrip().endswith("Pass --skip_preflight to launch anyway.")
    assert cli_main.main(argv[:2] + ["--skip_preflight"] + argv[2:]) == 0
    assert "# Pre-flight: skipped: --skip_preflight" in capsys.readouterr().out
