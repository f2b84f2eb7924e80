"""`axlearn gcp launch`: from a command and an instance type to a submitted JobSet.

`prepare_launch` does everything that contacts nothing: it reads the active config, checks the
name, instance type and replica count, picks the runner, completes the command
(`axlearn.cloud.common.command`, adding `--mesh_selector` by AXLearn's convention: see
`system_characteristics.mesh_selector_for`), makes the bundler's build plan, and builds the
JobSet. `check_trainer_command` then builds the trainer config exactly as the pods'
`launch_trainer_main` will (`axlearn.common.launch_trainer.build_trainer_config`: the same
`--module`, `--config`, `--config_override`s and `--mesh_selector`), so a bad experiment, override
or a selector that matches no mesh rule stops the launch before anything is built, and
`launch_preflight` compiles that same config for the target. `--dry_run` prints the result
(`describe_launch`, with the mesh rule that matched); `start` runs the build plan and submits the
JobSet with `axlearn.cloud.gcp.k8s`.
"""

from __future__ import annotations

import dataclasses
import getpass
import math
from collections.abc import Sequence
from typing import Any, Optional

from axlearn.cloud.common.bundler import BuildPlan
from axlearn.cloud.common.command import complete_trainer_command, runs_trainer
from axlearn.cloud.gcp import bundler as gcp_bundler
from axlearn.cloud.gcp.config import ConfigError
from axlearn.cloud.gcp.jobset import JobSpec, build_jobset, validate_name
from axlearn.cloud.gcp.runners import Runner, select_runner
from axlearn.cloud.gcp.system_characteristics import (
    SystemCharacteristics,
    instance_type_to_system_characteristics,
    mesh_selector_for,
    total_chips,
)


@dataclasses.dataclass
class LaunchOptions:
    """The launch's inputs (the flags of `axlearn gcp launch start`).

    Attributes:
        name: The job name.
        instance_type: The launch instance type.
        command: The command to run in every pod.
        num_replicas: TPU slices or GPU nodes.
        bundler_type: docker, artifactregistry or cloudbuild.
        bundler_spec: `KEY=VALUE` bundler settings.
        image: An existing image to run (skips bundling).
        runner_name: An explicit runner.
        priority: The pods' priority class.
        max_tries: Pod failures a Job tolerates (backoffLimit).
        max_restarts: JobSet restarts (failurePolicy.maxRestarts).
        namespace: Kubernetes namespace.
        service_account: Kubernetes service account of the pods.
        user: The submitting user.
        xla_flag_set: GPU instance types: the pods' XLA_FLAGS set
            (`compiler_options.GPU_XLA_FLAG_SETS`).
        xla_flags: GPU instance types: extra XLA flags overriding or extending the set.
        output_dir: The job's output dir (a remote path such as gs://bucket/dir): the pods get
            it as env OUTPUT_DIR_ENV, and a trainer command without --trainer_dir trains there.
    """

    name: str
    instance_type: str
    command: Sequence[str]
    num_replicas: int = 1
    bundler_type: str = "artifactregistry"
    bundler_spec: Sequence[str] = ()
    image: Optional[str] = None
    runner_name: Optional[str] = None
    priority: Optional[str] = None
    max_tries: int = 0
    max_restarts: int = 0
    namespace: str = "default"
    service_account: Optional[str] = None
    user: str = dataclasses.field(default_factory=getpass.getuser)
    xla_flag_set: str = "llm_recipe"
    xla_flags: str = ""
    output_dir: Optional[str] = None


# The pods' environment variable holding `--output_dir`.
OUTPUT_DIR_ENV = "AXLEARN_OUTPUT_DIR"


def validate_output_dir(output_dir: str) -> str:
    """Returns `--output_dir` without a trailing '/', checked to be a remote path.

    Args:
        output_dir: The flag's value.

    Returns:
        The normalized value.

    Raises:
        ValueError: An empty value or a local path (the pods cannot see this machine's disk).
    """
    scheme, sep, rest = output_dir.partition("://")
    if not sep or not scheme or not rest.strip("/"):
        raise ValueError(
            f"--output_dir={output_dir!r} must be a remote path the pods can write, such as "
            "gs://my-bucket/experiments/resnet50 (a local path is not visible to the pods)."
        )
    return output_dir.rstrip("/")


