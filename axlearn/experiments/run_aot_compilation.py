"""Compiles a named experiment for a TPU topology on this machine and reports whether it fits.

    python -m axlearn.experiments.run_aot_compilation \
        --module=text.gpt.honeycrisp --config=honeycrisp-3B --topology=v5litepod-256 \
        [--topology_num_slices=2] [--compiler_options=default] [--dump_hlo=DIR] \
        [--report=PATH] [--config_override=PATH=VALUE ...] [--remat=NAME|all]

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
    remat: Optional[str] = None,
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
        remat: None: the experiment's remat. A name of `attention.REMAT_CHOICES` ("none",
            "save_matmuls", "save_context", "full"): every transformer layer of the model uses
            it. "all": each choice is compiled in turn (one report each, the JSON path gaining
            "-remat_<name>"), then a table of their memory is printed.

    Returns:
        0 when the train step fits in HBM (with "all": for at least one choice), 1 when not.

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
    if remat not in (None, "all"):
        from axlearn.common.attention import remat_spec_by_name

        remat_spec_by_name(remat, config_path="--remat")  # Unknown: lists the choices.
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
    path = report_json or aot_compilation.default_report_path(
        config_name, sc.device_type, topology_num_slices
    )
    if remat is None:
        choices = [None]
    else:
        from axlearn.common.attention import REMAT_CHOICES, remat_choices_of

        choices = list(REMAT_CHOICES) if remat == "all" else [remat]
        if not remat_choices_of(trainer_config.model, "model"):
            raise ValueError(f"--remat={remat}: {config_name} has no transformer layers to remat.")
    reports = []
    for choice in choices:
        cfg = trainer_config if choice is None else _with_remat(trainer_config, choice)
        report = aot_compilation.aot_report(
            cfg,
            topology=sc.device_type,
            topology_num_slices=topology_num_slices,
            compiler_options=options,
            config_name=config_name if choice is None else f"{config_name} (remat {choice})",
            dump_hlo_dir=dump_hlo,
            mesh_resolution=resolution,
        )
        print(report.describe())
        choice_path = path
        if remat == "all":
            root, ext = os.path.splitext(path)
            choice_path = f"{root}-remat_{choice}{ext}"
        aot_compilation.write_report(report, choice_path)
        print(f"Report written to {choice_path}")
        reports.append((choice, report))
    if remat is not None:
        print(_remat_table(reports))
    return 0 if any(report.fits for _, report in reports) else 1


def _with_remat(trainer_config, name: str):
    """A copy of `trainer_config` whose transformer layers all use the remat choice `name`."""
    # pylint: disable=import-outside-toplevel
    from axlearn.common.attention import remat_choices_of
    from axlearn.common.trainer_config_modifier import RematSpecModifier

    cfg = trainer_config.clone()
    paths = remat_choices_of(cfg.model, "model")
    modifier = RematSpecModifier.default_config().set(remat_policies={path: name for path in paths})
    return modifier.instantiate()(cfg)


def _remat_table(reports) -> str:
    """Per remat choice: compiled temporaries and total per chip, and whether it fits."""
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.device_memory import format_bytes

    lines = [
        "Compiled memory per chip by remat choice:",
        "  remat          temporaries      total  fits",
    ]
    for choice, report in reports:
        memory = report.memory or {}
        temp = memory.get("temp_bytes")
        total = memory.get("total_bytes", report.bytes_needed)
        temp_text = format_bytes(temp) if temp is not None else "?"
        total_text = format_bytes(total) if total is not None else "?"
        fits = "yes" if report.fits else "NO"
        lines.append(f"  {choice:<13} {temp_text:>12} {total_text:>10}  {fits}")
    return "\n".join(lines)


# The exit code after Ctrl-C (128 + SIGINT, as a shell reports it).
INTERRUPTED_EXIT_CODE = 130


def exit_interrupted(prog: str) -> None:
    """After Ctrl-C: one line, then exits 130 at once.

    `os._exit` skips the interpreter's teardown, in which libtpu (its compile threads still
    running) would print a crash dump of every thread.

    Args:
        prog: The command's name for the line, e.g. "axlearn aot".
    """
    sys.stdout.flush()
    sys.stderr.write(
        f"{prog}: interrupted (Ctrl-C) before the report was written; nothing was saved. "
        "Rerun the same command to compile again.\n"
    )
    sys.stderr.flush()
    os._exit(INTERRUPTED_EXIT_CODE)  # pylint: disable=protected-access


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
    flags.DEFINE_string(
        "remat",
        None,
        "Remat of every transformer layer: none, save_matmuls, save_context, full, or all "
        "(each in turn, with a table of their memory). Default: the experiment's.",
        flag_values=fv,
    )
    try:
        fv(list(sys.argv if argv is None else argv))
    except flags.Error as e:
        print(f"run_aot_compilation: {e}", file=sys.stderr)
        return 2
    try:
        return _run_aot_from_flags(fv)
    except KeyboardInterrupt:
        exit_interrupted("run_aot_compilation")
        raise  # Not reached.


def _run_aot_from_flags(fv) -> int:
    """`run_aot` with the parsed flags."""
    return run_aot(
        module=fv.module,
        config=fv.config,
        topology=fv.topology,
        topology_num_slices=fv.topology_num_slices,
        compiler_options=fv.compiler_options,
        dump_hlo=fv.dump_hlo,
        report_json=fv.report,
        config_overrides=fv.config_override,
        remat=fv.remat,
    )


if __name__ == "__main__":
    sys.exit(main())
