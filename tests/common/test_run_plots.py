"""Tests axlearn/common/run_plots.py: one PNG per quantity, one line per run."""

import os

import numpy as np
import pytest

from axlearn.common import run_comparison as rc
from axlearn.common import run_plots
from tests.common.run_comparison_testdata import run_path

# matplotlib's first two default line colors (C0, C1), as RGB in [0, 1].
C0 = np.array([0x1F, 0x77, 0xB4]) / 255
C1 = np.array([0xFF, 0x7F, 0x0E]) / 255


def _pixels_near(image, color, tol=0.03):
    return int((np.abs(image[..., :3] - color).max(axis=-1) < tol).sum())


def test_plot_runs(tmp_path):
    import matplotlib.image

    runs = [rc.load_run(run_path("lr3e-3")), rc.load_run(run_path("lr1e-3"))]
    paths = run_plots.plot_runs(runs, str(tmp_path))
    names = {os.path.basename(p) for p in paths}
    assert {"loss.png", "learning_rate.png", "gradient_norm.png", "step_time.png"} <= names
    assert any(n.startswith("eval_validation_") for n in names), names
    for path in paths:
        image = matplotlib.image.imread(path)
        assert image.shape[:2] == (400, 700)
        # Not blank, and each run's line (its own color) is drawn; on eval charts whose values
        # are the same for both runs (e.g. the number of eval batches) the second line covers the
        # first.
        assert (image[..., :3] < 0.9).any()
        assert _pixels_near(image, C1) > 50, path
        if not os.path.basename(path).startswith("eval_"):
            assert _pixels_near(image, C0) > 50, path


def test_single_run_draws_one_color(tmp_path):
    import matplotlib.image

    paths = run_plots.plot_runs([rc.load_run(run_path("lr3e-3"))], str(tmp_path))
    image = matplotlib.image.imread(paths[0])
    assert _pixels_near(image, C0) > 50
    assert _pixels_near(image, C1) == 0


def test_eval_scalars_from_events():
    scalars = run_plots.read_eval_scalars(run_path("lr3e-3"))
    assert "validation" in scalars
    steps = {s for points in scalars["validation"].values() for s, _ in points}
    assert steps == {30, 60}


@pytest.mark.slow  # A subprocess importing TensorFlow (~23 s on the shared machine).
def test_reading_events_logs_no_deprecation_warning():
    """Issue 55 case 6: `axlearn compare` printed TF's `tf_record_iterator is deprecated`."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = (
        "from axlearn.common import run_plots\n"
        f"s = run_plots.read_eval_scalars({run_path('lr3e-3')!r})\n"
        "print(sorted({st for p in s['validation'].values() for st, _ in p}))\n"
    )
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[30, 60]"
    assert "deprecat" not in proc.stderr.lower(), proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if line[:2] in ("E0", "W0")]
