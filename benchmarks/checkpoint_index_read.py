"""Benchmark: the cost of reading a checkpoint's index and checking its metadata, per 1,000 leaves.

Builds one step directory holding `--leaves` array leaves (each a `gda/<layer>/<leaf>` directory
with a `.zarray` and one chunk) and its `index`, then times, in a fresh process per measurement:
- `read_index_file`: reading, parsing and validating the index (every leaf's `file` checked);
- `check_metadata`: the index against the tree plus every `.zarray` read and compared (what every
  restore, `verify` and garbage collection do before reading chunks).
Each measurement is the median of `--repeats` calls. With `--baseline_src=DIR` (another checkout
of axlearn, e.g. the commit before a change) the two sources are measured interleaved, `--trials`
times each (>= 3), and medians of the trials are compared. Prints JSON.

Usage: python benchmarks/checkpoint_index_read.py [--leaves 1000] [--trials 3]
           [--baseline_src DIR] [--dir DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MEASURE = r"""
import json, os, statistics, sys, time
from axlearn.common.checkpointer import layout, metadata
step_dir, repeats = sys.argv[1], int(sys.argv[2])
index = layout.read_index_file(step_dir)
assert not metadata.check_metadata(step_dir, index)
out = {}
for name, fn in (
    ("read_index_file", lambda: layout.read_index_file(step_dir)),
    ("check_metadata", lambda: metadata.check_metadata(step_dir, index)),
):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    out[name] = statistics.median(times)
out["leaves"] = len(index["leaves"])
print(json.dumps(out))
"""


def build_step(base: str, leaves: int) -> str:
    """Writes a step directory of `leaves` float32 [4, 4] array leaves through the checkpointer.

    Args:
        base: The checkpointer directory.
        leaves: The number of array leaves.

    Returns:
        The step directory.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # pylint: disable=import-outside-toplevel
    import numpy as np

    from axlearn.common.checkpointer import Checkpointer, every_n_steps_policy
    from axlearn.common.config import config_for_function

    state = {
        f"layer{i // 10}": {f"w{i % 10}": np.full((4, 4), i, np.float32)}
        for i in range(leaves)
    }
    # Nested two deep, as model parameters are: `gda/layer<k>/w<j>`.
    state = {"model": state}
    ckpt = (
        Checkpointer.default_config()
        .set(name="ckpt", dir=base, save_policy=config_for_function(every_n_steps_policy).set(n=1))
        .instantiate(parent=None)
    )
    ckpt.save(step=1, state=state)
    ckpt.stop()
    return os.path.join(base, "step_00000001")


def measure(src: str, step_dir: str, repeats: int) -> dict:
    """Runs one measurement in a fresh process importing axlearn from `src`.

    Args:
        src: A checkout of axlearn (its root).
        step_dir: The step directory.
        repeats: Calls per timed function (the median is reported).

    Returns:
        {"read_index_file": s, "check_metadata": s, "leaves": n}.
    """
    env = dict(os.environ, PYTHONPATH=src, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, step_dir, str(repeats)],
        env=env,
        cwd=src,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    """Parses flags, builds the step, measures interleaved and prints JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=1000, help="Array leaves in the index.")
    parser.add_argument("--trials", type=int, default=3, help="Interleaved trials (>= 3).")
    parser.add_argument("--repeats", type=int, default=20, help="Calls per measurement.")
    parser.add_argument("--baseline_src", default=None, help="Another checkout to compare.")
    parser.add_argument("--dir", default=None, help="Scratch directory (default: a temp dir).")
    args = parser.parse_args()
    if args.trials < 3:
        parser.error("--trials must be >= 3")
    load_before = os.getloadavg()
    base = args.dir or tempfile.mkdtemp(prefix="index_read_")
    step_dir = build_step(os.path.join(base, "ckpt"), args.leaves)
    sources = {"current": _ROOT}
    if args.baseline_src:
        sources = {"baseline": os.path.abspath(args.baseline_src), **sources}
    trials: dict[str, list[dict]] = {name: [] for name in sources}
    for trial in range(args.trials):
        order = list(sources) if trial % 2 == 0 else list(reversed(sources))
        for name in order:
            trials[name].append(measure(sources[name], step_dir, args.repeats))
    per_1000 = 1000 / args.leaves
    result = dict(leaves=args.leaves, trials=args.trials, repeats=args.repeats, per_1000_leaves={})
    for name, rows in trials.items():
        result["per_1000_leaves"][name] = {
            key: dict(
                median_ms=round(statistics.median(r[key] for r in rows) * 1e3 * per_1000, 3),
                trials_ms=[round(r[key] * 1e3 * per_1000, 3) for r in rows],
            )
            for key in ("read_index_file", "check_metadata")
        }
    if "baseline" in trials:
        result["ratio_current_over_baseline"] = {
            key: round(
                result["per_1000_leaves"]["current"][key]["median_ms"]
                / result["per_1000_leaves"]["baseline"][key]["median_ms"],
                3,
            )
            for key in ("read_index_file", "check_metadata")
        }
    # The shared machine's load: timings are comparable within one run only.
    result.update(load_average_before=load_before, load_average_after=os.getloadavg())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
