"""Tests of `axlearn aot` (axlearn/cli/aot.py) and axlearn/experiments/run_aot_compilation.py."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from axlearn.cli.main import main
from axlearn.experiments import run_aot_compilation

TINY = ["--module=text.gpt.tiny", "--config=gpt-tiny"]


def test_unknown_topology_lists_close_names(capsys):
    assert main(["aot", *TINY, "--topology=v5p-127"]) == 1
    err = capsys.readouterr().err
    assert "axlearn aot: error: Unknown topology 'v5p-127'" in err
    assert "Did you mean:" in err and "v5p-128" in err


def test_missing_libtpu_names_the_extra(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a)
    )
    assert main(["aot", *TINY, "--topology=v5p-8"]) == 1
    assert "pip install 'axlearn[tpu]'" in capsys.readouterr().err


def test_run_aot_compilation_usage_error(capsys):
    assert run_aot_compilation.main(["run_aot_compilation", "--config=gpt-tiny"]) == 2
    assert "module" in capsys.readouterr().err


@pytest.mark.slow
def test_aot_report_json_and_hlo(tmp_path, capsys):
    report_path = tmp_path / "report.json"
    hlo_dir = tmp_path / "hlo"
    code = run_aot_compilation.main(
        [
            "run_aot_compilation",
            *TINY,
            "--topology=tpu-v5p-8",
            "--compiler_options=default",
            f"--dump_hlo={hlo_dir}",
            f"--report_json={report_path}",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "AOT compilation of text.gpt.tiny:gpt-tiny for v5p-8 x1 (4 x TPU v5p" in out
    report = json.loads(report_path.read_text())
    assert report["fits"] is True and report["topology"] == "v5p-8"
    assert report["mesh_rule"] is None  # gpt-tiny's rules name CPU meshes only.
    assert report["mesh_shape"]["data"] == 4
    memory = report["memory"]
    assert memory["total_bytes"] == (
        memory["argument_bytes"]
        + memory["output_bytes"]
        + memory["temp_bytes"]
        + memory["generated_code_bytes"]
        - memory["alias_bytes"]
    )
    assert report["bytes_needed"] == memory["total_bytes"]
    assert report["headroom_bytes"] == report["hbm_per_chip_bytes"] - memory["total_bytes"]
    # The model FLOPs formula and XLA's count agree to ~10% for this model.
    assert report["xla_flops_per_step"] == pytest.approx(report["model_flops_per_step"], rel=0.15)
    assert report["xla_step_seconds"] > 0
    assert report["estimated_mfu"] == pytest.approx(
        report["model_flops_per_step"]
        / (report["xla_step_seconds"] * 4 * report["peak_flops_per_chip"])
    )
    hlo = (hlo_dir / "train_step.hlo.txt").read_text()
    assert hlo.startswith("HloModule") and os.path.getsize(hlo_dir / "train_step.hlo.txt") > 1000


def test_bad_config_override_is_an_error(capsys):
    assert main(["aot", *TINY, "--topology=v5p-8", "--config_override=no_such_field=1"]) == 1
    assert "no_such_field" in capsys.readouterr().err
