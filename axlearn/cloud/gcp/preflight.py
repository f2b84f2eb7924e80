"""The launch pre-flight: compile the experiment for the target TPU slices before submitting.

`axlearn gcp launch` (start and `--dry_run`) runs `check_launch` when the command runs
`launch_trainer_main` on a TPU instance type: it builds the command's trainer config
(`--module`, `--config`, `--config_override`), compiles its train step ahead of time for
`--num_replicas` slices of the instance type with libtpu on this machine
(`axlearn.common.aot_compilation.run_preflight`), and reports whether it fits in HBM. A job
that does not fit is refused; `--skip_preflight` skips the check. GPU jobs and other commands
are not pre-compiled (AOT compilation targets TPU topologies).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

from axlearn.cloud.common.command import runs_trainer

FITS, REFUSED, SKIPPED = "fits", "refused", "skipped"


@dataclasses.dataclass
class PreflightResult:
    """The outcome of the pre-flight.

    Attributes:
        status: FITS, REFUSED or SKIPPED.
        message: One line: why skipped, or the refusal, or a summary.
        report: The AOT report (None when skipped).
    """

    status: str
    message: str
    report: Optional[Any] = None

    def describe(self) -> str:
        """Returns the result as text lines (the report's, when there is one)."""
        lines = [f"Pre-flight: {self.status}: {self.message}"]
        if self.report is not None:
            lines += self.report.describe().splitlines()
        return "\n".join(lines)


def trainer_flags(command: Sequence[str]) -> dict[str, Any]:
    """Returns the `--module`, `--config` and `--config_override` values of a trainer command.

    Args:
        command: The command (argv); both `--flag=value` and `--flag value` forms are read.

    Returns:
        {"module": str|None, "config": str|None, "config_override": list[str]}.
    """
    found: dict[str, Any] = {"module": None, "config": None, "config_override": []}
    args = list(command)
    for i, arg in enumerate(args):
        for name in found:
            value = None
            if arg.startswith(f"--{name}="):
                value = arg.split("=", 1)[1]
            elif arg == f"--{name}" and i + 1 < len(args):
                value = args[i + 1]
            if value is None:
                continue
            if name == "config_override":
                found[name].append(value)
            else:
                found[name] = value
    return found


def check_launch(
    command: Sequence[str], *, instance_type: str, num_replicas: int, skip: bool = False
) -> PreflightResult:
    """Runs the pre-flight of a launch.

    Args:
        command: The (completed) command the pods run.
        instance_type: The launch instance type.
        num_replicas: Slices.
        skip: `--skip_preflight`.

    Returns:
        The `PreflightResult`.

    Raises:
        ValueError: libtpu is missing (the message names the [tpu] extra and --skip_preflight),
            or the command's experiment cannot be built.
    """
    # pylint: disable=import-outside-toplevel
    from axlearn.cloud.gcp.system_characteristics import instance_type_to_system_characteristics

    if skip:
        return PreflightResult(SKIPPED, "--skip_preflight")
    if not runs_trainer(command):
        return PreflightResult(SKIPPED, "the command does not run launch_trainer_main")
    if instance_type_to_system_characteristics(instance_type).platform != "tpu":
        return PreflightResult(SKIPPED, "AOT compilation targets TPU slices; GPU jobs are not")
    flags = trainer_flags(command)
    if not flags["module"] or not flags["config"]:
        return PreflightResult(SKIPPED, "the command names no --module and --config")

    from axlearn.common import aot_compilation, experiment_registry
    from axlearn.common.config.override import apply_overrides

    try:
        aot_compilation.require_libtpu()
    except ImportError as e:
        raise ValueError(
            f"The launch pre-flight compiles for {instance_type} with libtpu: {e}; "
            "or pass --skip_preflight."
        ) from e
    try:
        cfg = experiment_registry.get_named_trainer_config(
            flags["config"], config_module=flags["module"]
        )()
        apply_overrides(cfg, flags["config_override"])
    except Exception as e:  # The lookup's own errors explain themselves.
        raise ValueError(f"Pre-flight: cannot build the command's trainer config: {e}") from e
    report = aot_compilation.run_preflight(
        cfg, instance_type, num_replicas, config_name=flags["config"]
    )
    if not report.fits:
        return PreflightResult(REFUSED, report.refusal_message(), report)
    headroom = report.headroom_bytes
    summary = f"compiled for {instance_type} x{num_replicas}; fits in HBM" + (
        f" with {headroom / (1 << 30):.2f} GiB per chip to spare" if headroom is not None else ""
    )
    return PreflightResult(FITS, summary, report)
