"""Tests axlearn/common/run_plots.py: one PNG per quantity, one line per run."""

import os

import numpy as np

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
