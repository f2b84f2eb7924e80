"""Tests for `axlearn eval` and `axlearn generate` (axlearn/cli/inference_commands.py).

The session fixture `trained_dir` (tests/trained_run.py) trains
`tests.common.trainer_mp_experiment:gpt-tiny-eval` (1 layer of dim 64, 6 steps on the embedded
corpus, an eval and a checkpoint at step 6) with launch_trainer_main; the commands then run on
its trainer dir as subprocesses, as a user runs them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.trained_run import MODULE, REPO_ROOT, _env, axlearn


def _tb_scalars(path: str) -> dict[str, dict[int, float]]:
    # pylint: disable-next=import-outside-toplevel
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            value = tf.make_ndarray(event.tensor_proto)
            if value.dtype.kind in "fiu" and value.ndim == 0:
                out.setdefault(tag, {})[event.step] = float(value)
    return out


@pytest.mark.slow
def test_eval_reproduces_the_runs_validation_metrics_on_another_mesh(trained_dir):
    trained = _tb_scalars(os.path.join(trained_dir, "summaries", "validation"))
    assert 6 in trained["loss"]
    # Two devices (the run had one): the checkpoint is resharded; the numbers must not move.
    proc = axlearn("eval", f"--trainer_dir={trained_dir}", f"--module={MODULE}", devices=2)
    assert "Evaluating step 6 of" in proc.stdout
    printed = {}
    for line in proc.stdout.splitlines():
        if line.startswith("validation/"):
            key, value = line.split()
            printed[key.split("/", 1)[1]] = float(value)
    evaluated = _tb_scalars(os.path.join(trained_dir, "summaries", "eval_only", "validation"))
    metrics = ["loss", "accuracy", "perplexity", "bits_per_byte", "num_targets"]
    for name in metrics:
        expected = trained[name][6]
        np.testing.assert_allclose(printed[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(evaluated[name][6], expected, rtol=1e-5, atol=1e-5)
    # Nothing was trained: the checkpoints and metrics.jsonl are as the run left them.
    # (The checkpoint dir also holds the run lock, `run.lock`.)
    ckpt_dir = os.path.join(trained_dir, "checkpoints")
    assert sorted(n for n in os.listdir(ckpt_dir) if n != "run.lock") == ["step_00000006"]


def test_eval_errors_name_the_problem(trained_dir, tmp_path):
    proc = axlearn("eval", f"--trainer_dir={tmp_path}", check=False)
    assert proc.returncode == 1
    assert "launch_trainer_flags does not exist" in proc.stderr
    proc = axlearn(
        "eval", f"--trainer_dir={trained_dir}", f"--module={MODULE}", "--evaler=valid", check=False
    )
    assert proc.returncode == 1 and "Unknown evaler(s) ['valid']" in proc.stderr
    proc = axlearn(
        "eval", f"--trainer_dir={trained_dir}", f"--module={MODULE}", "--step=3", check=False
    )
    assert proc.returncode == 1 and "Cannot restore step 3: no such step" in proc.stderr
    # Case 13 of issue 29: the message lists the committed steps, in one line, no traceback.
    assert "committed steps: [6]. Pass one of them as --step" in proc.stderr
    assert "Traceback" not in proc.stderr


def _generate(trained_dir: str, *extra: str) -> str:
    proc = axlearn(
        "generate",
        f"--trainer_dir={trained_dir}",
        f"--module={MODULE}",
        "--prompt=The Python",
        "--max_new_tokens=12",
        "--temperature=3.0",
        *extra,
    )
    return proc.stdout


@pytest.mark.slow
def test_generate_prints_text_deterministic_per_seed_and_streams_on_a_terminal(trained_dir):
    import pty

    first = _generate(trained_dir, "--seed=0")
    assert first.startswith("The Python") and len(first.strip()) > len("The Python")
    assert _generate(trained_dir, "--seed=0") == first
    # On a terminal the tokens stream (same seed, same text).
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "axlearn.cli.main",
            "generate",
            f"--trainer_dir={trained_dir}",
            f"--module={MODULE}",
            "--prompt=The Python",
            "--max_new_tokens=12",
            "--temperature=3.0",
            "--seed=0",
        ],
        env=_env(1),
        cwd=REPO_ROOT,
        stdout=terminal,
        stderr=subprocess.DEVNULL,
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            data = os.read(controller, 4096)
        except OSError:  # EIO: the child closed the terminal.
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=600) == 0
    os.close(controller)
    streamed = b"".join(chunks).decode().replace("\r\n", "\n")
    assert streamed == first
    # The prompt is shown before the first token is computed: output came in several pieces.
    assert len(chunks) > 1


def test_generate_rejects_bad_flags(tmp_path):
    proc = axlearn(
        "generate", f"--trainer_dir={tmp_path}", "--prompt=x", "--top_p=1.5", check=False
    )
    assert proc.returncode == 1 and "--top_p must be in (0, 1], got 1.5" in proc.stderr
    proc = axlearn("generate", f"--trainer_dir={tmp_path}", check=False)
    assert proc.returncode == 1 and "at least one --prompt" in proc.stderr


@pytest.mark.slow
def test_generate_starts_without_accelerator_probe_errors_and_bounds_the_context(trained_dir):
    """Issue 38: `axlearn generate` on a machine without a TPU or GPU (JAX_PLATFORMS unset, as a
    user runs it) prints no libtpu `unexpected worker hostname` or `cuInit` E-lines, and an
    absurd `--max_new_tokens` is one line naming the context instead of a native abort."""
    env = _env(1)
    env.pop("JAX_PLATFORMS")
    for name in list(env):
        if name.startswith("TPU_") or name in (
            "TF_CPP_MIN_LOG_LEVEL",
            "ALLOW_MULTIPLE_LIBTPU_LOAD",
        ):
            env.pop(name)

    def generate(*extra):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "axlearn.cli.main",
                "generate",
                f"--trainer_dir={trained_dir}",
                f"--module={MODULE}",
            ]
            + ["--prompt=The", *extra],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    proc = generate("--max_new_tokens=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unexpected worker hostname" not in proc.stderr and "cuInit" not in proc.stderr
    assert "\nE0000" not in "\n" + proc.stderr, proc.stderr[-3000:]
    proc = generate("--max_new_tokens=1000000000")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert last.startswith("axlearn generate: error: --max_new_tokens=1000000000: the prompt")
    assert "exceed the model's context of 32 tokens" in last, last


def test_a_custom_module_not_importable_here_is_one_line_naming_the_fix(tmp_path):
    """Issue 55 case 5: the run of a custom module, `generate`/`eval` from another folder."""
    import json  # pylint: disable=import-outside-toplevel

    run = tmp_path / "run"
    run.mkdir()
    record = {"module": "nu_my_exp", "config": "my-tiny"}
    record["module_file"] = "/work/exps/nu_my_exp.py"
    (run / "launch_trainer_flags").write_text(json.dumps(record))
    for command in (["eval"], ["generate", "--prompt=x"]):
        proc = axlearn(*command, f"--trainer_dir={run}", check=False)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "--module=nu_my_exp (it was imported from /work/exps/nu_my_exp.py" in last, last
        assert "PYTHONPATH=/work/exps axlearn" in last and "--module=MODULE" in last, last
