"""Tests axlearn/common/run_comparison.py against recorded runs of the main job (gpt-tiny).

The recorded runs (tests/testdata/runs/README.md) were made on the shared 2-core development
machine while other work ran on it: their step times are as noisy as real ones.
"""

import json
import os
import shutil
import statistics

import numpy as np
import pytest

from axlearn.common import run_comparison as rc
from tests.common.run_comparison_testdata import run_path

STEP_ROWS = ("avg_step_s", "median_step_s", "tflops_per_device", "tokens_per_s_per_device")


def _load(*names):
    return [rc.load_run(run_path(n)) for n in names]


def _last_loss(name):
    """Independent reference: the last record's loss, read with plain json."""
    with open(os.path.join(run_path(name), "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return records[-1]["step"], records[-1]["loss"]


@pytest.mark.parametrize("pair", [("lr3e-3", "lr1e-3"), ("side_lr3e-3", "side_lr1e-3")])
def test_learning_rate_pair_final_loss_sign(pair):
    comparison = rc.compare_runs(_load(*pair))
    step_a, loss_a = _last_loss(pair[0])
    step_b, loss_b = _last_loss(pair[1])
    assert comparison.loss_step == step_a == step_b == 60
    row = comparison.row("final_loss")
    assert row.values == [loss_a, loss_b]
    diff = row.diffs[1]
    assert diff.absolute == pytest.approx(loss_b - loss_a)
    assert diff.absolute > 0  # The smaller learning rate ends with a higher loss after 60 steps.
    assert diff.verdict == rc.REGRESSED
    # The two configs differ in the learning rate only, and the comparison says so.
    assert any("configs differ" in w for w in comparison.warnings)


@pytest.mark.parametrize("pair", [("lr3e-3", "same2"), ("same2", "lr3e-3"), ("same_a", "same_b")])
def test_identical_configs_show_no_step_time_regression(pair):
    comparison = rc.compare_runs(_load(*pair))
    for key in STEP_ROWS:
        assert comparison.row(key).diffs[1].verdict in (rc.NOISE, rc.SAME), key
    assert not [t for _, t in comparison.regressions if "s/step" in t or "/s/" in t]
    assert comparison.row("final_loss").diffs[1].verdict == rc.SAME  # Deterministic training.
    assert comparison.row("config_hash").diffs[1].verdict == rc.SAME  # Only the dirs differ.
    assert not any("configs differ" in w for w in comparison.warnings)


def test_learning_rate_pair_side_by_side_step_times_within_noise():
    # Recorded at the same time, the learning rate does not change the speed: no verdict on it.
    comparison = rc.compare_runs(_load("side_lr3e-3", "side_lr1e-3"))
    assert not comparison.noise[1].significant
    assert comparison.row("median_step_s").diffs[1].verdict == rc.NOISE


def test_really_slower_run_is_a_regression():
    runs = _load("pair_fast", "pair_slow")
    ratio = statistics.median(runs[1].step_times()) / statistics.median(runs[0].step_times())
    assert ratio > 1.2  # Recorded side by side: model_dim 256 instead of 128.
    comparison = rc.compare_runs(runs)
    assert comparison.noise[1].significant, comparison.noise[1]
    assert comparison.row("median_step_s").diffs[1].verdict == rc.REGRESSED
    assert comparison.row("tokens_per_s_per_device").diffs[1].verdict == rc.REGRESSED
    # Reversed roles: the same difference is an improvement.
    assert rc.compare_runs(runs[::-1]).row("median_step_s").diffs[1].verdict == rc.IMPROVED


def test_recorded_noise_with_a_real_20_percent_slowdown():
    """Recorded step times of two same-config runs made side by side; one of them made 20% slower
    step by step (as a 20% slower build would be under the same load): flagged. Unchanged: not."""
    a, b = (r.step_times() for r in _load("same_a", "same_b"))
    assert not rc.step_time_noise_test(a, b).significant
    assert rc.step_time_noise_test(a, [1.2 * t for t in b]).significant
    assert rc.step_time_noise_test([1.2 * t for t in a], b).significant


def test_noise_test_on_synthetic_shifts():
    rng = np.random.default_rng(0)
    base = list(0.2 * np.exp(rng.normal(0, 0.05, 200)))
    same = list(0.2 * np.exp(rng.normal(0, 0.05, 200)))
    slower = [1.2 * x for x in same]
    assert not rc.step_time_noise_test(base, same).significant
    verdict = rc.step_time_noise_test(base, slower)
    assert verdict.significant and verdict.p_value < 1e-10
    # Consistent but tiny (2%) shift: the U test alone would flag it; the effect floor does not.
    tiny = [1.02 * x for x in base]
    assert not rc.step_time_noise_test(base, tiny, min_effect=0.05).significant
    assert "too few steps" in rc.step_time_noise_test(base[:3], same).reason


def test_machine_speed_difference_makes_step_times_incomparable():
    runs = _load("lr3e-3", "same2")
    pa, pb = (r.summary["peak"]["flops_per_s"] for r in runs)
    verdict = rc.machine_speed_verdict(*runs)
    if abs(pb - pa) / pa > rc.MACHINE_SPEED_TOLERANCE:
        assert verdict is not None and "not comparable" in verdict.reason
    else:
        assert verdict is None
    assert rc.machine_speed_verdict(runs[0], runs[0]) is None


def test_partial_run_is_compared_on_what_exists(tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(run_path("lr3e-3"), partial)
    os.remove(partial / "run_summary.json")
    lines = (partial / "metrics.jsonl").read_text().splitlines()
    (partial / "metrics.jsonl").write_text("\n".join(lines[:40]) + "\n" + lines[40][:25])
    run = rc.load_run(str(partial))
    assert run.summary is None and run.last_step == 40
    assert any("no run_summary.json" in n for n in run.notes)
    assert any("last line incomplete" in n for n in run.notes)
    comparison = rc.compare_runs([rc.load_run(run_path("lr3e-3")), run])
    assert comparison.loss_step == 40
    assert any("different lengths" in w for w in comparison.warnings)
    assert comparison.row("parameters").values[1] is None


def test_not_a_run_names_what_is_missing(tmp_path):
    with pytest.raises(
        rc.NotARunError, match="no run_summary.json, metrics.jsonl or trainer_config"
    ):
        rc.load_run(str(tmp_path))
    with pytest.raises(rc.NotARunError, match="does not exist"):
        rc.load_run(str(tmp_path / "nope"))


def test_no_common_steps(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, steps in ((a, range(1, 5)), (b, range(10, 15))):
        d.mkdir()
        (d / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in steps)
        )
    with pytest.raises(rc.NoCommonStepsError, match="no step in common"):
        rc.compare_runs([rc.load_run(str(a)), rc.load_run(str(b))])


def test_bad_arguments():
    runs = _load("lr3e-3")
    with pytest.raises(ValueError, match="at least two runs"):
        rc.compare_runs(runs)
    with pytest.raises(ValueError, match="Baseline index 5"):
        rc.compare_runs(runs * 2, baseline=5)


def test_a_timing_from_too_few_samples_is_never_regressed(tmp_path):
    """Issue 29 case 14: identical code whose eval time (2 evals per run) differs by +23% is
    within noise (too few samples), not REGRESSED; with 3 evals per run the verdict stands."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(run_path("same_a"), a)
    shutil.copytree(run_path("same_a"), b)
    for run in (b,):
        summary = json.loads((run / "run_summary.json").read_text())
        summary["overhead_totals_s"]["eval"] *= 1.23
        (run / "run_summary.json").write_text(json.dumps(summary))
    comparison = rc.compare_runs([rc.load_run(str(a)), rc.load_run(str(b))])
    diff = comparison.row("overhead_eval_s").diffs[1]
    assert diff.percent == pytest.approx(23.0)
    assert diff.verdict == rc.NOISE and "2 sample(s): too few" in diff.note
    assert not [t for _, t in comparison.regressions if "Eval" in t]
    # The same difference measured at 3 evals in each run is a regression.
    for run in (a, b):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        records[9]["perf/overhead/eval"] = 1.0
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    comparison = rc.compare_runs([rc.load_run(str(a)), rc.load_run(str(b))])
    assert comparison.row("overhead_eval_s").diffs[1].verdict == rc.REGRESSED


def test_runs_of_different_lengths_compare_overheads_per_step(tmp_path):
    """Issue 38: a 60-step and a 20-step run of one config paying the same overhead per step are
    not called "better" for their smaller totals: overhead rows (but compile, paid once) become
    seconds per step, the output says so, and the timing rows' sample rule is printed."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.run_comparison_format import format_text

    long, short = tmp_path / "long", tmp_path / "short"
    shutil.copytree(run_path("same_a"), long)
    shutil.copytree(run_path("same_a"), short)
    lines = (short / "metrics.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["step"] <= 20]
    (short / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    summary = json.loads((short / "run_summary.json").read_text())
    totals = summary["overhead_totals_s"]
    for kind in ("input", "checkpoint", "eval"):
        totals[kind] *= 20 / 60  # The same cost per step.
    totals["eval"] *= 1.23  # Measured from too few evals to be called worse.
    (short / "run_summary.json").write_text(json.dumps(summary))
    comparison = rc.compare_runs([rc.load_run(str(long)), rc.load_run(str(short))])
    row = comparison.row("overhead_input_s")
    assert row.spec.title == "Input wait s per step"
    assert row.values[0] == pytest.approx(totals["input"] * 3 / 60)
    assert row.values[1] == pytest.approx(totals["input"] / 20)
    assert row.diffs[1].verdict in (rc.SAME, rc.NOISE)
    assert comparison.row("overhead_compile_s").spec.title == "Compile s"  # Paid once per run.
    assert not [t for _, t in comparison.regressions]
    text = format_text(comparison)
    assert "overhead rows but compile are seconds per step" in text
    assert "measured at least 3 times in each run; fewer is noise" in text
    assert "Eval s per step, short: 0 sample(s): too few to tell (needs 3 per run)." in text
    improved = [r.spec.title for r in comparison.rows if r.diffs[1] and "overhead" in r.spec.key]
    assert all(
        comparison.row(k).diffs[1].verdict != rc.IMPROVED
        for k in ("overhead_input_s", "overhead_checkpoint_s", "overhead_eval_s")
    ), improved


# The direction of every row: "lower" or "higher" is better, None has none (issue 55 case 5:
# eval and checkpoint seconds are better when lower).
_DIRECTIONS = {
    "parameters": None,
    "final_loss": "lower",
    "tflops_per_device": "higher",
    "tokens_per_s_per_device": "higher",
    "avg_step_s": "lower",
    "median_step_s": "lower",
    "mfu_pct": "higher",
    "machine_gflops": None,
    "memory_pct": "lower",
    "peak_memory_bytes": "lower",
    "overhead_compile_s": "lower",
    "overhead_eval_s": "lower",
    "overhead_checkpoint_s": "lower",
    "overhead_input_s": "lower",
    "goodput_pct": "higher",
    "failed_attempts": "lower",
    "goodput_productive_s": None,
    "goodput_redone_s": "lower",
    "goodput_startup_s": "lower",
    "goodput_idle_s": "lower",
    "steps": None,
    "jax_version": None,
    "device_kind": None,
    "device_count": None,
    "git_commit": None,
    "config_hash": None,
}


def test_every_row_has_its_direction_and_lower_seconds_are_better():
    assert {row.key: row.better for row in rc.ROWS} == _DIRECTIONS
    for row in rc.ROWS:
        if row.better is None:
            continue
        base, better, worse = (1.0, 0.5, 2.0) if row.better == "lower" else (1.0, 2.0, 0.5)
        plain = rc.dataclasses.replace(row, noise=False, tolerance=0.0, abs_tolerance=0.0)
        assert rc._diff(plain, base, better, None).verdict == rc.IMPROVED, row.key
        assert rc._diff(plain, base, worse, None).verdict == rc.REGRESSED, row.key


def test_a_resumed_run_is_compared_over_every_attempt(tmp_path):
    """Issue 55 case 5: run_summary.json covers only the last attempt (steps 9-12 here); the
    per-step and overhead rows come from metrics.jsonl's records of every attempt and goodput
    from the events of both attempts, and the notes say which."""
    from tests.common.test_goodput import _LAUNCHER, _process_events, _write

    runs = []
    for name, eval_s in (("plain", (0.5, 0.5)), ("resumed", (13.3, 92.1))):
        d = tmp_path / name
        d.mkdir()
        records = []
        for step in range(1, 13):
            record = {"step": step, "loss": 10.0 / step, "perf/step_time_s": 0.1 * step}
            record["excluded_reason"] = ""
            if step in (4, 12):
                record["perf/overhead/eval"] = eval_s[step == 4]
            records.append(record)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        first = 9 if name == "resumed" else 1
        summary = {
            "steps": {"first": first, "last": 12},
            "metrics": {"avg_step_s": {"value": 99.0}},
            "overhead_totals_s": {"eval": eval_s[0] if name == "resumed" else sum(eval_s)},
        }
        (d / "run_summary.json").write_text(json.dumps(summary))
        if name == "resumed":
            _write(str(d / "events" / "process_0.jsonl"), _process_events())
            _write(str(d / "events" / "launcher.jsonl"), _LAUNCHER)
        runs.append(rc.load_run(str(d)))
    plain, resumed = runs
    assert not plain.summary_is_partial and resumed.summary_is_partial
    comparison = rc.compare_runs(runs)
    all_steps = statistics.mean(0.1 * s for s in range(1, 13))
    avg = comparison.row("avg_step_s").values
    assert avg[0] == 99.0 and avg[1] == pytest.approx(all_steps)  # Not the summary's 99.
    evals = comparison.row("overhead_eval_s")
    assert evals.values == [pytest.approx(1.0), pytest.approx(13.3 + 92.1)]
    assert evals.diffs[1].verdict != rc.IMPROVED  # More eval seconds is never "better".
    # Goodput of both attempts, from the events: what `axlearn goodput` reports for the run
    # (its productive seconds over its wall time), not the last attempt's summary.
    from axlearn.common import goodput  # pylint: disable=import-outside-toplevel

    report = goodput.compute_goodput(str(tmp_path / "resumed"))
    assert len(report.attempts) == 2
    want = 100 * report.parts["productive"] / report.wall_s
    assert comparison.row("goodput_pct").values[1] == pytest.approx(want)
    assert comparison.row("failed_attempts").values[1] == 1
    notes = " | ".join(comparison.warnings)
    assert "resumed: run_summary.json covers steps 9-12 (the last attempt)" in notes
    assert "computed from the 12 records of every attempt in metrics.jsonl (steps 1-12)" in notes
    assert "resumed: goodput rows from the events of all 2 attempt(s)" in notes
