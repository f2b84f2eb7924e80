"""Tests axlearn/cli/gcp.py: `axlearn gcp config|launch` as a user runs them."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import yaml

from axlearn.cli import main as cli_main
from axlearn.cloud.gcp import jobset as js

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = """
[gcp."my-project:us-east5-a"]
project = "my-project"
zone = "us-east5-a"
permanent_bucket = "my-permanent"
docker_repo = "us-docker.pkg.dev/my-project/axlearn"
labels = "v5p"
"""
EXAMPLE = [
    "gcp", "launch", "--dry_run", "--instance_type=tpu-v5p-128", "--num_replicas=2", "--name=x",
    "--image=us-docker.pkg.dev/my-project/axlearn/axlearn:x", "--skip_preflight", "--",
    "python", "-m", "axlearn.common.launch_trainer_main",
    "--module=text.gpt.honeycrisp", "--config=honeycrisp-3B",
]  # fmt: skip


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--help"], ["gcp", "local", "config"]),
        (["gcp", "--help"], ["config", "launch"]),
        (["gcp", "config", "--help"], ["list", "activate", "cleanup"]),
        (["gcp", "launch", "--help"], ["--instance_type", "--num_replicas", "--bundler_spec",
                                       "--dry_run", "--runner_name", "--priority", "stop",
                                       "--skip_preflight"]),
        (["gcp", "launch", "stop", "--help"], ["--name", "--namespace", "--kubeconfig"]),
        (["gcp", "launch", "list", "--help"], ["--namespace"]),
        (["gcp", "launch", "run", "--help"], ["--num_processes"]),
        (["local", "launch", "--help"], ["--num_processes", "DISTRIBUTED_COORDINATOR"]),
    ],
)  # fmt: skip
def test_help_lists_flags(argv, expected, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main.main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    for word in expected:
        assert word in out, (argv, word)


def test_config_and_dry_run(home, capsys):
    assert cli_main.main(EXAMPLE) == 1
    assert "No axlearn config file found" in capsys.readouterr().err
    (home / ".axlearn.config").write_text(CONFIG)
    assert cli_main.main(EXAMPLE) == 1
    assert "No active GCP config; run `axlearn gcp config activate" in capsys.readouterr().err
    assert cli_main.main(["gcp", "config", "activate", "--label=v5p"]) == 0
    assert "Setting my-project:us-east5-a to active." in capsys.readouterr().out
    assert cli_main.main(["gcp", "config", "list"]) == 0
    assert "[*] my-project:us-east5-a [v5p]" in capsys.readouterr().out

    assert cli_main.main(EXAMPLE) == 0
    out = capsys.readouterr().out
    manifest = yaml.safe_load(out.partition("\n---\n")[2])
    assert manifest["kind"] == "JobSet" and manifest["spec"]["replicatedJobs"][0]["replicas"] == 2
    assert "#\n# Pre-flight: skipped: --skip_preflight\n---\n" in out

    bad = [a.replace("tpu-v5p-128", "tpu-v5p-127") for a in EXAMPLE]
    assert cli_main.main(bad) == 1
    err = capsys.readouterr().err
    assert err.startswith("axlearn gcp: error: Unknown instance type 'tpu-v5p-127'.")
    assert "tpu-v5p-128" in err

    assert cli_main.main(["gcp", "config", "cleanup"]) == 0
    assert not (home / ".axlearn.config").exists()


def test_help_works_without_the_gcp_extra():
    """`axlearn --help` needs no cloud client; a command that does names the [gcp] extra."""
    code = (
        "import sys\n"
        "for m in ('kubernetes', 'google', 'toml', 'yaml'):\n"
        "    sys.modules[m] = None  # Makes `import m` fail, as if not installed.\n"
        "from axlearn.cli import main\n"
        "for argv in (['--help'], ['gcp', 'launch', '--help']):\n"
        "    try:\n"
        "        main.main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, e.code\n"
        "sys.exit(main.main(['gcp', 'launch', 'list']))\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert "usage: axlearn" in proc.stdout
    assert proc.stderr.strip() == (
        "axlearn gcp: error: The `kubernetes` package is missing; this command needs the [gcp] "
        "extra: pip install 'axlearn[gcp]'"
    )


REGISTRY_TESTDATA = os.path.join(REPO_ROOT, "tests", "testdata", "experiment_registry")


def _launch(instance_type: str, module: str, config: str, *flags: str) -> list[str]:
    return [
        "gcp", "launch", f"--instance_type={instance_type}", "--name=pf",
        "--image=us-docker.pkg.dev/my-project/axlearn/axlearn:x", *flags, "--",
        "python", "-m", "axlearn.common.launch_trainer_main", f"--module={module}",
        f"--config={config}",
    ]  # fmt: skip


@pytest.fixture
def active_config(home, capsys):
    (home / ".axlearn.config").write_text(CONFIG)
    assert cli_main.main(["gcp", "config", "activate", "--label=v5p"]) == 0
    capsys.readouterr()


def test_preflight_refuses_a_job_that_cannot_fit(active_config, capsys, monkeypatch):
    """honeycrisp-3B unsharded on tpu-v5litepod-16: refused before anything is contacted."""
    monkeypatch.syspath_prepend(REGISTRY_TESTDATA)
    argv = _launch("tpu-v5litepod-16", "axlearn_test_aot_experiment", "honeycrisp-3B-unsharded")
    # No cluster exists: reaching the Kubernetes API would fail differently.
    assert cli_main.main(argv) == 1
    err = capsys.readouterr().err
    assert "Pre-flight refused the job:" in err
    assert "each TPU v5e chip has 16.00 GiB of HBM" in err
    assert "mesh rule 'tpu-v5litepod-16'" in err and "Pass --skip_preflight" in err
    # --dry_run shows the report and exits 1.
    assert cli_main.main(argv[:3] + ["--dry_run"] + argv[3:]) == 1
    out = capsys.readouterr().out
    assert "# Pre-flight: REFUSED:" in out and "kind: JobSet" in out


@pytest.mark.slow
def test_dry_run_includes_the_preflight_report(active_config, capsys):
    argv = _launch("tpu-v5p-8", "text.gpt.tiny", "gpt-tiny", "--dry_run")
    assert cli_main.main(argv) == 0
    out = capsys.readouterr().out
    assert "# Pre-flight: fits" in out
    assert "# AOT compilation of text.gpt.tiny:gpt-tiny for v5p-8 x1 (4 x TPU v5p" in out
    assert "#   memory per chip: arguments" in out


# The launch targets of the docs, and the rule each shipped experiment's pods match there.
TARGETS = [("tpu-v5p-8", 1), ("tpu-v5p-128", 2), ("tpu-v6e-256", 1), ("gpu-a3-highgpu-8g", 2)]
EXPECTED_RULES = {
    ("text.gpt.tiny", "gpt-tiny"): {
        "tpu-v5p-8": "tpu-v5p-8(-2)?",
        "tpu-v5p-128-2": "tpu-(v5p-128-2|v6e-256)",
        "tpu-v6e-256": "tpu-(v5p-128-2|v6e-256)",
        "gpu-a3-highgpu-8g-16": "gpu-a3-highgpu-8g-(8|16)",
    },
    ("text.gpt.honeycrisp", "honeycrisp-3B"): {
        "tpu-v5p-8": "tpu-v5p-8",
        "tpu-v5p-128-2": "tpu-v5p-128-2",
        "tpu-v6e-256": "tpu-v6e-256",
        "gpu-a3-highgpu-8g-16": "gpu-a3-highgpu-8g-(8|16|32)",
    },
}


def _pod_flag_values(command: list[str]):
    """Parses a pod's launch_trainer_main command with the trainer's own absl flags."""
    from absl import flags

    import axlearn.common.launch_trainer_main  # noqa: F401  (defines the trainer's flags)

    assert command[:3] == ["python", "-m", "axlearn.common.launch_trainer_main"]
    fv = flags.FlagValues()
    fv.append_flag_values(flags.FLAGS)
    fv(["launch_trainer_main", *command[3:]])
    return fv


@pytest.mark.parametrize("experiment", sorted(EXPECTED_RULES))
def test_dry_run_names_the_rule_the_pods_then_pass(active_config, capsys, monkeypatch, experiment):
    """For each docs launch target: the dry run names the mesh rule, and the pods' command (from
    the printed JobSet) passes the trainer's own --mesh_selector check with the same mesh."""
    import jax

    from axlearn.cloud.gcp.system_characteristics import instance_type_to_system_characteristics
    from axlearn.common import launch_trainer

    module, config = experiment
    for instance_type, replicas in TARGETS:
        argv = _launch(instance_type, module, config, "--dry_run", "--skip_preflight")
        argv.insert(3, f"--num_replicas={replicas}")
        assert cli_main.main(argv) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        header, _, body = out.partition("\n---\n")
        manifest = yaml.safe_load(body)
        command = js.pod_template(manifest)["spec"]["containers"][0]["command"]
        selector = next(a.split("=", 1)[1] for a in command if a.startswith("--mesh_selector="))
        rule = EXPECTED_RULES[experiment][selector]
        line = next(x for x in header.splitlines() if x.startswith("# Mesh: "))
        assert line.startswith(f"# Mesh: --mesh_selector={selector} matched mesh rule {rule!r}")
        # The trainer, started with the pod's command on the target's chips, picks that rule.
        sc = instance_type_to_system_characteristics(instance_type)
        chips = sc.chips_per_slice * replicas
        monkeypatch.setattr(jax, "device_count", lambda chips=chips: chips)
        fv = _pod_flag_values(command)
        cfg = launch_trainer.get_trainer_config(flag_values=fv)
        shape = tuple(cfg.mesh_shape)
        assert math.prod(shape) == chips, (selector, shape)
        expected = launch_trainer.infer_mesh_shape(
            cfg.mesh_rules[[r for r, _ in cfg.mesh_rules].index(rule)][1], num_devices=chips
        )
        assert shape == expected, (selector, shape, expected)


