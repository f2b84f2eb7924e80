"""One process of the Grain elastic-resume tests (run by test_input_grain_multiprocess.py).

Usage: python -m tests.common.input_grain_mp_worker COORDINATOR NUM_PROCESSES PROCESS_ID OUT_DIR
    NUM_BATCHES [STATE_FILE]

Reads NUM_BATCHES batches of `grain_input_config()` (from the start, or restored from
STATE_FILE, a state saved by process 0 of another run) and writes the example values it read and
its final state to OUT_DIR/process_<id>.json.
"""

import json
import os
import sys

import numpy as np

from axlearn.common import utils_spmd

# One epoch of the global order.
EPOCH = 40


def range_source():
    """A BuildDatasetFn: a shuffled, repeated range, sharded over processes, batches of 4."""
    import grain

    from axlearn.common.input_grain import per_feed_batch, shard_dataset

    def build(dispatch_config):
        ds = grain.MapDataset.range(EPOCH).seed(7).shuffle().repeat()
        ds = shard_dataset(ds, dispatch_config).map(lambda i: {"x": np.int64(i)})
        return per_feed_batch(ds, global_batch_size=4, dispatch_config=dispatch_config)

    return build


def grain_input_config():
    """The Grain Input every run builds (elastic resume on)."""
    from axlearn.common import input_grain
    from axlearn.common.config import config_for_function

    return input_grain.Input.default_config().set(
        name="input", source=config_for_function(range_source), elastic_resume=True
    )


def main():
    coordinator, num_processes, process_id, out_dir = sys.argv[1:5]
    num_processes, process_id = int(num_processes), int(process_id)
    num_batches = int(sys.argv[5])
    state_file = sys.argv[6] if len(sys.argv) > 6 else None
    if num_processes > 1:
        utils_spmd.setup(
            jax_backend="cpu",
            distributed_coordinator=coordinator,
            num_processes=num_processes,
            process_id=process_id,
        )
    import jax

    assert jax.process_count() == num_processes
    inp = grain_input_config().instantiate(parent=None)
    if state_file:
        with open(state_file, "rb") as f:
            it = inp.restore_iterator(f.read())
    else:
        it = iter(inp)
    seen = [int(x) for _ in range(num_batches) for x in next(it)["x"]]
    with open(os.path.join(out_dir, f"process_{process_id}.json"), "w", encoding="utf-8") as f:
        json.dump({"seen": seen, "state": inp.iterator_state(it).decode("utf-8")}, f)


if __name__ == "__main__":
    main()
