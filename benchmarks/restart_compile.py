"""What a restart of the main job costs with JAX's persistent compilation cache, vs a cold start.

Each round runs the README's main job (`gpt-tiny`, 8 CPU devices) twice in one fresh trainer dir:

- cold: `--config_override=max_step=2`, with an empty cache (`<trainer_dir>/compilation_cache`,
  the default): it compiles the train step and writes it to the cache;
- restart: the same command with `max_step=4`, as a restarted attempt: it restores step 2 and
  loads the train step from the cache (max_step is not part of the compiled step).

For each run it reads, from the run's own records: the compile part (`compile_s` of
run_summary.json: the train step's AOT compile, or its load from the cache), whether the step
came from the cache (the trainer's "Compiled the train step" log line), and the time from
process start to the first step (`axlearn goodput`'s start-up part of that attempt: imports,
device set-up, init or restore, compile). It prints JSON: the rounds and the medians of the
ratios restart / cold.

    python benchmarks/restart_compile.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from axlearn.common import goodput  # noqa: E402  (after the path is set)

_COMPILED = re.compile(r"Compiled the train step in ([0-9.]+) s \(([^)]*)\)")


def run_once(trainer_dir: str, *, max_step: int) -> dict:
    """Runs the main job to `max_step` in `trainer_dir`; returns its compile facts."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    cmd = [
        sys.executable, "-m", "axlearn.common.launch_trainer_main",
        "--module=text.gpt.tiny", "--config=gpt-tiny", f"--trainer_dir={trainer_dir}",
        "--jax_backend=cpu", f"--config_override=max_step={max_step}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    match = _COMPILED.search(proc.stderr)
    with open(os.path.join(trainer_dir, "run_summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    attempt = goodput.compute_goodput(trainer_dir).attempts[-1]
    return dict(
        compile_s=summary.get("compile_s"),
        cache=match.group(2) if match else None,
        start_to_first_step_s=attempt.parts["startup"],
    )


def main() -> None:
    """Runs the rounds and prints the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="Cold/restart pairs to run.")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="restart_compile_")
    rounds = []
    try:
        for _ in range(args.rounds):
            trainer_dir = tempfile.mkdtemp(dir=root)
            cold = run_once(trainer_dir, max_step=2)
            restart = run_once(trainer_dir, max_step=4)
            rounds.append(
                dict(
                    cold=cold,
                    restart=restart,
                    compile_ratio=restart["compile_s"] / cold["compile_s"],
                    start_to_first_step_ratio=(
                        restart["start_to_first_step_s"] / cold["start_to_first_step_s"]
                    ),
                )
            )
            print(json.dumps(rounds[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            dict(
                rounds=rounds,
                median_compile_ratio=statistics.median(r["compile_ratio"] for r in rounds),
                median_start_to_first_step_ratio=statistics.median(
                    r["start_to_first_step_ratio"] for r in rounds
                ),
                median_cold_compile_s=statistics.median(r["cold"]["compile_s"] for r in rounds),
                median_restart_compile_s=statistics.median(
                    r["restart"]["compile_s"] for r in rounds
                ),
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
