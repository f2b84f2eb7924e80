"""Compiles a named experiment for a TPU topology on this machine and reports whether it fits.

    python -m axlearn.experiments.run_aot_compilation \
        --module=text.gpt.honeycrisp --config=honeycrisp-3B --topology=v5litepod-256 \
        [--topology_num_slices=2] [--compiler_options=default] [--dump_hlo=DIR] \
        [--report=PATH] [--config_override=PATH=VALUE ...]

`axlearn aot` takes the same flags. Needs libtpu (`pip install 'axlearn[tpu]'`), not a TPU. The
report (printed, and written as JSON to --report, default
`~/.cache/axlearn/aot_reports/<module>_<config>@<topology>x<slices>.json`) has per-chip
memory vs the chip's HBM, FLOPs, XLA's step-time estimate and MFU, the mesh and the mesh rule that
chose it, and the compile time. Exit code: 0 when the train step fits, 1 when it does not, 2 on a
usage error. See docs/aot.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Optional

# libtpu: allow several processes (this one and any other compile) on one machine.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def run_aot(
    *,
    module: str,
    config: str,
    topology: str,
    topology_num_slices: int = 1,
    compiler_options: str = "none",
    dump_hlo: Optional[str] = None,
    report_json: Optional[str] = None,
    config_overrides: Sequence[str] = (),
) -> int:
    """Compiles a named experiment for a topology, prints the report and writes its JSON.

    Args:
        module: The experiment module ("text.gpt.honeycrisp" or a full module path).
        config: The config name.
        topology: E.g. "v5p-128", "v5litepod-256" or "tpu-v5p-128".
        topology_num_slices: Number of slices.
        compiler_options: "none" (XLA's defaults) or "default"
            (`compiler_options.default_xla_options` for the topology).
        dump_hlo: If set, a directory for the optimized HLO (train_step.hlo.txt).
        report_json: Where to write the report as JSON (None: the user's cache dir,
            `aot_compilation.default_report_path`).
        config_overrides: `PATH=VALUE` changes to the config, as launch_trainer_main's
            `--config_override` (e.g. "input.batcher.global_batch_size=256").

    Returns:
        0 when the train step fits in HBM, 1 when it does not.

    Raises:
        ValueError: Unknown topology (listing close names) or bad `compiler_options`.
        aot_compilation.LibTpuMissingError: libtpu is not installed (naming the extra).
    """
    # pylint: disable=import-outside-toplevel
    from axlearn.cloud.gcp.system_characteristics import mesh_selector_for
    from axlearn.common import aot_compilation
    from axlearn.common import compiler_options as options_lib
    from axlearn.common.launch_trainer import build_trainer_config

    sc = aot_compilation.topology_system_characteristics(topology)
    aot_compilation.require_libtpu()
    if compiler_options == "none":
        options = None
    elif compiler_options == "default":
        options = options_lib.default_xla_options(
            instance_type=sc.instance_type, num_slices=topology_num_slices
        )
    else:
        raise ValueError(
            f"--compiler_options must be 'none' or 'default', got {compiler_options!r}"
        )
    config_name = f"{module}:{config}"
    # The config the pods of a launch on this topology build: same overrides, same mesh rule.
    trainer_config, resolution = build_trainer_config(
        module=module,
        config=config,
        config_overrides=config_overrides,
        mesh_selector=mesh_selector_for(sc.instance_type, topology_num_slices),
    )
    report = aot_compilation.aot_report(
        trainer_config,
        topology=sc.device_type,
        topology_num_slices=topology_num_slices,
        compiler_options=options,
        config_name=config_name,
        dump_hlo_dir=dump_hlo,
        mesh_resolution=resolution,
    )
    print(report.describe())
    path = report_json or aot_compilation.default_report_path(
        config_name, sc.device_type, topology_num_slices
    )
    aot_compilation.write_report(report, path)
    print(f"Report written to {path}")
    return 0 if report.fits else 1


def main(argv=None) -> int:
    """The absl entry point (`python -m axlearn.experiments.run_aot_compilation`)."""
    # pylint: disable-next=import-outside-toplevel
    from absl import flags

    fv = flags.FlagValues()
    flags.DEFINE_string("module", None, "The experiment module.", flag_values=fv, required=True)
    flags.DEFINE_string("config", None, "The config name.", flag_values=fv, required=True)
    flags.DEFINE_string(
        "topology",
        None,
        "TPU topology, e.g. v5p-128, v5litepod-256.",
        flag_values=fv,
        required=True,
    )
    flags.DEFINE_integer("topology_num_slices", 1, "Number of slices.", flag_values=fv)
    flags.DEFINE_enum(
        "compiler_options",
        "none",
        ["none", "default"],
        "XLA options: none, or the per-generation defaults of axlearn.common.compiler_options.",
        flag_values=fv,
    )
    flags.DEFINE_string("dump_hlo", None, "Directory for the optimized HLO.", flag_values=fv)
    flags.DEFINE_string(
        "report",
        None,
        "Where to write the JSON report (default: ~/.cache/axlearn/aot_reports/...).",
        flag_values=fv,
    )
    flags.DEFINE_alias("report_json", "report", flag_values=fv)
    flags.DEFINE_multi_string(
        "config_override", [], "PATH=VALUE change to the config (repeatable).", flag_values=fv
    )
    try:
        fv(list(sys.argv if argv is None else argv))
    except flags.Error as e:
        print(f"run_aot_compilation: {e}", file=sys.stderr)
        return 2
    return run_aot(
        module=fv.module,
        config=fv.config,
        topology=fv.topology,
        topology_num_slices=fv.topology_num_slices,
        compiler_options=fv.compiler_options,
        dump_hlo=fv.dump_hlo,
        report_json=fv.report,
        config_overrides=fv.config_override,
    )


if __name__ == "__main__":
    sys.exit(main())
