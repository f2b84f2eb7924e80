"""Tests axlearn/common/input_dispatch.py (InputDispatcher, SpmdInputDispatcher) and
utils.dispatch_input_batch."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from axlearn.common.input_dispatch import (
    InputDispatcher,
    SpmdInputDispatcher,
    batch_feed_layout,
    feed_layout_from_indices,
)
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


# ------------------------------------------------------------------------------------------------
# SpmdInputDispatcher.
# ------------------------------------------------------------------------------------------------


class _FakeDevice:
    """A device stand-in with a process index (to lay out several hosts on one machine)."""

    def __init__(self, device_id: int, process_index: int):
        self.id = device_id
        self.process_index = process_index


def _mesh(shape=(2, 1, 4), names=("data", "expert", "fsdp")) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(shape), names)


def _spmd(**kwargs) -> SpmdInputDispatcher:
    return (
        SpmdInputDispatcher.default_config()
        .set(name="dispatcher", **kwargs)
        .instantiate(parent=None)
    )


def test_spmd_dispatcher_one_process_feeds_everything():
    batch = _feed_batch(0, 16)
    with jax.set_mesh(_mesh()):
        d = _spmd(
            global_logical_batch_size=16,
            partition_spec=PartitionSpec(("data", "expert", "fsdp")),
        )
    # One process holds all 8 devices: one feed reading shard 0 of 1, the whole batch.
    assert (d.num_logical_feeds, d.logical_feed_index, d.feed_logical_batch_size) == (1, 0, 16)
    assert d.feed_physical_batch_size == 16
    assert d.feed_read_config() == dict(num_shards=1, shard_index=0)
    assert d.partition_spec == PartitionSpec(("data", "expert", "fsdp"))
    # No padding and no dispatch key: the batch passes through unchanged (a new tree).
    physical = d.logical_to_physical_batch(batch)
    assert physical is not batch and PHYSICAL_TO_LOGICAL_DISPATCH_KEY not in physical
    np.testing.assert_array_equal(physical["input_ids"], batch["input_ids"])
    logical = d.physical_to_logical_batch(physical)
    np.testing.assert_array_equal(logical["nested"]["w"], batch["nested"]["w"])


def test_feed_layout_over_simulated_hosts():
    """Four simulated hosts of two devices each on a (data=2, fsdp=4) mesh: a batch over "data"
    only gives 2 feeds (hosts with the same data row share one); over both axes, 4 feeds."""
    # Device (r, c) is on host 2r + c // 2: hosts 0, 1 hold data row 0; hosts 2, 3 data row 1.
    devices = {(r, c): _FakeDevice(4 * r + c, 2 * r + c // 2) for r in range(2) for c in range(4)}

    def indices(parts_of):
        # A batch of 8 rows split into equal parts; parts_of(r, c) -> (part, number of parts).
        out = {}
        for (r, c), device in devices.items():
            part, count = parts_of(r, c)
            size = 8 // count
            out[device] = (slice(part * size, (part + 1) * size),)
        return out

    by_data = feed_layout_from_indices(indices(lambda r, c: (r, 2)))
    by_both = feed_layout_from_indices(indices(lambda r, c: (4 * r + c, 8)))
    replicated = feed_layout_from_indices(indices(lambda r, c: (0, 1)))
    assert by_data == {0: (0, 2), 1: (0, 2), 2: (1, 2), 3: (1, 2)}
    assert by_both == {0: (0, 4), 1: (1, 4), 2: (2, 4), 3: (3, 4)}
    assert replicated == {p: (0, 1) for p in range(4)}
    # The real mesh of this machine: one process, one feed.
    layout = batch_feed_layout(_mesh(), PartitionSpec(("data", "fsdp")), global_batch_size=8)
    assert layout == {0: (0, 1)}


@pytest.mark.parametrize(
    "spec,batch,match",
    [
        (PartitionSpec(), 16, r"dispatcher\.partition_spec=.* is empty"),
        (PartitionSpec("data", "fsdp"), 16, r"only the batch dim may be partitioned"),
        (
            PartitionSpec(("data", "fsdp")),
            12,
            r"dispatcher\.global_logical_batch_size=12 is not divisible by the 8 batch partitions",
        ),
    ],
)
def test_spmd_dispatcher_bad_configs(spec, batch, match):
    with jax.set_mesh(_mesh()), pytest.raises((ValueError, NotImplementedError), match=match):
        _spmd(global_logical_batch_size=batch, partition_spec=spec)


def test_spmd_dispatcher_needs_a_mesh():
    with pytest.raises(ValueError, match=r"dispatcher: SpmdInputDispatcher must be instantiated"):
        _spmd(global_logical_batch_size=8, partition_spec=PartitionSpec("data"))


def test_base_dispatcher_is_the_interface():
    from axlearn.common.input_dispatch import BaseInputDispatcher

    assert issubclass(InputDispatcher, BaseInputDispatcher)
    assert issubclass(SpmdInputDispatcher, BaseInputDispatcher)
    base = (
        BaseInputDispatcher.default_config()
        .set(name="base", global_logical_batch_size=4)
        .instantiate(parent=None)
    )
    for name in ("num_logical_feeds", "feed_logical_batch_size", "partition_spec"):
        with pytest.raises(NotImplementedError):
            getattr(base, name)
    with pytest.raises(NotImplementedError):
        base.logical_to_physical_batch({})


def test_logical_to_physical_shapes():
    # Logical 2 over 4 feeds, physical 8 (defaults: max(1 * 4, 8 devices)): 2 rows per feed.
    d = _dispatcher(global_logical_batch_size=2, num_physical_feeds=4, physical_feed_index=3)
    logical = {
        "input_ids": jax.ShapeDtypeStruct((1, 5), np.int32),
        "nested": {"w": np.zeros((1, 2, 3), np.float32)},  # Arrays have shape/dtype too.
    }
    physical = d.logical_to_physical_shapes(logical)
    assert physical["input_ids"] == jax.ShapeDtypeStruct((2, 5), np.int32)
    assert physical["nested"]["w"] == jax.ShapeDtypeStruct((2, 2, 3), np.float32)
    # The shapes agree with the batches logical_to_physical_batch makes (its dispatch key aside).
    batch = d.logical_to_physical_batch({"input_ids": np.zeros((1, 5), np.int32)})
    assert batch["input_ids"].shape == physical["input_ids"].shape
    with pytest.raises(ValueError, match="InputDispatcher.logical_to_physical_shapes: a leaf"):
        d.logical_to_physical_shapes({"x": jax.ShapeDtypeStruct((), np.int32)})
    with pytest.raises(ValueError, match="expected leaves with shape and dtype"):
        d.logical_to_physical_shapes({"x": 3})
    with jax.set_mesh(_mesh()):
        spmd = _spmd(global_logical_batch_size=8, partition_spec=PartitionSpec("data"))
        # InputDispatcher's global batch spans every mesh axis.
        assert d.partition_spec == PartitionSpec(tuple(_mesh().axis_names))
    shapes = {"x": np.zeros((8, 3), np.int64)}
    assert spmd.logical_to_physical_shapes(shapes) == {"x": jax.ShapeDtypeStruct((8, 3), np.int64)}
