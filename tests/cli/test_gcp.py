"""Tests axlearn/cli/gcp.py: `axlearn gcp config|launch` as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from axlearn.cli import main as cli_main

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
    "--image=us-docker.pkg.dev/my-project/axlearn/axlearn:x", "--",
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
                                       "--dry_run", "--runner_name", "--priority", "stop"]),
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
