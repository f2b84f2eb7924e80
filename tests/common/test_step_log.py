"""Tests axlearn/common/step_log.py."""

import pytest

from axlearn.common import step_log


def test_step_throughput_by_hand():
    got = step_log.step_throughput(
        wall_s=0.5,
        num_devices=4,
        tokens_per_step=2048,
        real_tokens=1024,
        flops_per_step=4e12,
        peak_flops_per_device=10e12,
    )
    assert got["tokens_per_s_per_device"] == 2048 / 0.5 / 4 == 1024
    assert got["real_tokens_per_s_per_device"] == 512
    assert got["tflops_per_device"] == pytest.approx(2.0)  # 4e12 / 0.5 / 4
    assert got["mfu"] == pytest.approx(0.2)
    bare = step_log.step_throughput(wall_s=1.0, num_devices=1, tokens_per_step=10)
    assert bare == {"tokens_per_s_per_device": 10.0}
    with pytest.raises(ValueError, match="wall_s"):
        step_log.step_throughput(wall_s=0.0, num_devices=1, tokens_per_step=1)


def test_format_step_line_full():
    record = dict(
        step=12,
        max_step=100,
        loss=5.43211,
        learning_rate=1e-3,
        gradient_norm=0.8531,
        consumed_tokens=6144,
        step_time_s=0.1623,
        overheads={"input": 0.0012, "summary": 0.0},
        excluded_reason=None,
        tflops_per_device=0.198,
        tokens_per_s_per_device=3160.0,
        real_tokens_per_s_per_device=3010.0,
        mfu=0.0843,
        eta_s=14.2,
    )
    assert step_log.format_step_line(record) == (
        "step 12/100 | loss 5.4321 | lr 1.00e-03 | grad_norm 0.8531 | tokens 6.14K | "
        "0.162 s (input 0.001 s) | 0.198 TFLOP/s/device | 3.16K tok/s/device (real 3.01K) | "
        "MFU 8.4% | ETA 14 s"
    )


def test_format_step_line_compile_and_loss_scale():
    record = dict(
        step=1,
        max_step=float("inf"),
        loss=float("nan"),
        step_time_s=12.5,
        overheads={"compile": 12.0},
        excluded_reason="compile",
        loss_scale=65536.0,
        skipped_steps=2,
        nonfinite_steps=1,
    )
    assert step_log.format_step_line(record) == (
        "step 1 [compile, not in averages] | loss nan | 12.500 s (compile 12.000 s) | "
        "loss_scale 65536 | skipped 2 | nan 1"
    )


@pytest.mark.parametrize(
    "seconds,text",
    [(5.4, "5 s"), (185, "3m05s"), (7620, "2h07m"), (97200, "1d03h"), (float("inf"), "n/a")],
)
def test_format_duration(seconds, text):
    assert step_log.format_duration(seconds) == text


def test_format_step_line_checkpoint_split():
    record = dict(
        step=20,
        max_step=100,
        step_time_s=2.5,
        overheads={"checkpoint": 2.25},
        excluded_reason="checkpoint",
        checkpoint=dict(
            blocking_s=2.25,
            snapshot_s=0.25,
            wait_for_previous_s=1.875,
            other_s=0.125,
            input_position_s=0.0625,
            snapshot="partial (3 of 8 leaves, 6.20 GB of 12.53 GB on the device)",
            previous_write_gb_per_s=1.5,
        ),
    )
    assert step_log.format_step_line(record) == (
        "step 20/100 [checkpoint, not in averages] | 2.500 s (checkpoint 2.250 s [snapshot "
        "0.250 s (partial (3 of 8 leaves, 6.20 GB of 12.53 GB on the device)), waiting for the "
        "previous save 1.875 s (its write ran at 1.5 GB/s), rest 0.125 s (input position "
        "0.062 s)])"
    )
