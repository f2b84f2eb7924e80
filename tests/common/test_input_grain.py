"""Tests axlearn.common.input_grain against hand computations (NumPy, Python sets)."""

import json

import grain
import numpy as np
import pytest

from axlearn.common import input_grain
from axlearn.common.config import config_for_function
from axlearn.common.input_dispatch import InputDispatcher
from axlearn.common.input_grain import (
    DispatchConfig,
    Input,
    InputError,
    InputStateError,
    array_record_dataset,
    maybe_to_iter_dataset,
    pad_for_evaluation,
    per_feed_batch,
    prefetch_dataset,
    rekey,
    sample_from_datasets,
    shard_dataset,
    unbatch,
)


def _as_example(i):
    return {"x": np.int64(i)}


def range_build_fn(
    *, n: int = 50, global_batch_size: int = 4, seed: int = 3, num_workers: int = 0, mix=False
):
    """A BuildDatasetFn factory: a shuffled, repeated (mixed) range, sharded and batched."""

    def build(dc: DispatchConfig):
        ds = grain.MapDataset.range(n).seed(seed).shuffle().repeat()
        if mix:
            other = grain.MapDataset.range(1000, 1000 + n // 2).seed(seed + 1).shuffle()
            ds = sample_from_datasets(sources=[ds, other], weights=[2, 1])
        ds = shard_dataset(ds, dc).map(_as_example)
        ds = prefetch_dataset(
            ds, multiprocessing_options=grain.MultiprocessingOptions(num_workers=num_workers)
        )
        return per_feed_batch(ds, global_batch_size=global_batch_size, dispatch_config=dc)

    return build


def grain_input(*, num_feeds=None, feed_index=None, elastic=True, **kwargs) -> Input:
    cfg = Input.default_config().set(
        name="input",
        source=config_for_function(range_build_fn).set(**kwargs),
        elastic_resume=elastic,
    )
    if num_feeds is not None:
        cfg.input_dispatcher = InputDispatcher.default_config().set(
            global_logical_batch_size=kwargs.get("global_batch_size", 4),
            global_physical_batch_size=kwargs.get("global_batch_size", 4),
            num_physical_feeds=num_feeds,
            physical_feed_index=feed_index,
        )
    return cfg.instantiate(parent=None)


def test_shards_disjoint_and_covering():
    ds = grain.MapDataset.range(23)
    shards = [list(shard_dataset(ds, DispatchConfig(s, 3))) for s in range(3)]
    flat = [x for s in shards for x in s]
    assert sorted(flat) == list(range(23))
    assert len(set(flat)) == 23
    assert shards[1][:3] == [1, 4, 7]
    # start_index skips the first positions.
    assert list(shard_dataset(ds, DispatchConfig(0, 2, start_index=20))) == [20, 22]


def test_feed_batches_union_is_global_order():
    # Two simulated feeds' batches together hold positions [0, 8) of the global order.
    order = list(grain.MapDataset.range(50).seed(3).shuffle().repeat(1))
    rows = []
    for s in range(2):
        it = iter(grain_input(num_feeds=2, feed_index=s))
        rows.append(np.concatenate([next(it)["x"] for _ in range(2)]))
    assert sorted(np.concatenate(rows).tolist()) == sorted(order[:8])


def test_mixing_proportions_within_one_percent():
    a = grain.MapDataset.range(0, 100)
    b = grain.MapDataset.range(1000, 1037)
    c = grain.MapDataset.range(5000, 5011)
    weights = [0.5, 0.3, 0.2]
    ds = sample_from_datasets(sources=[a, b, c], weights=weights)
    xs = np.array([ds[i] for i in range(10_000)])
    counts = np.array([(xs < 1000).sum(), ((xs >= 1000) & (xs < 5000)).sum(), (xs >= 5000).sum()])
    np.testing.assert_allclose(counts / 10_000, weights, atol=0.01)
    # Smaller sources repeat: every element of c is used about 2000 / 11 times.
    assert set(xs[xs >= 5000].tolist()) == set(range(5000, 5011))


@pytest.mark.parametrize("weights", [[0, 0], [1, -1], [1, float("nan")], [1]])
def test_mixing_bad_weights(weights):
    with pytest.raises(ValueError, match="weights"):
        sample_from_datasets(
            sources=[grain.MapDataset.range(3), grain.MapDataset.range(3)], weights=weights
        )


def test_mixing_requires_map_datasets():
    with pytest.raises(ValueError, match="MapDataset"):
        sample_from_datasets(sources=[grain.MapDataset.range(3).to_iter_dataset()], weights=[1])


def test_rekey():
    ds = grain.MapDataset.source([{"a": {"t": 1}, "b": 2}])
    assert list(rekey(ds, key_map={"text": "b", "empty": ""})) == [{"text": 2, "empty": ""}]
    out = list(rekey(ds, key_map={"a/u": "a/t"}, retain_original_inputs=True, separator="/"))
    assert out == [{"a": {"t": 1, "u": 1}, "b": 2}]
    assert list(ds) == [{"a": {"t": 1}, "b": 2}]  # The input is not modified.


def test_unbatch_and_its_state():
    batches = [{"x": np.arange(i * 3, i * 3 + 3)} for i in range(4)]
    ds = unbatch(maybe_to_iter_dataset(grain.MapDataset.source(batches)))
    assert [int(e["x"]) for e in ds] == list(range(12))
    it = iter(ds)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [int(next(it)["x"]) for _ in range(5)]
    it2 = iter(ds)
    it2.set_state(state)
    assert [int(next(it2)["x"]) for _ in range(5)] == rest == [4, 5, 6, 7, 8]
    bad = grain.MapDataset.source([{"x": np.zeros(2), "y": np.zeros(3)}])
    with pytest.raises(ValueError, match="batch"):
        list(unbatch(maybe_to_iter_dataset(bad)))


@pytest.mark.parametrize("to_iter", [False, True])
def test_pad_for_evaluation(to_iter):
    ds = grain.MapDataset.range(7)
    if to_iter:
        ds = maybe_to_iter_dataset(ds)
    padded = pad_for_evaluation(ds, per_feed_batch_size=3)
    assert list(padded) == list(range(7)) + [0, 0]
    with pytest.raises(ValueError, match="counting"):
        pad_for_evaluation(
            maybe_to_iter_dataset(grain.MapDataset.range(7)),
            per_feed_batch_size=3,
            max_num_examples=3,
        )


def test_per_feed_batch_must_divide():
    with pytest.raises(ValueError, match="multiple of the feed count"):
        per_feed_batch(
            grain.MapDataset.range(8), global_batch_size=5, dispatch_config=DispatchConfig(0, 2)
        )


def test_worker_count_too_large():
    with pytest.raises(ValueError, match="num_workers"):
        prefetch_dataset(
            grain.MapDataset.range(3),
            multiprocessing_options=grain.MultiprocessingOptions(num_workers=100_000),
        )


def _take(it, n):
    return [next(it)["x"].copy() for _ in range(n)]


# With workers: each of the 6 iterators starts 2 processes (over a minute on 2 busy cores).
@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_exact_resume_at_kill_points(num_workers):
    """Batches after a restore equal an uninterrupted run's, byte for byte (mixing, epochs)."""
    total = 40  # 40 batches of 4 from a 75-element mixture epoch: crosses epochs.
    inp = grain_input(mix=True, num_workers=num_workers)
    it = iter(inp)
    reference, states = [], {}
    kill_points = [0, 3, 17, 18, 33]
    for k in range(total):
        if k in kill_points:
            states[k] = inp.iterator_state(it)
        reference.append(next(it)["x"].copy())
    for k in kill_points:
        restored = grain_input(mix=True, num_workers=num_workers).restore_iterator(states[k])
        assert restored.num_batches == k
        got = _take(restored, total - k)
        assert b"".join(g.tobytes() for g in got) == b"".join(r.tobytes() for r in reference[k:])
    state = json.loads(states[17])
    assert state["format"] == "axlearn.grain_input_state" and state["num_batches"] == 17


@pytest.mark.parametrize("old,new", [(2, 1), (1, 2), (2, 4)])
def test_elastic_resume_loses_and_repeats_nothing(old, new):
    """Saved with `old` feeds at batch 5, resumed with `new`: each position read exactly once."""
    order = list(grain.MapDataset.range(50).seed(3).shuffle().repeat(3))
    seen = []
    states = []
    for s in range(old):
        inp = grain_input(num_feeds=old, feed_index=s)
        it = iter(inp)
        seen += [x for _ in range(5) for x in next(it)["x"].tolist()]
        states.append(inp.iterator_state(it))
    for s in range(new):
        it = grain_input(num_feeds=new, feed_index=s).restore_iterator(states[0])
        seen += [x for _ in range(20) for x in next(it)["x"].tolist()]
    # 5 * 4 + 20 * 4 = 100 positions = two epochs of 50: every element exactly twice.
    assert len(seen) == 100
    assert sorted(seen) == sorted(order[:100])
    np.testing.assert_array_equal(np.bincount(seen), np.full(50, 2))


def test_state_of_another_feed_is_refused():
    state = grain_input(num_feeds=2, feed_index=1).iterator_state(
        iter(grain_input(num_feeds=2, feed_index=1))
    )
    with pytest.raises(InputStateError, match="feed 1's but this is feed 0"):
        grain_input(num_feeds=2, feed_index=0).restore_iterator(state)


def test_elastic_resume_requires_opt_in():
    inp = grain_input(num_feeds=2, feed_index=0, elastic=False)
    state = inp.iterator_state(iter(inp))
    with pytest.raises(InputStateError, match="elastic_resume=True"):
        grain_input(num_feeds=1, feed_index=0, elastic=False).restore_iterator(state)


def test_state_from_another_pipeline_shape():
    inp = grain_input(mix=True, num_workers=1)
    state = inp.iterator_state(iter(inp))
    with pytest.raises(InputStateError, match="differently configured"):
        grain_input(mix=True).restore_iterator(state)
    # Forced past the config check: a one-line error, not Grain's traceback.
    with pytest.raises(InputStateError, match="another shape") as e:
        grain_input(mix=True).restore_iterator(state, check_config=False)
    assert "\n" not in str(e.value)
    with pytest.raises(InputStateError, match="Not a Grain input state"):
        inp.restore_iterator(b"AXINPUT1....")


def _write_array_record(path, records):
    from array_record.python import array_record_module  # pylint: disable=import-outside-toplevel

    writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for r in records:
        writer.write(r)
    writer.close()


def test_array_record_dataset(tmp_path):
    path = tmp_path / "a.array_record"
    _write_array_record(path, [b"r%d" % i for i in range(10)])
    ds = array_record_dataset(str(path))
    assert list(ds) == [b"r%d" % i for i in range(10)]
    with pytest.raises(FileNotFoundError, match="no ArrayRecord file .*missing"):
        array_record_dataset([str(tmp_path / "missing.array_record")])


def test_corrupt_array_record_is_one_line(tmp_path):
    path = tmp_path / "a.array_record"
    _write_array_record(path, [bytes(range(200)) * 5 for _ in range(20)])
    data = bytearray(path.read_bytes())
    for i in range(100, 400):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))

    def build(dc):
        return per_feed_batch(
            shard_dataset(array_record_dataset(str(path)), dc).map(len),
            global_batch_size=2,
            dispatch_config=dc,
        )

    inp = Input.default_config().set(name="input", source=build).instantiate(parent=None)
    with pytest.raises(InputError, match="ArrayRecord source .* corrupt") as e:
        list(iter(inp))
    assert "\n" not in str(e.value)
    assert "rewrite" in str(e.value)


