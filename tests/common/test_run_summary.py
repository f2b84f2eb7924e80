"""Tests axlearn/common/run_summary.py."""

import json
import os

import pytest

from axlearn.common import run_summary
from axlearn.common.config import Configurable, config_class


def _records():
    return [
        dict(
            step=1,
            loss=4.0,
            step_time_s=10.0,
            overheads={"compile": 9.5, "input": 0.1},
            excluded_reason="compile",
            real_tokens=400,
        ),
        dict(
            step=2,
            loss=3.5,
            step_time_s=0.2,
            overheads={"input": 0.1},
            excluded_reason=None,
            real_tokens=400,
        ),
        dict(
            step=3,
            loss=3.0,
            step_time_s=2.4,
            overheads={"eval": 2.2},
            excluded_reason="eval",
            real_tokens=400,
        ),
        dict(
            step=4, loss=2.5, step_time_s=0.3, overheads={}, excluded_reason=None, real_tokens=300
        ),
        dict(
            step=5,
            loss=2.0,
            step_time_s=0.25,
            overheads={"checkpoint": 0.05},
            excluded_reason="checkpoint",
            real_tokens=400,
        ),
    ]


def test_build_run_summary_by_hand(tmp_path):
    summary = run_summary.build_run_summary(
        _records(),
        num_params=1234,
        num_devices=2,
        tokens_per_step=512,
        flops_per_step=1e12,
        peak=dict(flops_per_s=10e12, source="table"),
        memory=[
            dict(peak_fraction=0.25, peak_bytes_in_use=4e9),
            dict(peak_fraction=0.5, peak_bytes_in_use=8e9),
        ],
        environment=dict(
            jax_version="0.x", device_kind="cpu", device_count=2, platform="cpu", process_count=1
        ),
        git=dict(commit="abc", dirty=True),
        config_digest="sha256:00",
    )
    m = {k: v["value"] for k, v in summary["metrics"].items()}
    avg = (0.2 + 0.3) / 2  # Steps 2 and 4; 1 (compile), 3 (eval), 5 (checkpoint) excluded.
    assert m["avg_step_s"] == pytest.approx(avg)
    assert m["wall_s_per_step_all"] == pytest.approx((10 + 0.2 + 2.4 + 0.3 + 0.25) / 5)
    assert m["tokens_per_s_per_device"] == pytest.approx(512 / avg / 2)
    assert m["real_tokens_per_s_per_device"] == pytest.approx(350 / avg / 2)
    assert m["tflops_per_device"] == pytest.approx(1.0 / avg / 2)
    assert m["mfu"] == pytest.approx(1e12 / avg / 2 / 10e12)
    assert m["memory_pct"] == pytest.approx(50.0)
    assert m["final_loss"] == 2.0 and m["parameters"] == 1234
    assert summary["steps"]["excluded"] == {"compile": [1], "eval": [3], "checkpoint": [5]}
    assert summary["overhead_totals_s"] == pytest.approx(
        {"compile": 9.5, "input": 0.2, "eval": 2.2, "checkpoint": 0.05}
    )
    # Self-describing: every metric says its unit, direction and definition.
    for metric in summary["metrics"].values():
        assert set(metric) == {"value", "unit", "better", "definition"}
    assert "compile: 1; eval: 3; checkpoint: 5" in summary["metrics"]["avg_step_s"]["definition"]

    text = run_summary.format_run_summary(summary)
    assert "Average s/step       0.2500 over 2 of 5 steps; not averaged: compile [1]; " in text
    assert "MFU                  20.00% of 10 TFLOP/s (table)" in text
    assert "abc (uncommitted changes)" in text

    path = run_summary.write_run_summary(str(tmp_path), summary)
    assert path == os.path.join(str(tmp_path), "run_summary.json")
    with open(path, encoding="utf-8") as f:
        loaded = json.load(f)
    assert loaded["schema"] == "axlearn.run_summary/1"
    assert loaded["metrics"]["avg_step_s"]["value"] == pytest.approx(avg)


def test_nonfinite_values_become_null(tmp_path):
    records = [dict(step=1, loss=float("nan"), step_time_s=1.0, overheads={}, excluded_reason=None)]
    summary = run_summary.build_run_summary(
        records, num_params=1, num_devices=1, tokens_per_step=1, environment={}, git={}
    )
    path = run_summary.write_run_summary(str(tmp_path), summary)
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["metrics"]["final_loss"]["value"] is None


