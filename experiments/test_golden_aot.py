"""Golden AOT memory: each named experiment compiled for the TPU topologies its mesh rules name.

For every experiment config and every mesh rule whose regex is a single TPU instance type of the
instance-type table (honeycrisp-3B: `tpu-v4-256`, `tpu-v5litepod-256`, `tpu-v5p-8`,
`tpu-v6e-256`), the train step is compiled here for that topology (libtpu, no TPU;
`axlearn.common.aot_compilation`) and the per-chip
memory of the report is compared with experiments/testdata/aot/<module>/<config>@<topology>.json:
the mesh, the mesh rule and whether it fits must be equal, and every byte count within 5%.
(Rules that are regexes over several types, e.g. `tpu-v5p-(1024|2048|4096)`, name slices of 512+
chips whose compile is too slow for CI; `axlearn aot` compiles them on demand. Of a module with
many sizes and variants, only the configs `_AOT_CONFIGS` lists are compiled, e.g. fuji-7B-v3 of
c4_trainer's ~40 Fuji configs.)

A change that moves per-chip memory by more than 5% fails here. If it is intended, regenerate:

    AXLEARN_UPDATE_GOLDENS=1 .venv/bin/pytest experiments/test_golden_aot.py
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re

import jax
import pytest

from axlearn.cloud.gcp.system_characteristics import instance_types
from axlearn.common import aot_compilation, utils
from experiments.test_golden_configs import TESTDATA_DIR, UPDATE_ENV, experiment_modules

TOLERANCE = 0.05
_BYTE_FIELDS = ("bytes_needed", "param_bytes_per_chip", "optimizer_bytes_per_chip")
_EXACT_FIELDS = ("mesh_shape", "mesh_rule", "fits", "chip", "num_chips")


def _named_tpu_topologies(trainer_config) -> list[str]:
    """The TPU instance types that a mesh rule names literally (its regex matches only it)."""
    tpu_types = [t for t in instance_types() if t.startswith("tpu-")]
    named = []
    for regex, _ in trainer_config.mesh_rules or ():
        matches = [t for t in tpu_types if re.fullmatch(regex, t)]
        if matches == [regex]:
            named.append(regex)
    return named


# Modules whose configs are compiled only as listed here (the other modules: every config).
_AOT_CONFIGS = {"axlearn.experiments.text.gpt.c4_trainer": ("fuji-7B-v3",)}


def _cases() -> list[tuple[str, str, str]]:
    cases = []
    for module in experiment_modules():
        configs = importlib.import_module(module).named_trainer_configs()
        for name in sorted(configs):
            if module in _AOT_CONFIGS and name not in _AOT_CONFIGS[module]:
                continue
            for instance_type in _named_tpu_topologies(configs[name]()):
                cases.append((module, name, instance_type))
    return cases


def golden_path(module: str, name: str, instance_type: str) -> str:
    """The golden AOT report of a config on an instance type."""
    return os.path.join(TESTDATA_DIR, "aot", module, f"{name}@{instance_type}.json")


def golden_fields(report: aot_compilation.AotReport) -> dict:
    """The report fields a golden records."""
    d = report.to_dict()
    fields = {k: d[k] for k in _EXACT_FIELDS + _BYTE_FIELDS}
    fields["memory"] = d["memory"]
    return fields


def _within(actual, expected) -> bool:
    if actual is None or expected is None:
        return actual == expected
    return abs(actual - expected) <= TOLERANCE * max(abs(expected), 1)


def compare_to_golden(actual: dict, golden: dict) -> list[str]:
    """Returns the differences (empty when the report matches the golden within tolerance).

    Args:
        actual: `golden_fields` of a fresh report.
        golden: The golden file's content.

    Returns:
        One line per field that differs.
    """
    problems = []
    for key in _EXACT_FIELDS:
        if actual[key] != golden[key]:
            problems.append(f"{key}: {actual[key]!r} != golden {golden[key]!r}")
    for key in _BYTE_FIELDS:
        if not _within(actual[key], golden[key]):
            problems.append(f"{key}: {actual[key]} vs golden {golden[key]} (>5%)")
    if (actual["memory"] is None) != (golden["memory"] is None):
        problems.append(f"memory analysis: {actual['memory']} vs golden {golden['memory']}")
    elif actual["memory"] is not None:
        for key, value in golden["memory"].items():
            if not _within(actual["memory"].get(key), value):
                problems.append(f"memory.{key}: {actual['memory'].get(key)} vs golden {value}")
    return problems


def test_golden_comparison_detects_a_5_percent_move():
    golden = {
        "mesh_shape": {"fsdp": 8},
        "mesh_rule": "tpu-v5p-8",
        "fits": True,
        "chip": "TPU v5p",
        "num_chips": 4,
        "bytes_needed": 1000,
        "param_bytes_per_chip": 100,
        "optimizer_bytes_per_chip": 200,
        "memory": {"total_bytes": 1000},
    }
    assert compare_to_golden(json.loads(json.dumps(golden)), golden) == []
    moved = json.loads(json.dumps(golden))
    moved["bytes_needed"] = 1049
    assert compare_to_golden(moved, golden) == []
    moved["bytes_needed"] = 1051
    moved["memory"]["total_bytes"] = 940
    assert compare_to_golden(moved, golden) == [
        "bytes_needed: 1051 vs golden 1000 (>5%)",
        "memory.total_bytes: 940 vs golden 1000",
    ]


def test_named_topologies_of_honeycrisp():
    from axlearn.experiments.text.gpt import honeycrisp

    assert _named_tpu_topologies(honeycrisp.honeycrisp_trainer_config()) == [
        "tpu-v4-256",
        "tpu-v5litepod-256",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("module,name,instance_type", _cases())
def test_golden_aot(module: str, name: str, instance_type: str):
    cfg = importlib.import_module(module).named_trainer_configs()[name]()
    report = aot_compilation.run_preflight(cfg, instance_type, config_name=f"{module}:{name}")
    actual = golden_fields(report)

    # Parameters + optimizer state per chip vs the analytic count:
    # sum over parameters of size x 4 bytes (fp32) x (1 + slots) / its sharding degree (the
    # product of the mesh axes its partition spec names; for honeycrisp-3B every weight is
    # fsdp-sharded, so this is parameters x 4 x (1 + slots) / fsdp degree, checked too).
    param_specs = report_trainer_param_specs(cfg, instance_type)
    slots = _optimizer_slots(cfg)
    analytic = sum(
        math.prod(spec.shape) * 4 * (1 + slots) / _degree(spec.mesh_axes, report.mesh_shape)
        for spec in jax.tree.leaves(param_specs, is_leaf=lambda x: hasattr(x, "mesh_axes"))
    )
    measured = report.param_bytes_per_chip + report.optimizer_bytes_per_chip
    assert abs(measured - analytic) <= 0.10 * analytic, (measured, analytic, slots)
    if name == "honeycrisp-3B":
        params = utils.count_model_params(param_specs)
        simple = params * 4 * (1 + slots) / report.mesh_shape["fsdp"]
        assert abs(measured - simple) <= 0.10 * simple, (measured, simple, params, slots)

    path = golden_path(module, name, instance_type)
    if os.environ.get(UPDATE_ENV):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(actual, indent=2, sort_keys=True) + "\n")
    assert os.path.exists(path), f"No golden {path}; run with {UPDATE_ENV}=1 to create it."
    with open(path, encoding="utf-8") as f:
        golden = json.load(f)
    problems = compare_to_golden(actual, golden)
    assert not problems, f"{path}:\n" + "\n".join(problems) + "\n" + report.describe()


def report_trainer_param_specs(cfg, instance_type: str):
    """The model's parameter specs (shapes do not depend on the mesh)."""
    del instance_type
    return cfg.model.set(name="model").instantiate(parent=None).create_parameter_specs_recursively()


def _degree(mesh_axes, mesh_shape: dict) -> int:
    """The number of shards of a parameter: the product of the mesh axes its spec names."""
    degree = 1
    for entry in tuple(mesh_axes or ()):
        for axis in (entry,) if isinstance(entry, str) else tuple(entry or ()):
            degree *= mesh_shape[axis]
    return degree


def _optimizer_slots(cfg) -> int:
    """Full-size optimizer slots per parameter, from the learner config (adastar or Adam)."""
    flat = cfg.learner.to_flat_dict()
    inner = {k.rsplit(".", 1)[-1]: v for k, v in flat.items()}
    if "gradient_square_ema_decay" in inner:  # adastar
        slots = 1  # gradient square EMA
        slots += inner.get("gradient_ema_decay") is not None  # gradient EMA
        slots += inner.get("update_ema_decay") is not None  # update EMA
        return slots
    return 2  # Adam(W): first and second moments.
