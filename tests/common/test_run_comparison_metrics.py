"""Tests axlearn/common/run_comparison_metrics.py: the rows of what the runs logged."""

import json
import os

from axlearn.common import run_comparison, run_comparison_format
from axlearn.common.run_comparison_metrics import eval_records, trainable_parameters
from tests.common.run_comparison_testdata import run_path


def _write_run(root, name, *, trainable, accuracy, eval_accuracy, eval_steps=(0, 3)):
    path = root / name
    (path / "summaries" / "validation" / "jsonl").mkdir(parents=True)
    records = [
        {"step": s, "loss": 0.7 - 0.1 * s, "model/rewards/accuracy": accuracy * s / 3}
        for s in (1, 2, 3)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "model_parameters.txt").write_text(
        f"Model parameters: 1,000\nTrainable parameters: {trainable:,} of 1,000 (x%); frozen: 0\n"
    )
    evals = [
        {"step": s, "loss": 0.7, "rewards/accuracy": eval_accuracy * s / 3} for s in eval_steps
    ]
    (path / "summaries" / "validation" / "jsonl" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in evals) + "{torn\n"
    )
    return str(path)


def test_post_training_rows(tmp_path):
    a = _write_run(tmp_path, "full", trainable=1000, accuracy=0.75, eval_accuracy=0.5)
    b = _write_run(tmp_path, "lora", trainable=64, accuracy=1.0, eval_accuracy=0.25)
    runs = [run_comparison.load_run(a), run_comparison.load_run(b)]
    assert trainable_parameters(runs[1]) == 64
    assert sorted(eval_records(runs[0])["validation"]) == [0, 3]
    comparison = run_comparison.compare_runs(runs)
    keys = [row.spec.key for row in comparison.rows]
    assert keys.index("trainable_parameters") == keys.index("parameters") + 1
    assert comparison.row("trainable_parameters").values == [1000, 64]
    row = comparison.row("metric:model/rewards/accuracy")
    assert row.spec.title == "DPO reward accuracy @ 3" and row.values == [0.75, 1.0]
    assert row.diffs[1].verdict == run_comparison.IMPROVED
    row = comparison.row("eval:validation:rewards/accuracy")
    assert row.spec.title == "validation rewards/accuracy @ 3" and row.values == [0.5, 0.25]
    assert row.diffs[1].verdict == run_comparison.REGRESSED
    text = run_comparison_format.format_text(comparison)
    assert "DPO reward accuracy @ 3" in text and "validation loss @ 3" in text
    assert "GRPO mean reward" not in text  # No run logged it.


def test_eval_rows_need_a_shared_step(tmp_path):
    a = _write_run(tmp_path, "a", trainable=10, accuracy=1.0, eval_accuracy=1.0, eval_steps=(0,))
    b = _write_run(tmp_path, "b", trainable=10, accuracy=1.0, eval_accuracy=1.0, eval_steps=(3,))
    os.remove(os.path.join(b, "model_parameters.txt"))
    comparison = run_comparison.compare_runs([run_comparison.load_run(p) for p in (a, b)])
    keys = [row.spec.key for row in comparison.rows]
    assert not any(k.startswith("eval:") for k in keys)
    assert comparison.row("trainable_parameters").values == [10, None]


def test_recorded_lm_runs_get_no_post_training_rows():
    runs = [run_comparison.load_run(run_path(n)) for n in ("lr3e-3", "lr1e-3")]
    keys = [row.spec.key for row in run_comparison.compare_runs(runs).rows]
    assert not any(k.startswith("metric:") for k in keys)
