"""`axlearn gcp ...`: config files and launches on GKE.

    axlearn gcp config list|activate [--label=L]|cleanup
    axlearn gcp launch [start] --name=NAME --instance_type=tpu-v5p-128 [--num_replicas=2] \\
        [--bundler_type=artifactregistry] [--bundler_spec=KEY=VALUE ...] [--output_dir=gs://...] \\
        [--dry_run] -- COMMAND
    axlearn gcp launch list
    axlearn gcp launch stop --name=NAME
    axlearn gcp launch run [--num_processes=N] -- COMMAND

`axlearn gcp launch` without an action means `start`. Cloud clients come from the [gcp] extra
and are imported only by the commands that use them.
"""

from __future__ import annotations

import argparse
import sys

from axlearn.cli.config_commands import CommandError
from axlearn.cli.local import strip_separator

LAUNCH_ACTIONS = ("start", "stop", "list", "run")

_LAUNCH_DESCRIPTION = """\
Launch a command on GKE as a JobSet (TPU slices or GPU nodes).

Actions: start (default: build the image, submit the JobSet), list (the axlearn JobSets of the
namespace), stop --name=NAME (delete a JobSet), run (run the command on this machine, with the
pods' environment). `--dry_run` prints the build plan and the JobSet YAML and contacts nothing.

The command gains --mesh_selector (the instance type; with the slice count for several TPU
slices, e.g. tpu-v5p-128-2; with the GPU count for GPUs, e.g. gpu-a3-highgpu-8g-16). Before
anything is built, a launch_trainer_main command's trainer config is built here exactly as the
pods will build it; a bad --module/--config/--config_override, or a selector that matches none of
the experiment's mesh_rules, stops the launch (the dry run names the rule that matched).

Pre-flight: before a TPU job running launch_trainer_main is submitted (and in --dry_run), that
config's train step is compiled for the target slices on this machine (libtpu, the [tpu] extra);
a job that does not fit in HBM is refused. --skip_preflight skips the compile only.
"""


def normalize_argv(argv: list[str]) -> list[str]:
    """Inserts the default action: `axlearn gcp launch --flags` means `... launch start ...`.

    Args:
        argv: The arguments after the program name.

    Returns:
        The arguments with `start` after `gcp launch` where no action follows.
    """
    if len(argv) >= 2 and argv[0] == "gcp" and argv[1] == "launch":
        if len(argv) == 2 or argv[2] not in LAUNCH_ACTIONS:
            return argv[:2] + ["start"] + argv[2:]
    return argv


