"""Trainers hand one run back and forth: AXLearn's `SpmdTrainer` and ours on one trainer dir.

Not run in CI: the AXLearn half needs AXLearn's own source and a Python 3.12 virtual environment
with its `core` dependencies (jax 0.8.3, optax, seqio, tensorflow, ...; see
`axlearn_interop_restore.py`).

The run is `fuji-test-v3` on `--data_dir=FAKE`, CPU, a checkpoint every 3 steps:
1. the AXLearn-written trainer dir of `tests/testdata/axlearn_checkpoints/fuji-test-v3` (steps 3
   and 6, AXLearn's layout) is copied to WORK_DIR/run;
2. ours (`launch_trainer_main`, max_step 9) restores AXLearn's step 6 and saves 9 (ours);
3. AXLearn's trainer (max_step 12) restores our step 9 unconverted and saves 12 (its layout);
4. ours (max_step 15) restores AXLearn's step 12 and saves 15.
Each run's restored step and its losses are read from its log; the JSON printed has them, the
layout of every step in the dir, and whether each restore happened.

Usage (from the repository root, in this project's venv):

    python benchmarks/axlearn_interop_trainer.py --work_dir /tmp/axtr \\
        --axlearn_python /tmp/axvenv/bin/python --axlearn_src /path/to/axlearn-source
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FUJI = os.path.join(_REPO, "tests", "testdata", "axlearn_checkpoints", "fuji-test-v3")
_COMMON_FLAGS = [
    "--module=text.gpt.c4_trainer",
    "--config=fuji-test-v3",
    "--data_dir=FAKE",
    "--jax_backend=cpu",
]


def _axlearn_main() -> None:
    """AXLearn's side (run by AXLearn's interpreter): its launcher, with max_step set."""
    # pylint: disable=import-outside-toplevel,import-error
    from absl import app, flags

    from axlearn.common import launch, launch_trainer

    flags.DEFINE_integer("interop_max_step", None, "max_step of this run.")

    def main(_):
        launch.setup()
        cfg = launch_trainer.get_trainer_config()
        max_step = flags.FLAGS.interop_max_step
        cfg.max_step = max_step
        cfg.checkpointer.save_policy.n = 3
        cfg.checkpointer.save_policy.max_step = max_step
        cfg.evalers = {}
        output = launch_trainer.run_trainer(cfg)
        print("INTEROP_OUTPUT " + json.dumps({"loss": float(output["loss"])}), flush=True)

    app.run(main, argv=[sys.argv[0]] + [a for a in sys.argv[1:] if a != "--axlearn_side"])


def _run(cmd: list[str], env: dict, log_path: str) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd="/")
    with open(log_path, "w", encoding="utf-8") as f:
        f.write(proc.stdout + "\n" + proc.stderr)
    text = proc.stdout + proc.stderr
    restored = re.findall(r"[Rr]estored (?:checkpoint )?(?:at )?step[ =]?(\d+)", text)
    restored += re.findall(r"Restored state from ckpt at step (\d+)", text)
    losses = re.findall(r"step[ =:]+(\d+)\D[^\n]*?loss[=: ]+([-0-9.e]+)", text)
    final = re.findall(r"INTEROP_OUTPUT (\{.*\})", text)
    return dict(
        returncode=proc.returncode,
        final=json.loads(final[-1]) if final else None,
        seconds=round(time.perf_counter() - start, 1),
        restored=sorted({int(s) for s in restored}),
        losses={int(s): float(v) for s, v in losses},
        log=log_path,
        tail=proc.stderr[-600:] if proc.returncode else "",
    )


def main() -> int:
    """Runs the four steps above; prints one JSON object."""
    if "--axlearn_side" in sys.argv:
        _axlearn_main()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--axlearn_python", default="/tmp/axvenv/bin/python")
    parser.add_argument("--axlearn_src", required=True, help="AXLearn's source (PYTHONPATH).")
    args = parser.parse_args()
    run_dir = os.path.join(args.work_dir, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(_FUJI, run_dir)
    ours_env = dict(os.environ, PYTHONPATH=_REPO, JAX_PLATFORMS="cpu")
    ax_env = dict(os.environ, PYTHONPATH=args.axlearn_src, JAX_PLATFORMS="cpu")
    for env in (ours_env, ax_env):
        env.pop("XLA_FLAGS", None)

    def ours(max_step: int) -> dict:
        cmd = [sys.executable, "-m", "axlearn.common.launch_trainer_main", *_COMMON_FLAGS]
        cmd += [f"--trainer_dir={run_dir}", f"--config_override=max_step={max_step}"]
        cmd += ["--config_override=checkpointer.save_policy.n=3"]
        return _run(cmd, ours_env, os.path.join(args.work_dir, f"ours_{max_step}.log"))

    def axlearn(max_step: int) -> dict:
        cmd = [args.axlearn_python, os.path.abspath(__file__), "--axlearn_side", *_COMMON_FLAGS]
        cmd += [f"--trainer_dir={run_dir}", f"--interop_max_step={max_step}"]
        return _run(cmd, ax_env, os.path.join(args.work_dir, f"axlearn_{max_step}.log"))

    results = {"ours_to_9": ours(9)}
    results["axlearn_to_12"] = axlearn(12)
    results["ours_to_15"] = ours(15)
    sys.path.insert(0, _REPO)
    from axlearn.common.checkpointer import layout  # pylint: disable=import-outside-toplevel

    steps = {}
    for step, path in layout.step_dirs(os.path.join(run_dir, "checkpoints")):
        index = layout.read_index_file(path)
        steps[step] = index.get("layout") or f"ours (format {index['version']})"
    results["steps"] = steps
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
