"""Tests of `axlearn aot` (axlearn/cli/aot.py) and axlearn/experiments/run_aot_compilation.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

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
    # The rule a launch on tpu-v5p-8 picks (--mesh_selector=tpu-v5p-8).
    assert report["mesh_rule"] == "tpu-v5p-8(-2)?" and report["mesh_selector"] == "tpu-v5p-8"
    assert report["mesh_shape"]["fsdp"] == 4 and report["mesh_shape"]["data"] == 1
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


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--ignored"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.slow
def test_aot_leaves_nothing_behind_and_shows_progress(tmp_path):
    """`axlearn aot` run from the repo root: nothing new in the git tree, nothing left in the temp
    dir; the report goes to the cache dir; progress lines, and none of libtpu's or TensorFlow's
    misleading start-up errors."""
    tmp, cache = tmp_path / "tmp", tmp_path / "cache"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), XDG_CACHE_HOME=str(cache))
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES"):
        env.pop(name, None)
    before = _git_status()
    proc = subprocess.run(
        [sys.executable, "-m", "axlearn.cli.main", "aot", *TINY, "--topology=v5p-8"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert _git_status() == before
    assert sorted(os.listdir(tmp)) == []
    report = cache / "axlearn" / "aot_reports" / "text.gpt.tiny_gpt-tiny@v5p-8x1.json"
    assert f"Report written to {report}" in proc.stdout
    assert json.loads(report.read_text())["fits"] is True
    err = proc.stderr
    what = "Compiling the train step of text.gpt.tiny:gpt-tiny for v5p-8 x1 (XLA, on this machine)"
    assert f"{what} ..." in err and f"{what}: done in " in err
    assert "Building text.gpt.tiny:gpt-tiny on v5p-8 x1 (--mesh_selector=tpu-v5p-8 matched" in err
    for misleading in ("unexpected worker hostname", "Failed to find host bounds", "cuInit"):
        assert misleading not in err, misleading


def test_progress_prints_elapsed_time_every_interval():
    import io
    import time

    from axlearn.common.aot_compilation import Progress

    out = io.StringIO()
    with Progress("Compiling x for v5p-8 x1", interval_s=0.2, out=out) as p:
        time.sleep(0.7)
    lines = out.getvalue().splitlines()
    assert lines[0] == "Compiling x for v5p-8 x1 ..."
    assert 2 <= sum(line.startswith("  ... Compiling x for v5p-8 x1: ") for line in lines) <= 4
    assert lines[-1] == f"Compiling x for v5p-8 x1: done in {p.seconds:.1f} s"
    assert 0.7 <= p.seconds < 5


def test_a_topology_no_mesh_rule_names_is_one_error_line(capsys):
    """gpt-tiny names no rule for one v5p-16 slice: refused before building, in one line."""
    assert main(["aot", *TINY, "--topology=v5p-16"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "axlearn aot: error: --mesh_selector=tpu-v5p-16 matches none of text.gpt.tiny:gpt-tiny's "
        "mesh_rules ["
    )
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unknown_remat_lists_the_choices(capsys):
    assert main(["aot", *TINY, "--topology=v5p-8", "--remat=most"]) == 1
    assert (
        "axlearn aot: error: --remat='most' is not a remat choice; choose one of none, "
        "save_matmuls, save_context, full." in capsys.readouterr().err
    )


@pytest.mark.slow
def test_remat_all_reports_every_choice(tmp_path, capsys):
    code = run_aot_compilation.main(
        [
            "run_aot_compilation",
            *TINY,
            "--topology=v5p-8",
            "--remat=all",
            f"--report={tmp_path}/r.json",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    table = out[out.index("Compiled memory per chip by remat choice:") :].splitlines()
    assert table[1].split() == ["remat", "temporaries", "total", "fits"]
    rows = {line.split()[0]: line.split() for line in table[2:6]}
    assert list(rows) == ["none", "save_matmuls", "save_context", "full"]
    temps = {}
    for name, row in rows.items():
        report = json.loads((tmp_path / f"r-remat_{name}.json").read_text())
        assert report["config"] == f"text.gpt.tiny:gpt-tiny (remat {name})" and report["fits"]
        temps[name] = report["memory"]["temp_bytes"]
        assert row[-1] == "yes"
    # Saving less keeps fewer activations for the backward pass.
    assert temps["full"] < temps["none"] and temps["save_context"] < temps["save_matmuls"]


@pytest.mark.slow
def test_ctrl_c_while_compiling_is_one_line_and_exit_130(tmp_path):
    """Issue 55 case 7: Ctrl-C during `axlearn aot`'s compile prints one line and exits 130,
    without a KeyboardInterrupt traceback or libtpu's dump of every thread."""
    import select  # pylint: disable=import-outside-toplevel
    import signal  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "axlearn.cli.main", "aot", *TINY, "--topology=v5p-8"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # A non-interactive parent may ignore SIGINT; a terminal's child does not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    err = ""
    try:
        deadline = time.monotonic() + 600
        while "Compiling the train step" not in err and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 1)[0]:
                line = proc.stderr.readline()
                if not line:
                    break
                err += line
        time.sleep(1.0)  # Inside XLA's compile.
        proc.send_signal(signal.SIGINT)
        err += proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Compiling the train step" in err, err[-4000:]
    assert proc.returncode == 130, err[-4000:]
    assert err.strip().splitlines()[-1] == (
        "axlearn aot: interrupted (Ctrl-C) before the report was written; nothing was saved. "
        "Rerun the same command to compile again."
    )
    for dump in ("Traceback", "KeyboardInterrupt", "*** SIG", "Stack trace", "PC: "):
        assert dump not in err, err[-4000:]