def add_parser(groups: argparse._SubParsersAction) -> None:
    """Registers the `gcp` command group.

    Args:
        groups: The top-level subparsers of the `axlearn` parser.
    """
    group = groups.add_parser("gcp", help="GCP: config files and launches on GKE.")
    commands = group.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)

    config = commands.add_parser("config", help="List, activate or clean up GCP config files.")
    config_actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
    config_actions.add_parser("list", help="Show config files and sections.").set_defaults(
        func=config_list
    )
    activate = config_actions.add_parser("activate", help="Make a config section active.")
    activate.add_argument("--label", default=None, help="A label or PROJECT:ZONE to select.")
    activate.set_defaults(func=config_activate)
    config_actions.add_parser(
        "cleanup", help="Delete the user config files (not the project default)."
    ).set_defaults(func=config_cleanup)

    launch = commands.add_parser(
        "launch",
        help="Launch a command on GKE TPU slices or GPU nodes (JobSet).",
        description=_LAUNCH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = launch.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = actions.add_parser(
        "start",
        help="Build the image and submit the JobSet (the default action).",
        description=_LAUNCH_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_job_flags(start)
    _add_cluster_flags(start)
    start.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    start.set_defaults(func=launch_start)

    listing = actions.add_parser("list", help="List the axlearn JobSets of the namespace.")
    _add_cluster_flags(listing)
    listing.set_defaults(func=launch_list)

    stop = actions.add_parser("stop", help="Delete a JobSet (and its pods).")
    stop.add_argument("--name", required=True, help="The job name.")
    _add_cluster_flags(stop)
    stop.set_defaults(func=launch_stop)

    run = actions.add_parser(
        "run", help="Run the command on this machine with the pods' environment (debugging)."
    )
    run.add_argument("--num_processes", type=int, default=1, help="Local processes (default 1).")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    run.set_defaults(func=launch_run)


def _add_job_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--name", required=True, help="Job name: lower-case letters, digits, '-' (Kubernetes)."
    )
    parser.add_argument(
        "--instance_type",
        required=True,
        help="tpu-<accelerator type> (tpu-v5p-128, tpu-v5litepod-256, tpu-v6e-256, ...) or "
        "gpu-<machine type> (gpu-a3-highgpu-8g, gpu-a3-megagpu-8g, gpu-a3-ultragpu-8g, "
        "gpu-a4-highgpu-8g).",
    )
    parser.add_argument(
        "--num_replicas", type=int, default=1, help="TPU slices or GPU nodes (default 1)."
    )
    parser.add_argument(
        "--bundler_type",
        default="artifactregistry",
        help="docker, artifactregistry (default) or cloudbuild.",
    )
    parser.add_argument(
        "--bundler_spec",
        action="append",
        default=[],
        help="KEY=VALUE, repeatable: dockerfile, image, target, platform, repo, context, "
        "allow_dirty, build_arg.NAME.",
    )
    parser.add_argument("--image", default=None, help="Run this existing image; skip bundling.")
    parser.add_argument(
        "--runner_name", default=None, help="Override the runner picked from the instance type."
    )
    parser.add_argument("--priority", default=None, help="The pods' priority class name.")
    parser.add_argument(
        "--max_tries", type=int, default=0, help="Pod failures each Job tolerates (backoffLimit)."
    )
    parser.add_argument(
        "--max_restarts",
        type=int,
        default=0,
        help="Times the JobSet is restarted after a failure (failurePolicy.maxRestarts).",
    )
    parser.add_argument("--service_account", default=None, help="The pods' service account.")
    parser.add_argument(
        "--xla_flag_set",
        default="llm_recipe",
        help="GPU instance types: the XLA_FLAGS set of axlearn.common.compiler_options."
        "GPU_XLA_FLAG_SETS given to the pods: llm_recipe (default), latency_hiding or none.",
    )
    parser.add_argument(
        "--xla_flags",
        default="",
        help="GPU instance types: extra XLA flags ('--name=value ...'); a flag of the set is "
        "replaced, others are added.",
    )
    parser.add_argument(
        "--output_dir",
        default=None,
        help="The job's output dir, a remote path (gs://bucket/dir): given to the pods as env "
        "AXLEARN_OUTPUT_DIR, and the trainer dir of a launch_trainer_main command that has no "
        "--trainer_dir (default: gs://<permanent_bucket>/axlearn/jobs/<name>).",
    )
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="Print the build plan, the pre-flight report and the JobSet YAML; build and submit "
        "nothing (exit 1 when the pre-flight refuses the job).",
    )
    parser.add_argument(
        "--skip_preflight",
        action="store_true",
        help="Do not compile the trainer for the target (libtpu) before submitting; by default "
        "a job whose train step does not fit in the chips' HBM is refused. The trainer config "
        "is still built (a bad module, config, override or mesh selector is still an error).",
    )
    parser.add_argument(
        "--report",
        default=None,
        help="Where the pre-flight writes its JSON report (default: "
        "~/.cache/axlearn/aot_reports/<module>_<config>@<topology>x<slices>.json).",
    )


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default="default", help="Kubernetes namespace.")
    parser.add_argument("--kubeconfig", default=None, help="Kubeconfig file (default: standard).")
    parser.add_argument("--context", default=None, help="Kubeconfig context (default: current).")


def config_list(args: argparse.Namespace) -> int:
    """Prints the config files and sections; the active one marked [*]."""
    from axlearn.cloud.gcp import config  # pylint: disable=import-outside-toplevel

    try:
        print(config.format_list(config.load_configs()))
    except config.ConfigError as e:
        raise CommandError(str(e)) from e
    return 0


def config_activate(args: argparse.Namespace) -> int:
    """Activates the config section selected by --label (or the only one)."""
    from axlearn.cloud.gcp import config  # pylint: disable=import-outside-toplevel

    try:
        name = config.select(config.load_configs(), args.label)
        path = config.write_active(name)
    except config.ConfigError as e:
        raise CommandError(str(e)) from e
    print(f"Setting {name} to active.\nConfigs written to {path}")
    return 0


def config_cleanup(args: argparse.Namespace) -> int:
    """Deletes the user config files."""
    from axlearn.cloud.gcp import config  # pylint: disable=import-outside-toplevel

    removed = config.cleanup()
    print("\n".join(f"Deleted {p}" for p in removed) or "No user config file to delete.")
    return 0