def test_input_dataset_and_element_spec():
    inp = grain_input()
    spec = inp.element_spec()
    assert spec["x"].shape == (4,) and spec["x"].dtype == np.int64
    first = next(iter(inp.dataset()))
    np.testing.assert_array_equal(first["x"], next(iter(inp))["x"])


def test_source_must_be_callable():
    with pytest.raises(ValueError, match="source must be a BuildDatasetFn"):
        Input.default_config().set(name="input", source=config_for_function(lambda: 3)).instantiate(
            parent=None
        )


def test_module_exports():
    for name in input_grain.__all__:
        assert hasattr(input_grain, name)


def test_partition_specs():
    from jax.sharding import PartitionSpec  # pylint: disable=import-outside-toplevel

    from axlearn.common.input_base import partition_by_path_rank  # pylint: disable=import-outside-toplevel

    batch = {"x": np.zeros([4]), "y": np.zeros([4, 3])}
    assert grain_input().partition_specs(batch) is None
    inp = (
        Input.default_config()
        .set(name="input", source=range_build_fn(), partition_spec=PartitionSpec("data"))
        .instantiate(parent=None)
    )
    assert inp.partition_specs(batch) == {"x": PartitionSpec("data"), "y": PartitionSpec("data")}
    inp = (
        Input.default_config()
        .set(
            name="input",
            source=range_build_fn(),
            input_partitioner=partition_by_path_rank(
                {(None, 1): PartitionSpec("data"), (None, 2): PartitionSpec("data", "seq")}
            ),
        )
        .instantiate(parent=None)
    )
    assert inp.partition_specs(batch)["y"] == PartitionSpec("data", "seq")
