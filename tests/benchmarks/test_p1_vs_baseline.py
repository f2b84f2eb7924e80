"""benchmarks/p1_vs_baseline.py: the interleaved summary's medians and ratios, and its refusals."""

import os
import statistics
import subprocess
import sys

import pytest

from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import p1_vs_baseline  # noqa: E402  pylint: disable=wrong-import-position


def _runs(current, baseline):
    def rows(times):
        return [dict(reported_median_s=t, external_median_s=2 * t) for t in times]

    return dict(current=rows(current), baseline=rows(baseline))


def test_summary_medians_and_ratios():
    # Round 2 ran under load on both sides: the paired ratio ignores it, the medians do not.
    current, baseline = [0.21, 0.60, 0.22], [0.20, 0.50, 0.22]
    out = p1_vs_baseline.summarize(_runs(current, baseline))
    assert out["current_reported_median_s"] == 0.22
    assert out["baseline_reported_median_s"] == 0.22
    assert out["ratio_reported_current_over_baseline"] == pytest.approx(1.0)
    expected = statistics.median(c / b for c, b in zip(current, baseline))
    assert out["ratio_reported_median_of_rounds"] == pytest.approx(expected) == pytest.approx(1.05)
    assert out["current_external_median_s"] == pytest.approx(0.44)
    assert out["ratio_external_median_of_rounds"] == pytest.approx(1.05)
    with pytest.raises(ValueError, match="2 current and 1 baseline runs"):
        p1_vs_baseline.summarize(_runs([1, 1], [1]))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--baseline", "/nonexistent"], "--baseline='/nonexistent' is not a checkout"),
        (["--baseline", REPO_ROOT, "--rounds", "2"], "--rounds=2: use at least 3"),
    ],
)
def test_bad_arguments_are_one_line(args, message):
    script = os.path.join(REPO_ROOT, "benchmarks", "p1_vs_baseline.py")
    out = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 1 and out.stderr.strip().startswith(message), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
