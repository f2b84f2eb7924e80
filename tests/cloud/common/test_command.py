"""Tests axlearn/cloud/common/command.py: the trainer flags a launch adds."""

from axlearn.cloud.common.command import complete_trainer_command

TRAINER = ["python", "-m", "axlearn.common.launch_trainer_main", "--module=m", "--config=c"]


def test_adds_missing_flags_only():
    got = complete_trainer_command(
        TRAINER + ["--jax_backend", "cpu"],
        mesh_selector="tpu-v5p-128",
        jax_backend="tpu",
        trainer_dir="gs://b/x",
    )
    assert got == TRAINER + [
        "--jax_backend",
        "cpu",
        "--mesh_selector=tpu-v5p-128",
        "--trainer_dir=gs://b/x",
    ]


def test_other_commands_unchanged():
    cmd = ["bash", "-c", "echo hi"]
    assert complete_trainer_command(cmd, mesh_selector="x", trainer_dir="y") == cmd
