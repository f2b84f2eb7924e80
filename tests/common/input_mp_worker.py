"""One process of the 2-process input test (run by test_input_multiprocess.py).

Usage: python -m tests.common.input_mp_worker COORDINATOR PROCESS_ID OUT_DIR
"""

import os
import sys

import numpy as np

from axlearn.common import utils_spmd


def range_source(n: int):
    """{"x": 0..n-1}; does not shard itself (the Input shards it)."""

    def fn():
        import tensorflow as tf

        return tf.data.Dataset.range(n).map(lambda i: {"x": tf.cast(i, tf.int32)})

    return fn


def input_config(*, is_training: bool, n: int):
    """The Input both the test and the workers build."""
    from axlearn.common import input_tf_data
    from axlearn.common.config import config_for_function

    processor = (
        config_for_function(input_tf_data.shuffle).set(shuffle_buffer_size=8)
        if is_training
        else config_for_function(input_tf_data.identity)
    )
    return input_tf_data.Input.default_config().set(
        name="input",
        is_training=is_training,
        source=config_for_function(range_source).set(n=n),
        processor=processor,
        batcher=config_for_function(input_tf_data.batch).set(
            global_batch_size=4, pad_example_fn=input_tf_data.default_pad_example_fn
        ),
    )


def main():
    coordinator, process_id, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    utils_spmd.setup(
        jax_backend="cpu",
        distributed_coordinator=coordinator,
        num_processes=2,
        process_id=process_id,
    )
    import jax

    assert jax.process_count() == 2
    train = iter(input_config(is_training=True, n=100).instantiate(parent=None))
    train_x = np.stack([next(train)["x"] for _ in range(4)])
    # 9 examples: feed 0 gets 5 (3 batches of 2), feed 1 gets 4 (2 batches, padded to 3 so
    # that both processes run the same number of eval steps).
    evaluation = list(iter(input_config(is_training=False, n=9).instantiate(parent=None)))
    eval_x = np.stack([b["x"] for b in evaluation])
    np.savez(os.path.join(out_dir, f"process_{process_id}.npz"), train=train_x, eval=eval_x)


if __name__ == "__main__":
    main()