def test_config_hash_and_git_and_env():
    class Thing(Configurable):
        @config_class
        class Config(Configurable.Config):
            x: int = 1  # A field.

    a = Thing.default_config()
    b = Thing.default_config().set(x=2)
    assert run_summary.config_hash(a) == run_summary.config_hash(Thing.default_config())
    assert run_summary.config_hash(a) != run_summary.config_hash(b)
    assert run_summary.config_hash(a).startswith("sha256:")
    git = run_summary.git_commit()
    assert set(git) == {"commit", "dirty"}
    assert git["commit"] is None or len(git["commit"]) == 40
    env = run_summary.environment_info()
    assert env["device_count"] == 8 and env["platform"] == "cpu"


def test_ranges():
    assert run_summary._ranges([7, 1, 2, 3]) == "1-3, 7"  # pylint: disable=protected-access


def test_git_commit_outside_a_checkout_reads_the_image_env(tmp_path, monkeypatch):
    monkeypatch.delenv(run_summary.GIT_COMMIT_ENV, raising=False)
    assert run_summary.git_commit(str(tmp_path)) == {"commit": None, "dirty": None}
    monkeypatch.setenv(run_summary.GIT_COMMIT_ENV, "ab" * 20)
    assert run_summary.git_commit(str(tmp_path)) == {"commit": "ab" * 20, "dirty": None}


def test_checkpoint_summary_by_hand():
    records = [
        dict(step=1, step_time_s=1.0, overheads={}),
        dict(
            step=2,
            step_time_s=1.5,
            overheads={"checkpoint": 0.5},
            checkpoint=dict(
                blocking_s=0.5, snapshot_s=0.25, wait_for_previous_s=0.0, other_s=0.25,
                input_position_s=0.125, snapshot="device", waited=False,
            ),
        ),
        dict(
            step=4,
            step_time_s=3.0,
            overheads={"checkpoint": 2.0},
            checkpoint=dict(
                blocking_s=2.0, snapshot_s=0.25, wait_for_previous_s=1.5, other_s=0.25,
                input_position_s=0.125, snapshot="device", waited=True,
                previous_write_gb_per_s=1.25,
            ),
        ),
    ]  # fmt: skip
    summary = run_summary.checkpoint_summary(records, end_of_run_wait_s=0.75)
    assert summary == dict(
        saves=2,
        blocking_s=2.5,
        snapshot_s=0.5,
        wait_for_previous_s=1.5,
        other_s=0.5,
        input_position_s=0.25,
        median_blocking_s=1.25,
        max_blocking_s=2.0,
        saves_that_waited=1,
        snapshot=["device"],
        end_of_run_wait_s=0.75,
    )
    assert run_summary.format_checkpoint_summary(summary) == (
        "2 saves blocked 2.500 s: snapshot 0.500 s, waiting for the previous save 1.500 s, rest "
        "0.500 s (input position 0.250 s); per save median 1.250 s, max 2.000 s; 1 waited for "
        "the previous save; snapshot device; end-of-run wait 0.750 s"
    )
    full = run_summary.build_run_summary(
        records, num_params=1, num_devices=1, tokens_per_step=1, end_of_run_wait_s=0.75,
        environment={}, git={},
    )  # fmt: skip
    assert full["checkpoint"] == summary
    assert "Checkpoints" in run_summary.format_run_summary(full)
    assert run_summary.format_checkpoint_summary(run_summary.checkpoint_summary([])) == "no saves"


def test_one_config_hash_spelling_for_runs_in_other_dirs(tmp_path):
    """Issue 29 case 14: two runs of one config (different trainer dirs) print the same config
    hash, in the spelling `axlearn compare` shows (sha256: and 10 hex digits)."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common import run_comparison
    from tests.common import trainer_test_utils as tu

    a = tu.bigram_trainer_config(str(tmp_path / "a"))
    b = tu.bigram_trainer_config(str(tmp_path / "b"))
    digest = run_summary.config_hash(a)
    assert digest == run_summary.config_hash(b)
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 10
    assert int(digest[len("sha256:") :], 16) >= 0
    assert run_summary.config_hash(a.set(max_step=11)) != digest
    a.max_step = b.max_step
    # compare reads the run's dump file (with its trailing newline) and gets the same text.
    run = run_comparison.RunData(
        label="a",
        path=str(tmp_path / "a"),
        summary=None,
        records=[],
        config_dump=a.debug_string() + "\n",
        notes=[],
    )
    assert run_comparison._config_hash(run) == digest  # pylint: disable=protected-access
