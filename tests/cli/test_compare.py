"""Tests axlearn/cli/compare.py: `axlearn compare` end to end."""

import json
import os
import shutil

import pytest

from axlearn.cli.main import main
from tests.common.run_comparison_testdata import run_path


def test_compare_text_and_markdown(tmp_path, capsys):
    assert main(["compare", run_path("lr3e-3"), run_path("lr1e-3")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "Metric",
        "lr3e-3",
        "(baseline)",
        "lr1e-3",
        "Diff",
        "lr1e-3",
    ]
    assert "Final loss compared at step 60." in out
    out_file = tmp_path / "t.md"
    argv = ["compare", run_path("lr3e-3"), run_path("lr1e-3"), "--format=markdown"]
    assert main([*argv, f"--output={out_file}", "--label=main", "--label=branch"]) == 0
    assert out_file.read_text().startswith("| Metric | main (baseline) | branch | Diff branch |")


def test_compare_baseline_by_label(capsys):
    argv = ["compare", run_path("lr3e-3"), run_path("lr1e-3"), "--baseline=lr1e-3", "--format=json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["baseline"] == "lr1e-3"


def test_compare_html_with_plots(tmp_path, capsys):
    out = tmp_path / "report.html"
    argv = ["compare", run_path("lr3e-3"), run_path("lr1e-3"), "--format=html"]
    assert main([*argv, f"--output={out}", f"--plot={tmp_path / 'charts'}"]) == 0
    page = out.read_text()
    assert page.count("data:image/png;base64,") == len(os.listdir(tmp_path / "charts")) >= 5


def test_compare_suites(tmp_path, capsys):
    for suite, names in (("main", ("lr3e-3", "pair_fast")), ("branch", ("same2", "pair_slow"))):
        for case, name in zip(("01_main_job", "02_speed"), names):
            shutil.copytree(run_path(name), tmp_path / suite / case)
    (tmp_path / "branch" / "03_only_here").mkdir()
    assert main(["compare", "--suite", str(tmp_path / "main"), str(tmp_path / "branch")]) == 0
    out = capsys.readouterr().out
    assert "== 01_main_job ==" in out and "== 02_speed ==" in out
    summary = out.split("== Summary ==")[1]
    assert "01_main_job: no regression" in summary
    assert "02_speed: REGRESSED: " in summary and "Median s/step" in summary
    assert "Cases in one suite only: 03_only_here" in summary


@pytest.mark.parametrize(
    "argv,match",
    [
        (["/nonexistent/run", "RUN"], "does not exist"),
        (["EMPTY", "RUN"], "is not a run directory"),
        (["RUN", "RUN", "--format=xml"], "Unknown --format='xml'"),
        (["RUN"], "at least two run directories"),
        (["RUN", "RUN", "--baseline=nope"], "--baseline='nope' is none of the runs"),
        (["RUN", "RUN", "--label=a"], "--label given 1 times for 2 runs"),
    ],
)
def test_bad_input(argv, match, tmp_path, capsys):
    argv = [{"RUN": run_path("lr3e-3"), "EMPTY": str(tmp_path)}.get(a, a) for a in argv]
    assert main(["compare", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("axlearn compare: error: ") and match in err
