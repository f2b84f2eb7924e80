"""Restores steps written by our AXLearn-layout writer with Apple's AXLearn itself (interop proof).

Not run in CI: the restore half needs AXLearn's own source and a Python 3.12 virtual environment
with what its `checkpointer.py` imports (jax 0.8.3, tensorstore, tensorflow-cpu, absl-py,
msgpack), e.g.

    python3.12 -m venv /tmp/axvenv
    /tmp/axvenv/bin/pip install jax==0.8.3 jaxlib==0.8.3 tensorstore absl-py==2.3.1 msgpack \\
        tensorflow-cpu==2.19.1 attrs typing-extensions

Usage (from the repository root, in this project's venv):

    python benchmarks/axlearn_interop_restore.py --work_dir /tmp/interop \\
        --axlearn_python /tmp/axvenv/bin/python --axlearn_src /path/to/axlearn-source

The `write` half (this project's venv) writes, under WORK_DIR, with `axlearn_layout_write`:
- `fuji/step_00000006`: the AXLearn-written fixture step (tests/testdata/axlearn_checkpoints/
  fuji-test-v3) converted to our layout by `axlearn checkpoint convert`, then back to AXLearn's;
- `synthetic/step_00000004`: a state saved by our `Checkpointer` (float32 with NaN and -0.0,
  bfloat16, an int32 scalar, a 2-way sharded float32 array: chunks `0.0` and `1.0`, a threefry
  `prng_key` written as rbg) converted to AXLearn's layout; `synthetic_expected.npz` its values;
- `tf/step_00000001`: the tf.data iterator fixture, through our layout and back;
- `ours/step_00000004`: the synthetic step as our `Checkpointer` saves it (format 2: AXLearn's
  list `index` beside our `manifest.json`), restored by AXLearn unconverted (its threefry
  `prng_key` stays uint32[2]);
- `ours_v1/step_00000004`: the same step rewritten in our format 1 (our index in `index`),
  which AXLearn is expected to refuse.

The `restore` half (`--mode restore`, run by the AXLearn interpreter with AXLearn's source on
PYTHONPATH) restores each with AXLearn's `Checkpointer.restore` (state spec from AXLearn's
`read_state_spec`, a one-device mesh), compares every value bit for bit with the expected ones
(the fuji step with AXLearn's restore of the original fixture), and prints one JSON line of
results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FIXTURES = os.path.join(_REPO, "tests", "testdata", "axlearn_checkpoints")
_FUJI6 = os.path.join(_FIXTURES, "fuji-test-v3", "checkpoints", "step_00000006")
_TF1 = os.path.join(_FIXTURES, "tf-iterator", "step_00000001")


def write(work_dir: str) -> dict:
    """Writes the steps (this project's venv).

    Args:
        work_dir: An empty (or missing) scratch directory.

    Returns:
        {case: what the writer reported}.
    """
    # pylint: disable=import-outside-toplevel
    import jax
    import numpy as np

    from axlearn.cli.main import main
    from axlearn.common.checkpointer import Checkpointer
    from axlearn.common.checkpointer import axlearn_layout_write as writer

    out = {}
    for name, src, step in (("fuji", _FUJI6, 6), ("tf", _TF1, 1)):
        ours = os.path.join(work_dir, f"{name}_ours")
        assert main(["checkpoint", "convert", src, ours]) == 0
        result = writer.convert_step_dir(
            os.path.join(ours, f"step_{step:08d}"), work_dir + "/" + name
        )
        out[name] = dict(
            chunks=result.num_chunks, raw=result.raw_bytes, zstd=result.chunk_file_bytes
        )
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    w[0, 0], w[0, 1] = np.nan, -0.0
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("fsdp",))
    sharded = jax.device_put(
        np.arange(16, dtype=np.float32).reshape(4, 4) / 3,
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp")),
    )
    state = {
        "model": {"w": w, "b": jax.numpy.asarray([1.5, -2.25, 3e-3], jax.numpy.bfloat16)},
        "count": np.int32(-7),
        "sharded": sharded,
        "prng_key": np.array([0xDEADBEEF, 17], np.uint32),
    }
    ckptr = Checkpointer.default_config().set(name="c", dir=work_dir + "/ours")
    ckptr = ckptr.instantiate(parent=None)
    ckptr.save(step=4, state=state)
    ckptr.wait_until_finished()
    ckptr.stop()
    result = writer.convert_step_dir(work_dir + "/ours/step_00000004", work_dir + "/synthetic")
    out["synthetic"] = dict(chunks=result.num_chunks, raw=result.raw_bytes)
    out["synthetic_chunks_of_sharded"] = sorted(
        os.listdir(work_dir + "/synthetic/step_00000004/gda/sharded")
    )
    expected = {
        "model/w": w,
        "model/b": np.asarray(state["model"]["b"]).view(np.uint16),  # npz has no bfloat16.
        "count": np.asarray(state["count"]),
        "sharded": np.asarray(sharded),
        "prng_key": np.array([0xDEADBEEF, 17, 0xDEADBEEF, 17], np.uint32),
    }
    np.savez(work_dir + "/synthetic_expected.npz", **expected)
    # Format 1 (before manifest.json): our index in `index`.
    import shutil

    shutil.copytree(work_dir + "/ours", work_dir + "/ours_v1")
    step_dir = work_dir + "/ours_v1/step_00000004"
    with open(step_dir + "/manifest.json", encoding="utf-8") as f:
        index = json.load(f)
    index["version"] = 1
    with open(step_dir + "/index", "w", encoding="utf-8") as f:
        json.dump(index, f)
    os.remove(step_dir + "/manifest.json")
    return out


def _axlearn_restore(step_dir: str, *, tf_iterator=None):
    """AXLearn's `Checkpointer.restore` of one step directory; returns (step, flat values)."""
    # pylint: disable=import-outside-toplevel
    import jax
    import numpy as np

    from axlearn.common import checkpointer, utils

    spec = checkpointer.read_state_spec(step_dir)
    if tf_iterator is not None:
        spec["input_iter"] = tf_iterator
    ckptr = checkpointer.Checkpointer.default_config().set(name="ax", dir=os.path.dirname(step_dir))
    ckptr = ckptr.instantiate(parent=None)
    with jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)):
        step, state = ckptr.restore(step=checkpointer.parse_step_from_dir(step_dir), state=spec)
    ckptr.stop()
    return step, {path: value for path, value in utils.flatten_items(state) if path != "input_iter"}


