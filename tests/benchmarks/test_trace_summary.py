"""benchmarks/trace_summary.py on a hand-built trace whose busy time, idle time and kernel kinds
are known."""

import gzip
import json
import os
import subprocess
import sys

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tests.benchmarks.no_tensorflow import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import trace_summary  # noqa: E402  pylint: disable=wrong-import-position

NS = 1000  # Picoseconds per nanosecond.


def _space() -> xplane_pb2.XSpace:
    space = xplane_pb2.XSpace()
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.stat_metadata[1].name = "hlo_op"
    names = {
        1: "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
        2: "loop_multiply_fusion",
        3: "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7",
        4: "MemcpyD2H",
        5: "loop_add_fusion",
    }
    for i, name in names.items():
        gpu.event_metadata[i].name = name

    def add(line, metadata_id, offset_ns, duration_ns, hlo_op=None):
        event = line.events.add(
            metadata_id=metadata_id, offset_ps=offset_ns * NS, duration_ps=duration_ns * NS
        )
        if hlo_op is not None:
            event.stats.add(metadata_id=1, str_value=hlo_op)

    compute = gpu.lines.add(name="Stream #13(Compute)", timestamp_ns=1000)
    add(compute, 1, 0, 100, "dot.7")  # [0, 100)
    add(compute, 2, 150, 50, "fusion.3")  # [150, 200)
    add(compute, 3, 250, 300, "custom-call.2")  # [250, 550)
    add(compute, 2, 550, 50, "fusion.3")  # [550, 600)
    copies = gpu.lines.add(name="Stream #14(MemcpyD2H)", timestamp_ns=1000)
    add(copies, 4, 50, 100)  # [50, 150): overlaps the GEMM and touches the fusion
    # A line derived from the kernels: ignored, or every kernel would count twice.
    derived = gpu.lines.add(name="XLA Ops", timestamp_ns=1000)
    add(derived, 5, 0, 600)
    host = space.planes.add(name="/host:CPU")
    host.event_metadata[1].name = "PjitFunction(train_step)"
    host.lines.add(name="python", timestamp_ns=0).events.add(metadata_id=1, duration_ps=10**9)
    return space


def test_busy_idle_and_kinds_of_a_known_trace(tmp_path):
    path = tmp_path / "t.xplane.pb.gz"
    with gzip.open(path, "wb") as f:
        f.write(_space().SerializeToString())
    summary = trace_summary.summarize_trace(str(path), steps=2, top=3)
    (gpu,) = summary["devices"]
    assert gpu["plane"] == "/device:GPU:0" and gpu["kernels"] == 5
    # Kernels cover [0, 200) and [250, 600): 550 ns busy of a 600 ns span.
    assert gpu["span_ms"] == pytest.approx(600e-6)
    assert gpu["busy_ms"] == pytest.approx(550e-6)
    assert gpu["idle_fraction"] == pytest.approx(50 / 600)
    # Summed kernel time counts the overlapping copy: 100 + 50 + 300 + 50 + 100 = 600 ns.
    assert gpu["kernel_ms"] == pytest.approx(600e-6)
    kinds = {k: (v["count"], v["ms"]) for k, v in gpu["by_category"].items()}
    assert kinds == {
        "attention": (1, pytest.approx(300e-6)),
        "matmul": (1, pytest.approx(100e-6)),
        "fusion": (2, pytest.approx(100e-6)),
        "memcpy": (1, pytest.approx(100e-6)),
    }
    assert gpu["by_category"]["attention"]["share"] == pytest.approx(0.5)
    assert list(gpu["by_category"])[0] == "attention"  # Largest first.
    top = gpu["top"]
    assert len(top) == 3 and top[0]["category"] == "attention"
    assert top[0]["hlo_op"] == "custom-call.2" and top[0]["mean_us"] == pytest.approx(0.3)
    fusion = next(k for k in top if k["category"] == "fusion")
    assert (fusion["count"], fusion["hlo_op"]) == (2, "fusion.3")
    # Per step: totals over the 2 steps traced.
    (step,) = summary["per_step"]
    assert step["busy_ms"] == pytest.approx(275e-6)
    assert step["by_category_ms"]["attention"] == pytest.approx(150e-6)


@pytest.mark.parametrize(
    "name,hlo_op,kind",
    [
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", "", "matmul"),
        ("cutlass_80_tensorop_bf16_s16816gemm", "", "matmul"),
        ("triton_gemm_dot_5", "", "matmul"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "", "collective"),
        ("input_reduce_fusion_12", "", "fusion"),
        ("some_kernel", "all-gather-start.1", "collective"),
        ("MemsetD32", "", "memcpy"),
        ("cudnn_fmha_bwd", "", "attention"),
        ("redzone_checker", "", "other"),
    ],
)
def test_kernel_kinds(name, hlo_op, kind):
    assert trace_summary.kernel_category(name, hlo_op) == kind


def test_command_prints_json_and_refuses_a_trace_without_devices(tmp_path):
    script = os.path.join(REPO_ROOT, "benchmarks", "trace_summary.py")
    good = tmp_path / "t.xplane.pb"
    good.write_bytes(_space().SerializeToString())
    proc = subprocess.run(
        [sys.executable, script, str(good), "--steps", "3", "--top", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    summary = json.loads(proc.stdout)
    assert summary["steps"] == 3 and len(summary["devices"][0]["top"]) == 2
    space = xplane_pb2.XSpace()
    space.planes.add(name="/host:CPU")
    bad = tmp_path / "host_only.xplane.pb"
    bad.write_bytes(space.SerializeToString())
    proc = subprocess.run(
        [sys.executable, script, str(bad)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "no /device:GPU or /device:TPU plane in this trace" in proc.stderr