def _api(args: argparse.Namespace):
    from axlearn.cloud.gcp import k8s  # pylint: disable=import-outside-toplevel

    return k8s.custom_objects_api(args.kubeconfig, args.context)


def launch_start(args: argparse.Namespace) -> int:
    """Prepares the launch; prints it (--dry_run) or builds the image and submits the JobSet."""
    from axlearn.cloud.gcp import config, k8s  # pylint: disable=import-outside-toplevel
    from axlearn.cloud.gcp import launch as gcp_launch  # pylint: disable=import-outside-toplevel
    from axlearn.cloud.gcp.jobset import pod_template  # pylint: disable=import-outside-toplevel

    options = gcp_launch.LaunchOptions(
        name=args.name,
        instance_type=args.instance_type,
        command=strip_separator(args.cmd),
        num_replicas=args.num_replicas,
        bundler_type=args.bundler_type,
        bundler_spec=args.bundler_spec,
        image=args.image,
        runner_name=args.runner_name,
        priority=args.priority,
        max_tries=args.max_tries,
        max_restarts=args.max_restarts,
        namespace=args.namespace,
        service_account=args.service_account,
        xla_flag_set=args.xla_flag_set,
        xla_flags=args.xla_flags,
        output_dir=args.output_dir,
    )
    if not args.skip_preflight:
        # Before TensorFlow or libtpu load: it quiets their misleading start-up errors.
        from axlearn.common import aot_compilation  # noqa: F401  pylint: disable=C0415,W0611
    try:
        prepared = gcp_launch.prepare_launch(options, config.active_config())
        # Built before anything else: the pods' config, with their flags and mesh rule.
        check = gcp_launch.check_trainer_command(prepared)
        report = None
        if not args.skip_preflight:
            report = gcp_launch.launch_preflight(prepared, check)
        if report is not None:
            from axlearn.common import aot_compilation  # pylint: disable=C0415

            path = args.report or aot_compilation.default_report_path(
                report.config, report.topology, report.num_slices
            )
            print(
                f"Pre-flight report written to {aot_compilation.write_report(report, path)}",
                file=sys.stderr,
            )
        if args.dry_run:
            preflight = gcp_launch.describe_preflight(
                report, skipped=args.skip_preflight, trainer_check=check
            )
            sys.stdout.write(
                gcp_launch.describe_launch(prepared, preflight=preflight, trainer_check=check)
            )
            return 0 if report is None or report.fits else 1
        if report is not None and not report.fits:
            raise CommandError(
                f"Pre-flight refused the job: {report.refusal_message()}\n{report.describe()}\n"
                "Pass --skip_preflight to launch anyway."
            )
        api = _api(args)
        if prepared.plan is not None:
            prepared.plan.run()
        k8s.start(api, prepared.jobset)
    except (ValueError, k8s.JobApiError) as e:
        raise CommandError(str(e)) from e
    image = pod_template(prepared.jobset)["spec"]["containers"][0]["image"]
    print(
        f"Submitted JobSet {args.name} ({args.num_replicas} x {args.instance_type}) to namespace "
        f"{args.namespace}; image {image}."
    )
    return 0


def launch_list(args: argparse.Namespace) -> int:
    """Prints the axlearn JobSets of the namespace."""
    from axlearn.cloud.gcp import k8s  # pylint: disable=import-outside-toplevel

    try:
        print(k8s.format_jobs(k8s.list_jobs(_api(args), args.namespace)))
    except k8s.JobApiError as e:
        raise CommandError(str(e)) from e
    return 0


def launch_stop(args: argparse.Namespace) -> int:
    """Deletes a JobSet."""
    from axlearn.cloud.gcp import k8s  # pylint: disable=import-outside-toplevel

    try:
        k8s.stop(_api(args), args.name, args.namespace)
    except k8s.JobApiError as e:
        raise CommandError(str(e)) from e
    print(f"Stopping JobSet {args.name} in namespace {args.namespace}.")
    return 0


def launch_run(args: argparse.Namespace) -> int:
    """Runs the command on this machine (`axlearn local launch`)."""
    from axlearn.cloud.common.local_launch import launch_local  # pylint: disable=C0415

    try:
        return launch_local(strip_separator(args.cmd), num_processes=args.num_processes)
    except ValueError as e:
        raise CommandError(str(e)) from e