def test_unmatched_selector_is_refused_before_building(home, active_config, capsys, monkeypatch):
    """gpt-tiny on tpu-v5p-16 (no rule): one error line, and the image is never built."""
    from axlearn.cloud.common.bundler import BuildPlan

    built = []
    monkeypatch.setattr(BuildPlan, "run", lambda self: built.append(self))
    (home.parent / "Dockerfile").write_text("FROM scratch\n")  # The build context is the cwd.
    argv = [a for a in _launch("tpu-v5p-16", "text.gpt.tiny", "gpt-tiny") if "--image" not in a]
    argv.insert(3, "--bundler_spec=allow_dirty=true")
    assert cli_main.main(argv) == 1
    err = capsys.readouterr().err
    assert built == []
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "axlearn gcp: error: --mesh_selector=tpu-v5p-16 matches none of "
        "text.gpt.tiny:gpt-tiny's mesh_rules ['cpu-fsdp', 'cpu-data2-fsdp', 'cpu-data2-model', "
        "'tpu-v5p-8(-2)?', 'tpu-(v5p-128-2|v6e-256)', 'gpu-a3-highgpu-8g-(8|16)']; closest "
        "selectors its rules match: tpu-v5p-8"
    )
    # An explicit mesh (a mesh_shape override) is accepted; the dry run says so.
    argv = _launch("tpu-v5p-16", "text.gpt.tiny", "gpt-tiny", "--dry_run", "--skip_preflight")
    argv.append("--config_override=mesh_shape=(1,-1,1,1,1,1)")
    assert cli_main.main(argv) == 0, capsys.readouterr().err
    assert "# Mesh: --mesh_selector=tpu-v5p-16: explicit mesh_shape (1, -1, 1, 1, 1, 1)" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "bad,message",
    [
        ("--config=gpt-tinyy", "Unknown config 'gpt-tinyy' in experiment module 'text.gpt.tiny'"),
        ("--module=text.gpt.tinyy", "text.gpt.tinyy"),
        ("--config_override=no_such_field=1", "no_such_field"),
    ],
)
def test_skip_preflight_still_builds_the_config(active_config, capsys, monkeypatch, bad, message):
    """--skip_preflight skips the compile only: a bad module, config or override is an error
    before anything is built or submitted."""
    from axlearn.cloud.common.bundler import BuildPlan
    from axlearn.cloud.gcp import k8s

    calls = []
    monkeypatch.setattr(BuildPlan, "run", lambda self: calls.append("build"))
    monkeypatch.setattr(k8s, "start", lambda *a, **k: calls.append("submit"))
    monkeypatch.setattr(k8s, "custom_objects_api", lambda *a, **k: calls.append("api"))
    argv = [a for a in _launch("tpu-v5p-8", "text.gpt.tiny", "gpt-tiny", "--skip_preflight")]
    key = bad.split("=", 1)[0]
    argv = [a for a in argv if not a.startswith(key + "=")] + [bad]
    assert cli_main.main(argv) == 1
    err = capsys.readouterr().err
    assert calls == []
    assert err.startswith("axlearn gcp: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "config,instance_type,replicas,expected",
    [
        ("fuji-7B-v3", "tpu-v5p-128", 2, "matched mesh rule 'tpu-v5p-.*' (mesh_rules[5])"),
        ("fuji-70B-v3", "tpu-v6e-256", 1, "matched mesh rule 'tpu-v6e-256' (mesh_rules[5])"),
        # AXLearn's own fuji rules: GPU meshes from 256 GPUs, v5p's fsdp=64 from 64 chips.
        ("fuji-7B-v3", "gpu-a3-highgpu-8g", 2, "error: --mesh_selector=gpu-a3-highgpu-8g-16 "),
        ("fuji-7B-v3", "tpu-v5p-8", 1, "which does not fit the job's 4 chips (Cannot infer"),
    ],
)
def test_fuji_dry_runs_use_axlearns_rules(
    active_config, capsys, config, instance_type, replicas, expected
):
    argv = _launch(instance_type, "text.gpt.c4_trainer", config, "--dry_run", "--skip_preflight")
    argv.insert(3, f"--num_replicas={replicas}")
    code = cli_main.main(argv)
    captured = capsys.readouterr()
    if expected.startswith("error: "):
        assert code == 1 and expected in captured.err and captured.err.count("\n") == 1
    elif "does not fit" in expected:
        assert code == 1 and expected in captured.err, captured.err
    else:
        assert code == 0, captured.err
        assert f"# Mesh: --mesh_selector={instance_type}" in captured.out
        assert expected in captured.out


def test_dry_run_of_fuji_70b_on_tpu_7x_resolves_axlearns_rule(home, capsys):
    """tpu-7x-128 (64 Ironwood chips, 128 devices) selects AXLearn's `tpu-7x-128` rule."""
    (home / ".axlearn.config").write_text(CONFIG)
    assert cli_main.main(["gcp", "config", "activate", "--label=v5p"]) == 0
    argv = [
        a.replace("tpu-v5p-128", "tpu-7x-128")
        .replace("--num_replicas=2", "--num_replicas=1")
        .replace("text.gpt.honeycrisp", "text.gpt.c4_trainer")
        .replace("honeycrisp-3B", "fuji-70B-v3")
        for a in EXAMPLE
    ]
    capsys.readouterr()
    assert cli_main.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "matched mesh rule 'tpu-7x-128' (mesh_rules[2])" in out
    assert "mesh_shape (1, -1, 1, 128, 1, 1)" in out
    assert "# Mesh on the 64 chips (128 devices): {" in out and "'fsdp': 128" in out
    manifest = yaml.safe_load(out.partition("\n---\n")[2])
    spec = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu7x"
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4x4"
