"""Runs a suite of named training cases into one directory, for `axlearn compare --suite`.

Each case is a short real training run through `SpmdTrainer`, written to `OUT_DIR/<case>/` (a
trainer directory: metrics.jsonl, run_summary.json, trainer_config, ...). Run it on main and on a
branch, then compare:

    python benchmarks/suite.py --out_dir=/tmp/suite_main     # on main
    python benchmarks/suite.py --out_dir=/tmp/suite_branch   # on the branch
    axlearn compare --suite /tmp/suite_main /tmp/suite_branch

Cases (named like the reference's test cases):
    01_main_job                  gpt-tiny, the README's main job (shortened by --steps)
    02_fake_p1                   P1 (docs/performance.md's workload) on FAKE data, 1 device
    03_checkpoint_async_every_10 gpt-tiny, an async checkpoint every 10 steps
    04_pdb_lt_1                  gpt-tiny, global batch 4 on 8 CPU devices (per-device batch 0.5:
                                 mesh data=4 x model=2)
    05_grad_accumulation         gpt-tiny, 4 microbatches per step (with_minibatch_steps)
    06_fp16_loss_scaling         gpt-tiny in float16 with dynamic loss scaling

Each case runs in its own process (the 8-device case needs XLA_FLAGS before JAX starts). Prints
one JSON object: per case the trainer dir, exit code and wall time.

Usage: python benchmarks/suite.py --out_dir DIR [--steps 60] [--cases 01_main_job,02_fake_p1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)


def _tiny(steps: int, **kwargs):
    from axlearn.experiments.text.gpt.tiny import tiny_trainer_config  # pylint: disable=import-outside-toplevel

    return tiny_trainer_config(
        max_step=steps,
        eval_every_n_steps=kwargs.pop("eval_every_n_steps", max(1, steps // 2)),
        checkpoint_every_n_steps=kwargs.pop("checkpoint_every_n_steps", steps),
        **kwargs,
    )


def _main_job(steps: int):
    return _tiny(steps)


def _fake_p1(steps: int):
    sys.path.insert(0, _HERE)
    from p1 import p1_trainer_config  # pylint: disable=import-outside-toplevel

    from axlearn.common.device_peak import measure_matmul_flops  # pylint: disable=import-outside-toplevel

    return p1_trainer_config(
        "", max_step=steps, peak_flops_per_device=measure_matmul_flops(dim=512, repeats=2)
    )


def _checkpoint_every_10(steps: int):
    return _tiny(steps, checkpoint_every_n_steps=10)


def _pdb_lt_1(steps: int):
    cfg = _tiny(steps, global_batch_size=4)
    names = list(cfg.mesh_axis_names)
    shape = [1] * len(names)
    shape[names.index("data")] = 4
    shape[names.index("model")] = 2
    cfg.mesh_shape = tuple(shape)
    cfg.mesh_rules = None
    return cfg


def _grad_accumulation(steps: int):
    from axlearn.common.config import config_for_function  # pylint: disable=import-outside-toplevel
    from axlearn.common.gradient_accumulation import (  # pylint: disable=import-outside-toplevel
        with_minibatch_steps,
    )

    cfg = _tiny(steps)
    cfg.learner.forward_fn_transformation = config_for_function(with_minibatch_steps).set(steps=4)
    return cfg


def _fp16(steps: int):
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

    from axlearn.common.loss_scale import DynamicLossScaler  # pylint: disable=import-outside-toplevel

    cfg = _tiny(steps)
    cfg.train_dtype = jnp.float16
    cfg.learner.loss_scaler = DynamicLossScaler.default_config()
    return cfg


# name -> (config builder taking the step count, CPU devices).
CASES: dict[str, tuple[Callable, int]] = {
    "01_main_job": (_main_job, 1),
    "02_fake_p1": (_fake_p1, 1),
    "03_checkpoint_async_every_10": (_checkpoint_every_10, 1),
    "04_pdb_lt_1": (_pdb_lt_1, 8),
    "05_grad_accumulation": (_grad_accumulation, 1),
    "06_fp16_loss_scaling": (_fp16, 1),
}


def _run_case(name: str, trainer_dir: str, steps: int) -> None:
    """Runs one case in this process (called in the case's own subprocess)."""
    import jax  # pylint: disable=import-outside-toplevel

    from axlearn.common.launch_trainer import run_trainer  # pylint: disable=import-outside-toplevel

    builder, _ = CASES[name]
    cfg = builder(steps)
    cfg.dir = trainer_dir
    if cfg.mesh_shape is not None and -1 in tuple(cfg.mesh_shape):
        from axlearn.common.utils_spmd import (  # pylint: disable=import-outside-toplevel
            infer_mesh_shape,
        )

        cfg.mesh_shape = infer_mesh_shape(cfg.mesh_shape)
    del jax
    run_trainer(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out_dir", required=True, help="Suite directory (one dir per case).")
    parser.add_argument("--steps", type=int, default=60, help="Training steps per case.")
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"Comma-separated cases from: {', '.join(CASES)}"
    )
    parser.add_argument("--_case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._case:
        _run_case(args._case, args.out_dir, args.steps)
        return
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    os.makedirs(args.out_dir, exist_ok=True)
    results = {}
    for name in names:
        _, devices = CASES[name]
        trainer_dir = os.path.join(args.out_dir, name)
        env = dict(os.environ)
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
        ).strip()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        start = time.perf_counter()
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            f"--_case={name}",
            f"--out_dir={trainer_dir}",
            f"--steps={args.steps}",
        ]
        with open(os.path.join(args.out_dir, f"{name}.log"), "w", encoding="utf-8") as log:
            rc = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        results[name] = dict(
            trainer_dir=trainer_dir, returncode=rc, wall_s=round(time.perf_counter() - start, 1)
        )
        print(f"{name}: rc={rc} in {results[name]['wall_s']} s", file=sys.stderr)
    print(json.dumps(dict(out_dir=args.out_dir, steps=args.steps, cases=results), indent=2))
    if any(r["returncode"] for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
