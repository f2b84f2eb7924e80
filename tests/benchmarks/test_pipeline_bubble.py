"""benchmarks/pipeline_bubble.py: one small case per schedule (compiled temp memory, timing) and
the ratio summary, checked against the schedule formulas."""

import os
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import pipeline_bubble  # noqa: E402  pylint: disable=wrong-import-position


def test_summarize_ratios_against_gpipe():
    rows = [
        dict(schedule="GPipeSchedule", num_microbatches=16, compiled_temp_bytes=100),
        dict(schedule="OneFOneBSchedule", num_microbatches=16, compiled_temp_bytes=40),
        dict(schedule="gpipe", fit_s_per_microbatch=1.0),
    ]
    assert pipeline_bubble.summarize(rows) == {
        "GPipeSchedule": {"16": 1.0},
        "OneFOneBSchedule": {"16": 0.4},
    }


@pytest.mark.parametrize("v", [1, 2])
def test_fit_bubble_recovers_tick_time_and_formula(v):
    """Step times of (V M + S - 1) ticks fit back to the tick time and the formula exactly; a
    fixed extra cost per step shows as a fitted bubble above the formula."""
    s, t_tick, ms = 4, 0.25, [4, 8, 12, 16]
    times = [(v * m + s - 1) * t_tick for m in ms]
    fit = pipeline_bubble.fit_bubble(ms, times, num_stages=s, num_virtual_stages=v)
    assert fit["fit_s_per_tick"] == pytest.approx(t_tick)
    assert fit["fit_intercept_s"] == pytest.approx((s - 1) * t_tick)
    assert fit["intercept_over_formula"] == pytest.approx(1.0)
    for m in ms:
        row = fit["per_m"][m]
        assert row["formula_bubble"] == pytest.approx((s - 1) / (v * m + s - 1))
        assert row["fitted_bubble"] == pytest.approx(row["formula_bubble"])
        assert row["measured_bubble"] == pytest.approx(row["formula_bubble"])
    slower = pipeline_bubble.fit_bubble(
        ms, [t + 1.0 for t in times], num_stages=s, num_virtual_stages=v
    )
    assert slower["intercept_over_formula"] == pytest.approx(1 + 1.0 / ((s - 1) * t_tick))
    assert slower["per_m"][4]["fitted_over_formula"] > 1.4


@pytest.mark.slow
def test_1f1b_temp_memory_stays_flat_while_gpipe_grows(monkeypatch):
    """Small layers (dim 64): GPipe's temp memory grows with M, 1F1B's is bounded by its ring."""
    monkeypatch.setattr(pipeline_bubble, "DIM", 64)
    monkeypatch.setattr(pipeline_bubble, "MICROBATCH", 32)
    mesh = Mesh(np.asarray(jax.devices()[:4]), ("pipeline",))
    temps = {}
    for name in ("gpipe", "1f1b"):
        for m in (8, 16):
            fn, temps[(name, m)], schedule = pipeline_bubble._bubble_case(name, 1, m, mesh)
            assert schedule.bubble_fraction() == pytest.approx(3 / (m + 3))
            fn()
    assert temps[("gpipe", 16)] > 1.5 * temps[("gpipe", 8)]
    assert temps[("1f1b", 16)] < 0.5 * temps[("gpipe", 16)]