@dataclasses.dataclass
class PreparedLaunch:
    """A launch ready to build and submit.

    Attributes:
        options: The inputs.
        system: The instance type's characteristics.
        runner: The runner.
        command: The completed command.
        trainer_dir: The trainer directory added to the command (None: not a trainer command,
            or it set its own).
        plan: The bundler's build plan (None: `--image` given).
        jobset: The JobSet manifest.
    """

    options: LaunchOptions
    system: SystemCharacteristics
    runner: Runner
    command: list[str]
    trainer_dir: Optional[str]
    plan: Optional[BuildPlan]
    jobset: dict


def default_trainer_dir(config: dict, name: str) -> str:
    """Returns the job's trainer dir on the config's permanent bucket.

    Raises:
        ConfigError: The config has no permanent_bucket.
    """
    bucket = config.get("permanent_bucket")
    if not bucket:
        raise ConfigError(
            f"Config [gcp.\"{config.get('_name', '?')}\"] has no 'permanent_bucket' for the "
            "trainer dir; set it, or pass --trainer_dir in the command."
        )
    return f"gs://{bucket}/axlearn/jobs/{name}"


def prepare_launch(options: LaunchOptions, config: dict) -> PreparedLaunch:
    """Checks the inputs and builds the plan and the JobSet, contacting nothing.

    Args:
        options: The launch's inputs.
        config: The active GCP config (`axlearn.cloud.gcp.config.active_config`).

    Returns:
        The `PreparedLaunch`.

    Raises:
        ValueError: (incl. ConfigError, BundlerError) bad name, instance type, replica count,
            runner, bundler spec, dirty tree, or a config key the launch needs.
    """
    sc = instance_type_to_system_characteristics(options.instance_type)
    if options.num_replicas < 1:
        raise ValueError(f"--num_replicas must be >= 1, got {options.num_replicas}.")
    tpu = sc.platform == "tpu"
    validate_name(
        options.name,
        num_slices=options.num_replicas if tpu else 1,
        hosts_per_slice=sc.vms_per_slice if tpu else options.num_replicas,
    )
    runner = select_runner(options.instance_type, options.runner_name)
    if not options.command:
        raise ValueError("No command given: put it after `--`, e.g. -- python -m ...")
    output_dir = None if options.output_dir is None else validate_output_dir(options.output_dir)
    trainer_dir = None
    if runs_trainer(options.command) and not any(
        a.startswith("--trainer_dir") for a in options.command
    ):
        trainer_dir = output_dir or default_trainer_dir(config, options.name)
    command = complete_trainer_command(
        options.command,
        mesh_selector=mesh_selector_for(options.instance_type, options.num_replicas),
        jax_backend=sc.platform,
        trainer_dir=trainer_dir,
    )
    plan = None
    image = options.image
    if image is None:
        plan = gcp_bundler.build_plan(
            options.bundler_type,
            name=options.name,
            spec_items=options.bundler_spec,
            config=config,
            default_target=sc.platform,
        )
        image = plan.image
    env = {}
    if output_dir is not None:
        env[OUTPUT_DIR_ENV] = output_dir
    if not tpu:
        # pylint: disable-next=import-outside-toplevel
        from axlearn.common.compiler_options import gpu_xla_flags

        xla_flags = gpu_xla_flags(options.xla_flag_set, overrides=options.xla_flags)
        if xla_flags:
            env["XLA_FLAGS"] = xla_flags
    jobset = build_jobset(
        JobSpec(
            name=options.name,
            instance_type=options.instance_type,
            num_replicas=options.num_replicas,
            image=image,
            command=command,
            namespace=options.namespace,
            user=options.user,
            max_tries=options.max_tries,
            max_restarts=options.max_restarts,
            priority_class=options.priority,
            service_account=options.service_account,
            env=env,
        )
    )
    return PreparedLaunch(options, sc, runner, command, trainer_dir, plan, jobset)


@dataclasses.dataclass
class TrainerCheck:
    """The trainer config the pods will build, built here from their command.

    Attributes:
        config_name: "module:config".
        trainer_config: The `SpmdTrainer.Config` after overrides and the mesh rule.
        mesh_resolution: Which rule chose the mesh (`axlearn.common.mesh_resolution`).
        num_chips: The job's chips (devices).
        mesh: {axis: size} of the mesh the pods build on those chips.
    """

    config_name: str
    trainer_config: Any
    mesh_resolution: Any
    num_chips: int
    mesh: dict


