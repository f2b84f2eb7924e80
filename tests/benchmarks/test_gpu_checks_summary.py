"""benchmarks/gpu_checks_summary.py on hand-written part JSONs whose headline numbers are known."""

import json
import os
import subprocess
import sys

from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import gpu_checks_summary  # noqa: E402  pylint: disable=wrong-import-position

SAVE50 = dict(
    device="NVIDIA H100 80GB HBM3",
    step_s=0.25,
    mfu=0.45,
    checkpoint=dict(
        save_every=50,
        saves=2,
        blocking_per_save_s=dict(median=0.004, max=0.005),
        non_save_step_ratio=1.01,
        non_save_step_mean_ratio=1.015,
        saves_that_waited=0,
        write_gb_per_s=dict(median=2.5, max=3.0),
        snapshot=dict(mode="device"),
        # Steps 10 and 12 follow saves (0.3 and 0.275 s); the non-save median is 0.25 s.
        step_times_first_save_arm=[
            [8, 0.25, False],
            [9, 0.01, True],
            [10, 0.3, False],
            [11, 0.02, True],
            [12, 0.275, False],
            [13, 0.24, False],
            [14, 0.25, False],
        ],
    ),
)
SWEEP = dict(
    grid=[
        dict(
            batch=16,
            remat="save_matmuls",
            chunk=1024,
            flag_set="none",
            fits=True,
            s_per_step=0.5,
            mfu=0.5,
            tokens_per_s=65536.0,
        ),
        dict(
            batch=32,
            remat="save_matmuls",
            chunk=1024,
            flag_set="none",
            fits=False,
            error="out of device memory: RESOURCE_EXHAUSTED",
        ),
    ],  # fmt: skip
    fastest_vs_plain_jax=dict(
        config=dict(batch=16),
        rounds=[dict(trainer={}, plain_jax={})],
        ratio_trainer_over_plain=0.99,
        trainer_mfu=0.5,
        plain_jax_mfu=0.49,
    ),
    fp8_vs_bf16=dict(
        ratio_fp8_over_bf16_tokens_per_s=1.25,
        fp8_tokens_per_s=81920.0,
        bf16_tokens_per_s=65536.0,
        fp8_loss_mean_measured=10.12345,
        bf16_loss_mean_measured=10.12,
        fp8_matmuls=60,
        fp8_matmuls_with_amax=60,
        fp8_peak_memory_bytes=70e9,
        fp8_errors=["timed out after 85 s"],
    ),
)


def test_after_save_ratio():
    assert gpu_checks_summary.after_save_ratio(
        SAVE50["checkpoint"]["step_times_first_save_arm"]
    ) == (0.3 / 0.25)
    assert gpu_checks_summary.after_save_ratio([[4, 0.2, False]]) is None


def test_summary_lines(tmp_path):
    # --rounds 0 (the trace part): no comparison line.
    assert gpu_checks_summary.sweep_lines("trace", dict(fastest_vs_plain_jax=dict(rounds=[]))) == []
    (tmp_path / "save50.json").write_text(json.dumps(SAVE50))
    (tmp_path / "sweep.json").write_text(json.dumps(SWEEP))
    (tmp_path / "save5.json").write_text('{"device": ')  # Killed mid-print.
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "benchmarks", "gpu_checks_summary.py"), tmp_path],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.splitlines() == [
        "save50: NVIDIA H100 80GB HBM3: step 0.25 s, MFU 45.0%",
        "save50: 2 saves every 50: blocking per save max 0.005 s (0.02 steps); non-save steps "
        "with/without saves: median ratio 1.01, mean ratio 1.015; slowest step after a save / "
        "median step 1.2",
        "save50: saves that waited 0, write 2.5 GB/s (median), snapshot device",
        "sweep: b16 save_matmuls c1024 none: 0.5 s/step, MFU 50.0%, 65536 tokens/s",
        "sweep: b32 save_matmuls c1024 none: fits False: out of device memory: RESOURCE_EXHAUSTED",
        "sweep: fastest {'batch': 16}: trainer/plain JAX 0.99 (trainer MFU 50.0%, plain JAX 49.0%)",
        "sweep: fp8/bf16 tokens/s 1.25 (81920 vs 65536); measured-step loss mean fp8 10.12345 vs "
        "bf16 10.12000; fp8 matmuls 60/60 ran; fp8 peak memory 70.00 GB",
        "sweep: fp8 run failed: timed out after 85 s",
        "save5: no complete JSON (11 bytes; see save5.err in logs.tgz)",
        "trace: no JSON (the part did not run)",
    ]