def _same(a, b) -> bool:
    import numpy as np  # pylint: disable=import-outside-toplevel

    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def restore(work_dir: str) -> dict:
    """Restores the written steps with AXLearn (run by AXLearn's interpreter).

    Args:
        work_dir: The directory `write` filled.

    Returns:
        The results: per case, the step, leaves restored, leaves differing.
    """
    # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp
    import numpy as np
    import tensorflow as tf

    results = {}
    step, got = _axlearn_restore(work_dir + "/fuji/step_00000006")
    _, want = _axlearn_restore(_FUJI6)
    results["fuji"] = dict(
        step=step,
        leaves=len(got),
        differing=[p for p in want if p not in got or not _same(got[p], want[p])],
    )
    step, got = _axlearn_restore(work_dir + "/synthetic/step_00000004")
    with np.load(work_dir + "/synthetic_expected.npz", allow_pickle=False) as f:
        want = dict(f)
    want["model/b"] = want["model/b"].view(jnp.bfloat16)
    results["synthetic"] = dict(
        step=step,
        leaves=len(got),
        differing=[p for p in want if p not in got or not _same(got[p], want[p])],
        dtypes={p: str(np.asarray(v).dtype) for p, v in got.items()},
    )
    it = iter(tf.data.Dataset.range(10))
    step, got = _axlearn_restore(work_dir + "/tf/step_00000001", tf_iterator=it)
    results["tf"] = dict(
        step=step,
        next_elements=[int(next(it)) for _ in range(2)],  # AXLearn saved it at position 2.
        w_equal=bool(np.array_equal(np.asarray(got["w"]), np.arange(12.0).reshape(3, 4))),
        n=int(np.asarray(got["n"])),
    )
    step, got = _axlearn_restore(work_dir + "/ours/step_00000004")
    want["prng_key"] = want["prng_key"][:2]  # Saved as the threefry key it was.
    results["ours_native"] = dict(
        step=step,
        leaves=len(got),
        differing=[p for p in want if p not in got or not _same(got[p], want[p])],
        dtypes={p: str(np.asarray(v).dtype) for p, v in got.items()},
    )
    try:
        _axlearn_restore(work_dir + "/ours_v1/step_00000004")
        results["ours_format_1"] = "restored (unexpected)"
    except Exception as e:  # pylint: disable=broad-except
        results["ours_format_1"] = f"{type(e).__name__}: {e}"[:200]
    return results


def main() -> int:
    """Runs `write` here, then `restore` with the AXLearn interpreter; prints the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work_dir", required=True)
    parser.add_argument("--mode", choices=("all", "write", "restore"), default="all")
    parser.add_argument("--axlearn_python", default="/tmp/axvenv/bin/python")
    parser.add_argument("--axlearn_src", default=None, help="AXLearn's source (for PYTHONPATH).")
    args = parser.parse_args()
    if args.mode == "restore":
        print(json.dumps(restore(args.work_dir)))
        return 0
    if args.mode in ("all", "write"):
        os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
        print(json.dumps({"written": write(args.work_dir)}))
    if args.mode == "all":
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("XLA_FLAGS", None)
        if args.axlearn_src:
            env["PYTHONPATH"] = args.axlearn_src
        cmd = [args.axlearn_python, os.path.abspath(__file__), "--mode=restore"]
        cmd += ["--work_dir", args.work_dir]
        return subprocess.run(cmd, env=env, cwd="/", check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