def check_trainer_command(prepared: PreparedLaunch) -> Optional[TrainerCheck]:
    """Builds the trainer config that the pods' `launch_trainer_main` command builds.

    The module, config, `--config_override`s and `--mesh_selector` are read from the completed
    command (the one in the JobSet), and the config is built by the same function the trainer
    uses. Nothing is compiled (that is the pre-flight's job, which `--skip_preflight` skips).

    Args:
        prepared: The prepared launch.

    Returns:
        The `TrainerCheck`, or None when the command does not run launch_trainer_main.

    Raises:
        ValueError: The command names no experiment; an unknown module or config (naming the
            close names); a bad override; a `--mesh_selector` that matches none of the
            experiment's mesh rules (listing them and the closest names); a mesh that does not
            fit the job's chips.
    """
    # pylint: disable=import-outside-toplevel
    if not runs_trainer(prepared.command):
        return None
    modules = _flag_values(prepared.command, ("module", "config_module"))
    configs = _flag_values(prepared.command, ("config",))
    if not modules or not configs:
        raise ValueError(
            "The trainer command names no experiment: pass --module=... and --config=... "
            "after `--` (e.g. --module=text.gpt.tiny --config=gpt-tiny)."
        )
    from axlearn.common.launch_trainer import build_trainer_config

    selectors = _flag_values(prepared.command, ("mesh_selector",))
    try:
        trainer_config, resolution = build_trainer_config(
            module=modules[-1],
            config=configs[-1],
            config_overrides=_flag_values(prepared.command, ("config_override",)),
            mesh_selector=selectors[-1] if selectors else None,
        )
    except (ImportError, TypeError) as e:  # An unknown module, or not an experiment module.
        raise ValueError(str(e)) from e
    name = f"{modules[-1]}:{configs[-1]}"
    # The mesh spans JAX devices (two per chip on TPU 7x).
    chips = total_chips(prepared.system, prepared.options.num_replicas)
    devices = chips * prepared.system.devices_per_chip
    mesh = _mesh_on_chips(trainer_config, devices, name=name, resolution=resolution)
    return TrainerCheck(name, trainer_config, resolution, chips, mesh)


def _mesh_on_chips(trainer_config: Any, chips: int, *, name: str, resolution: Any) -> dict:
    """The mesh the pods will build on `chips` devices ({axis: size}), as the trainer infers it.

    Raises:
        ValueError: The mesh shape does not fit the job's chips (the pods would fail at start).
    """
    # pylint: disable-next=import-outside-toplevel
    from axlearn.common.utils_spmd import HybridMeshShape, infer_mesh_shape

    shape = trainer_config.mesh_shape
    names = list(trainer_config.mesh_axis_names or ())
    if isinstance(shape, HybridMeshShape):
        sizes = [i * d for i, d in zip(shape.ici_mesh_shape, shape.dcn_mesh_shape)]
        if any(d < 0 for d in sizes):  # -1s in ICI and DCN parts: inferred per slice on the pods.
            return dict(zip(names, sizes))
    else:
        sizes = list(shape or (-1,))
    try:
        inferred = infer_mesh_shape(sizes, num_devices=chips)
        if math.prod(inferred) != chips:
            raise ValueError(f"it uses {math.prod(inferred)} devices")
    except ValueError as e:
        raise ValueError(
            f"{name}: {resolution.describe()}, which does not fit the job's {chips} chips ({e}) "
            "Fix: launch on a size the rule is meant for, add a rule for this selector, or pass "
            "--config_override=mesh_shape=(...)."
        ) from e
    return dict(zip(names, (int(d) for d in inferred))) if names else {"": int(inferred[0])}


