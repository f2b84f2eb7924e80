"""Tests of axlearn/common/aot_compilation.py (compiling for TPU topologies on CPU via libtpu)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from axlearn.common import aot_compilation as aot
from axlearn.common.utils_spmd import HybridMeshShape
from axlearn.experiments.text.gpt import honeycrisp, tiny


def _tiny_config(**mesh_rules):
    cfg = tiny.tiny_trainer_config(global_batch_size=16, seq_len=32, num_layers=1, model_dim=64)
    cfg.mesh_rules = list(mesh_rules.items())
    return cfg


def test_reexports_the_instance_type_table():
    from axlearn.cloud.gcp import system_characteristics as sc_lib

    assert aot.USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS is (
        sc_lib.USER_FACING_NAME_TO_SYSTEM_CHARACTERISTICS
    )
    assert aot.SystemCharacteristics is sc_lib.SystemCharacteristics
    # Launch instance types and the v5e alias map to the table's keys.
    assert aot.topology_system_characteristics("tpu-v5p-128").device_type == "v5p-128"
    assert aot.topology_system_characteristics("v5e-256").device_type == "v5litepod-256"


def test_unknown_topology_lists_close_names():
    with pytest.raises(ValueError, match=r"Unknown topology 'v5p-127'.*Did you mean: .*v5p-128"):
        aot.get_devices_for_topology("v5p-127")
    with pytest.raises(ValueError, match="GPU"):
        aot.get_devices_for_topology("a3-highgpu-8g")


def test_missing_libtpu_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a)
    )
    with pytest.raises(aot.LibTpuMissingError, match=r"pip install 'axlearn\[tpu\]'"):
        aot.get_devices_for_topology("v5p-8")


@pytest.mark.parametrize(
    "topology,num_slices,expected_kind",
    [("v4-8", 1, "TPU v4"), ("v5litepod-16", 1, "TPU v5 lite"), ("v5p-16", 2, "TPU v5")],
)
def test_devices_one_per_chip(topology, num_slices, expected_kind):
    devices = aot.get_devices_for_topology(topology, num_slices)
    sc = aot.topology_system_characteristics(topology)
    # v4-8 is 4 chips (8 TensorCores): megacore gives one device per chip, as on the slice.
    assert len(devices) == sc.chips_per_slice * num_slices
    assert {d.device_kind for d in devices} == {expected_kind}
    if num_slices > 1:
        assert sorted({d.slice_index for d in devices}) == list(range(num_slices))


def test_bytes_needed_from_oom_messages():
    gib = 1 << 30
    parse = aot.bytes_needed_from_oom
    assert parse("Ran out of memory in memory space hbm. Used 49.34G of 32.00G hbm.") == int(
        49.34 * gib
    )
    assert parse("Aborting compilation early ... Requires 3.84T, has 90.96G available.") == int(
        3.84 * (1 << 40)
    )
    assert parse(
        "Ran out of memory on HBM, the total memory required for HLO temporaries (36.40G) "
        "exceeds available HBM (15.75G)."
    ) == int(36.40 * gib)
    assert parse("some other error") is None


@pytest.mark.slow
def test_two_slice_hybrid_mesh_data_axis_spans_slices():
    """v5p-8 x 2: data over the 2 slices (DCN), fsdp over each slice's 4 chips (ICI)."""
    # The launch's selector for 2 slices of tpu-v5p-8 is "tpu-v5p-8-2" (AXLearn's convention).
    cfg = _tiny_config(**{"tpu-v5p-8-2": HybridMeshShape((1, 1, 1, 4, 1, 1), (1, 2, 1, 1, 1, 1))})
    result = aot.compile_trainer(cfg, topology="v5p-8", topology_num_slices=2)
    assert result.error is None and result.compiled is not None
    assert result.mesh_rule == "tpu-v5p-8-2" and result.mesh_selector == "tpu-v5p-8-2"
    mesh = result.trainer.mesh()
    assert dict(mesh.shape) == dict(pipeline=1, data=2, expert=1, fsdp=4, seq=1, model=1)
    grid = mesh.devices.reshape(2, 4)  # [data, fsdp]
    slices = np.vectorize(lambda d: d.slice_index)(grid)
    np.testing.assert_array_equal(slices, [[0] * 4, [1] * 4])
    # Each slice's row holds all 4 of its chips, once.
    all_devices = aot.get_devices_for_topology("v5p-8", 2)
    for s in range(2):
        assert {d.id for d in grid[s]} == {d.id for d in all_devices if d.slice_index == s}
    report = aot.report_from_result(result, config_name="tiny")
    assert report.fits and report.num_chips == 8
    assert report.memory["total_bytes"] == report.bytes_needed > 0


def test_preflight_refuses_unsharded_honeycrisp_on_v5e_16():
    """honeycrisp-3B replicated (no fsdp) on tpu-v5litepod-16 cannot fit in 16 GiB per chip."""
    cfg = honeycrisp.honeycrisp_trainer_config()
    cfg.mesh_rules = [("tpu-v5litepod-16", (1, -1, 1, 1, 1, 1))] + list(cfg.mesh_rules)
    report = aot.run_preflight(cfg, "tpu-v5litepod-16", config_name="honeycrisp-3B")
    assert not report.fits
    assert report.mesh_shape["data"] == 16 and report.mesh_shape["fsdp"] == 1
    message = report.refusal_message()
    assert "TPU v5e" in message
    assert "16.00 GiB of HBM" in message
    assert f"({report.bytes_needed} bytes)" in message
    assert "mesh rule 'tpu-v5litepod-16'" in message
    # Parameters (fp32) + adastar's 2 slots, unsharded: 3 x 4 bytes x ~2.7B > 16 GiB.
    assert report.bytes_needed > 3 * 4 * 2.5e9
    assert "NO" in report.describe()
    # compile_trainer_programs raises instead of returning a program that cannot run.
    with pytest.raises(RuntimeError, match="does not compile for v5litepod-16: State exceeds HBM"):
        aot.compile_trainer_programs(cfg, topology="v5litepod-16")


def test_compile_train_step_from_input_specs_on_cpu():
    """Without a batch, compile_train_step shapes the batch from the input's element_spec()."""
    import tempfile

    from axlearn.common.input_fake import replace_inputs_with_fake

    cfg = replace_inputs_with_fake(_tiny_config())
    cfg.dir = tempfile.mkdtemp()
    trainer = cfg.instantiate(parent=None)
    compiled = trainer.compile_train_step()
    # Arguments: state + a [16, 32] int32 input_ids/target_labels batch (+ [16] bytes).
    in_tree = compiled.input_shardings[0][1]
    assert set(in_tree) == {"input_ids", "target_labels", "target_num_bytes"}
    assert compiled.memory_analysis().argument_size_in_bytes > 0
