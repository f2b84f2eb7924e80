"""Tests axlearn/common/input_dispatch.py (and utils.dispatch_input_batch)."""

import jax
import numpy as np
import pytest

from axlearn.common.input_dispatch import InputDispatcher
from axlearn.common.utils import PHYSICAL_TO_LOGICAL_DISPATCH_KEY, dispatch_input_batch


def _dispatcher(**kwargs) -> InputDispatcher:
    return (
        InputDispatcher.default_config().set(name="dispatcher", **kwargs).instantiate(parent=None)
    )


def _feed_batch(feed: int, rows: int) -> dict:
    """A per-feed batch whose values identify the feed and row (targets all >= 1)."""
    ids = 10 * (feed + 1) + np.arange(rows * 3, dtype=np.int32).reshape(rows, 3)
    return {"input_ids": ids, "target_labels": ids + 1, "nested": {"w": ids.astype(np.float32)}}


def test_logical_2_over_4_feeds_pads_to_physical_4():
    # Hand-computed: logical feeds [0, 1] (default: min(2, 4) feeds) with one example each;
    # feeds 2 and 3 send one padding row each; physical batch 4 with 2 padding rows.
    feeds = [
        _dispatcher(
            global_logical_batch_size=2,
            global_physical_batch_size=4,
            num_physical_feeds=4,
            physical_feed_index=i,
        )
        for i in range(4)
    ]
    assert [d.logical_feed_index for d in feeds] == [0, 1, None, None]
    assert feeds[0].feed_logical_batch_size == 1 and feeds[0].feed_physical_batch_size == 1
    assert [d.feed_read_config() for d in feeds] == [
        dict(num_shards=2, shard_index=0),
        dict(num_shards=2, shard_index=1),
        dict(num_shards=2, shard_index=0),
        dict(num_shards=2, shard_index=1),
    ]
    logical_inputs = [_feed_batch(i, 1) for i in range(4)]
    physical = [d.logical_to_physical_batch(b) for d, b in zip(feeds, logical_inputs)]
    dispatch = np.concatenate([p[PHYSICAL_TO_LOGICAL_DISPATCH_KEY] for p in physical])
    np.testing.assert_array_equal(dispatch, [[1, 0], [0, 1], [0, 0], [0, 0]])
    # Padding feeds send zeros (no targets: label 0 rows that the dispatch drops).
    for p in physical[2:]:
        np.testing.assert_array_equal(p["target_labels"], 0)
    global_physical = jax.tree.map(lambda *xs: np.concatenate(xs), *physical)
    assert global_physical["input_ids"].shape == (4, 3)
    logical = jax.jit(feeds[0].physical_to_logical_batch)(global_physical)
    assert PHYSICAL_TO_LOGICAL_DISPATCH_KEY not in logical
    expected = jax.tree.map(lambda *xs: np.concatenate(xs), *logical_inputs[:2])
    jax.tree.map(np.testing.assert_array_equal, logical, expected)
    assert logical["input_ids"].dtype == np.int32


def test_defaults_one_process_eight_devices():
    # One process, 8 (forced host) devices: logical 2 -> physical max(2 * 1, 8) = 8 rows, the
    # first 2 real, 6 padding.
    d = _dispatcher(global_logical_batch_size=2)
    assert jax.device_count() == 8
    assert d.config.global_physical_batch_size == 8 and d.logical_feed_index == 0
    batch = _feed_batch(0, 2)
    physical = d.logical_to_physical_batch(batch)
    assert physical["input_ids"].shape == (8, 3)
    np.testing.assert_array_equal(physical["input_ids"][:2], batch["input_ids"])
    np.testing.assert_array_equal(physical["input_ids"][2:], 0)
    expected_dispatch = np.zeros((8, 2), bool)
    expected_dispatch[0, 0] = expected_dispatch[1, 1] = True
    np.testing.assert_array_equal(physical[PHYSICAL_TO_LOGICAL_DISPATCH_KEY], expected_dispatch)
    logical = d.physical_to_logical_batch(physical)
    jax.tree.map(np.testing.assert_array_equal, logical, batch)


def test_multiple_rows_per_feed_and_custom_logical_feeds():
    # Logical 4 over feeds [3, 1] (2 rows each), physical 8 over 4 feeds (2 rows each).
    kw = dict(
        global_logical_batch_size=4,
        global_physical_batch_size=8,
        num_physical_feeds=4,
        logical_feed_indices=[3, 1],
    )
    feeds = [_dispatcher(physical_feed_index=i, **kw) for i in range(4)]
    assert [d.logical_feed_index for d in feeds] == [None, 1, None, 0]
    inputs = [_feed_batch(i, 2) for i in range(4)]
    physical = [d.logical_to_physical_batch(b) for d, b in zip(feeds, inputs)]
    global_physical = jax.tree.map(lambda *xs: np.concatenate(xs), *physical)
    logical = feeds[0].physical_to_logical_batch(global_physical)
    # Logical order: logical feed 0 (physical 3) then logical feed 1 (physical 1).
    np.testing.assert_array_equal(
        logical["input_ids"], np.concatenate([inputs[3]["input_ids"], inputs[1]["input_ids"]])
    )


def test_identity_when_logical_equals_physical():
    d = _dispatcher(
        global_logical_batch_size=8,
        global_physical_batch_size=8,
        num_physical_feeds=1,
        physical_feed_index=0,
    )
    batch = _feed_batch(0, 8)
    out = d.logical_to_physical_batch(batch)
    assert PHYSICAL_TO_LOGICAL_DISPATCH_KEY not in out
    jax.tree.map(np.testing.assert_array_equal, out, batch)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(global_logical_batch_size=3, num_physical_feeds=2, physical_feed_index=0), "3"),
        (
            dict(
                global_logical_batch_size=2,
                global_physical_batch_size=6,
                num_physical_feeds=4,
                physical_feed_index=0,
            ),
            "global_physical_batch_size 6",
        ),
        (
            dict(global_logical_batch_size=2, num_physical_feeds=2, physical_feed_index=2),
            "physical_feed_index 2",
        ),
        (
            dict(
                global_logical_batch_size=2,
                num_physical_feeds=2,
                physical_feed_index=0,
                logical_feed_indices=[0, 0],
            ),
            "unique",
        ),
        (
            dict(
                global_logical_batch_size=2,
                num_physical_feeds=2,
                physical_feed_index=0,
                logical_feed_indices=[0, 5],
            ),
            "logical_feed_indices",
        ),
        (
            dict(
                global_logical_batch_size=8,
                global_physical_batch_size=4,
                num_physical_feeds=1,
                physical_feed_index=0,
            ),
            "feed_physical_batch_size 4",
        ),
    ],
)
def test_bad_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _dispatcher(**kwargs)


def test_bad_leading_dim():
    d = _dispatcher(global_logical_batch_size=2)
    with pytest.raises(ValueError, match="feed_logical_batch_size 2"):
        d.logical_to_physical_batch(_feed_batch(0, 3))


def test_dispatch_input_batch_nested():
    # Only the dict holding the dispatch key is dispatched; its sibling is untouched.
    dispatch = np.array([[0, 1], [0, 0], [1, 0]], bool)
    x = np.array([[1.0], [2.0], [3.0]], np.float32)
    out = dispatch_input_batch({"a": {"x": x, PHYSICAL_TO_LOGICAL_DISPATCH_KEY: dispatch}, "b": x})
    np.testing.assert_array_equal(out["a"]["x"], [[3.0], [1.0]])
    np.testing.assert_array_equal(out["b"], x)