def describe_launch(
    prepared: PreparedLaunch,
    *,
    preflight: Optional[str] = None,
    trainer_check: Optional[TrainerCheck] = None,
) -> str:
    """Returns `--dry_run`'s output: a summary and build plan as comments, then the YAML.

    Args:
        prepared: The prepared launch.
        preflight: The pre-flight's comment lines (`describe_preflight`), shown after the plan.
        trainer_check: The pods' trainer config (`check_trainer_command`): its mesh rule is shown.

    Returns:
        Text whose non-comment part is the JobSet manifest in YAML.

    Raises:
        ValueError: PyYAML (the [gcp] extra) is not installed.
    """
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ValueError(
            "Printing the JobSet needs PyYAML from the [gcp] extra: pip install 'axlearn[gcp]'"
        ) from e

    sc, o = prepared.system, prepared.options
    hosts = sc.vms_per_slice if sc.platform == "tpu" else 1
    unit = "slice" if sc.platform == "tpu" else "node"
    lines = [
        "# axlearn gcp launch --dry_run: nothing was built or submitted.",
        f"# Job {o.name} in namespace {o.namespace}, runner {prepared.runner.name}.",
        f"# Instance type {o.instance_type}: {o.num_replicas} {unit}(s) x {hosts} host(s) x "
        f"{sc.chips_per_vm} chip(s) ({sc.chip}, {sc.hbm_per_chip_bytes / 1e9:.1f} GB HBM per "
        f"chip{', topology ' + sc.topology if sc.platform == 'tpu' else ''}); "
        f"{o.num_replicas * sc.chips_per_slice} chips in all.",
    ]
    if trainer_check is not None:
        lines.append(f"# Experiment {trainer_check.config_name}: built as the pods will build it.")
        lines.append(f"# Mesh: {trainer_check.mesh_resolution.describe()}")
        devices = trainer_check.num_chips * sc.devices_per_chip
        where = f"{trainer_check.num_chips} chips"
        if devices != trainer_check.num_chips:
            where += f" ({devices} devices)"
        lines.append(f"# Mesh on the {where}: {trainer_check.mesh}")
    if o.output_dir:
        lines.append(f"# Output dir: {validate_output_dir(o.output_dir)} (env {OUTPUT_DIR_ENV})")
    if prepared.trainer_dir:
        lines.append(f"# Trainer dir: {prepared.trainer_dir}")
    if prepared.plan is None:
        lines.append(f"# Image (given, not built): {o.image}")
    else:
        lines += ["#"] + ["# " + line for line in prepared.plan.describe().splitlines()]
    if preflight:
        lines += ["#"] + preflight.rstrip("\n").splitlines()
    body = yaml.safe_dump(prepared.jobset, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(lines) + "\n---\n" + body


def _flag_values(command: Sequence[str], names: Sequence[str]) -> list[str]:
    """Values of `--name=value` / `--name value` flags in a command, in order."""
    values = []
    for i, arg in enumerate(command):
        for name in names:
            if arg.startswith(f"--{name}="):
                values.append(arg.split("=", 1)[1])
            elif arg == f"--{name}" and i + 1 < len(command):
                values.append(command[i + 1])
    return values


def launch_preflight(
    prepared: PreparedLaunch,
    trainer_check: Optional[TrainerCheck],
    *,
    progress_out: Any = None,
) -> Optional[Any]:
    """Compiles the pods' trainer config for the target before submitting (the pre-flight).

    Runs when the command runs `launch_trainer_main` on a TPU instance type: the config of
    `check_trainer_command` (the pods' flags, overrides and mesh rule) is compiled here for
    `num_replicas` slices of the instance type.

    Args:
        prepared: The prepared launch.
        trainer_check: From `check_trainer_command` (None: not a trainer command).
        progress_out: Where progress lines go (default stderr).

    Returns:
        The `AotReport` (`.fits`, `.refusal_message()`, `.describe()`), or None when there is
        nothing to check (a GPU instance type, or not a trainer command).

    Raises:
        ValueError: libtpu is missing (the message names the [tpu] extra and --skip_preflight).
    """
    # pylint: disable=import-outside-toplevel
    if prepared.system.platform != "tpu" or trainer_check is None:
        return None
    from axlearn.common import aot_compilation

    try:
        aot_compilation.require_libtpu()
    except ImportError as e:
        raise ValueError(f"Pre-flight: {e} Or pass --skip_preflight.") from e
    return aot_compilation.run_preflight(
        trainer_check.trainer_config,
        prepared.options.instance_type,
        prepared.options.num_replicas,
        config_name=trainer_check.config_name,
        mesh_resolution=trainer_check.mesh_resolution,
        progress_out=progress_out,
    )


def describe_preflight(
    report: Optional[Any],
    *,
    skipped: bool = False,
    trainer_check: Optional[TrainerCheck] = None,
) -> str:
    """Returns the pre-flight part of `--dry_run`'s output, as comment lines.

    Args:
        report: From `launch_preflight` (None: nothing was checked).
        skipped: Whether --skip_preflight skipped it.
        trainer_check: From `check_trainer_command` (None: not a trainer command).

    Returns:
        Comment lines ending with a newline.
    """
    if skipped:
        return "# Pre-flight: skipped: --skip_preflight\n"
    if report is None and trainer_check is not None:
        return (
            "# Pre-flight: not compiled (AOT compiles for TPU topologies only; the trainer "
            "config above was built).\n"
        )
    if report is None:
        return "# Pre-flight: nothing to compile (not a trainer command).\n"
    verdict = "fits" if report.fits else "REFUSED: " + report.refusal_message()
    lines = [f"Pre-flight: {verdict}"] + report.describe().splitlines()
    return "".join(f"# {line}\n" for line in lines)
