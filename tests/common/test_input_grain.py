"""Tests axlearn.common.input_grain against hand computations (NumPy, Python sets)."""

import json
import os

import grain
import numpy as np
import pytest

from axlearn.common import input_grain, input_state_check
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
    with pytest.raises(InputStateError, match="saved by a tf.data input reading real data"):
        inp.restore_iterator(b"AXINPUT1....")
    # Issue 55 case 1: a --data_dir=FAKE checkpoint resumed with a Grain input.
    fake_state = b'{"format": "axlearn.fake_input_state", "num_batches": 3}'
    with pytest.raises(InputStateError, match=r"saved by FakeLmInput .* --data_dir=FAKE again"):
        inp.restore_iterator(fake_state)


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


def test_element_spec_needs_array_leaves():
    def build(dc):
        del dc
        return grain.MapDataset.range(4).map(lambda i: {"x": i})  # Python ints, not arrays.

    inp = Input.default_config().set(name="input", source=build).instantiate(parent=None)
    with pytest.raises(ValueError, match="input: element_spec.. requires Tensor-like leaves"):
        inp.element_spec()

    def build_batched(dc):
        del dc
        return grain.MapDataset.range(6).map(lambda i: {"x": np.full(3, i, np.float32)}).batch(2)

    inp = Input.default_config().set(name="input", source=build_batched).instantiate(parent=None)
    spec = inp.element_spec()  # A MapDataset: its element 0.
    assert spec["x"].shape == (2, 3) and spec["x"].dtype == np.float32


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


# ---- Resumes prove their position (issue "Safe by construction": the Silent cases). ----


def _array_record_input(path_ref: dict, *, elastic=False, num_feeds=None, feed_index=None):
    """An Input over the ArrayRecord file at path_ref["path"] (read when the dataset is built)."""

    def build(dc):
        ds = shard_dataset(array_record_dataset(path_ref["path"]), dc).map(lambda r: {"x": len(r)})
        return per_feed_batch(ds, global_batch_size=2, dispatch_config=dc)

    cfg = Input.default_config().set(name="input", source=build, elastic_resume=elastic)
    if num_feeds is not None:
        cfg.input_dispatcher = InputDispatcher.default_config().set(
            global_logical_batch_size=2,
            global_physical_batch_size=2,
            num_physical_feeds=num_feeds,
            physical_feed_index=feed_index,
        )
    return cfg.instantiate(parent=None)


def test_silent_replaced_array_record_file_is_refused(tmp_path):
    """Silent case: an ArrayRecord file replaced between save and resume was read on."""
    path = tmp_path / "a.array_record"
    _write_array_record(path, [b"x" * (i + 1) for i in range(20)])
    ref = {"path": str(path)}
    inp = _array_record_input(ref)
    it = iter(inp)
    first = [next(it)["x"].tolist() for _ in range(3)]
    assert first == [[1, 2], [3, 4], [5, 6]]
    state = inp.iterator_state(it)
    saved = json.loads(state)["sources"]
    assert [(s["path"], s["size"]) for s in saved] == [(str(path), path.stat().st_size)]
    # Unchanged file: resumes where it stopped.
    assert next(_array_record_input(ref).restore_iterator(state))["x"].tolist() == [7, 8]
    # An identical copy elsewhere (a moved data set) is accepted.
    copy = tmp_path / "copy.array_record"
    copy.write_bytes(path.read_bytes())
    moved = _array_record_input({"path": str(copy)}).restore_iterator(state)
    assert next(moved)["x"].tolist() == [7, 8]
    # Replaced by other records, of the same count and the same size: refused, naming the file.
    _write_array_record(path, [b"y" * (20 - i) for i in range(20)])
    assert path.stat().st_size == saved[0]["size"]
    with pytest.raises(InputStateError, match="source file .*a.array_record changed") as e:
        _array_record_input(ref).restore_iterator(state)
    assert "\n" not in str(e.value) and "save_input_iterator=False" in str(e.value)
    # Another size: refused too, elastic restores included.
    _write_array_record(path, [b"z" for _ in range(30)])
    for inp2 in (
        _array_record_input(ref),
        _array_record_input(ref, elastic=True, num_feeds=2, feed_index=0),
    ):
        with pytest.raises(InputStateError, match=r"changed since .*size \d+ -> \d+"):
            inp2.restore_iterator(state, check_config=False)


def test_silent_null_rows_per_batch_is_refused():
    """Silent case: an elastic state with rows_per_batch null restarted the input at 0."""
    states = []
    for s in range(2):
        inp = grain_input(num_feeds=2, feed_index=s)
        it = iter(inp)
        _take(it, 5)
        states.append(json.loads(inp.iterator_state(it)))
    states[0]["rows_per_batch"] = None
    bad = json.dumps(states[0]).encode()
    with pytest.raises(InputStateError, match="'rows_per_batch' is null after 5 batches") as e:
        grain_input(num_feeds=1, feed_index=0).restore_iterator(bad)
    assert "\n" not in str(e.value)
    # A state saved before any batch has no rows_per_batch and restores at its start exactly.
    inp = grain_input(num_feeds=2, feed_index=0)
    fresh = inp.iterator_state(iter(inp))
    assert json.loads(fresh)["rows_per_batch"] is None
    restored = grain_input(num_feeds=1, feed_index=0).restore_iterator(fresh)
    np.testing.assert_array_equal(next(restored)["x"], next(iter(grain_input()))["x"])


def test_elastic_states_that_disagree_are_refused():
    """Given all feeds' states, an elastic restore refuses states of different positions."""
    states = []
    for s, n in enumerate((3, 5)):
        inp = grain_input(num_feeds=2, feed_index=s)
        it = iter(inp)
        _take(it, n)
        states.append(inp.iterator_state(it))
    with pytest.raises(InputStateError, match="disagree on the global position") as e:
        grain_input(num_feeds=1, feed_index=0).restore_iterator(states)
    assert "\n" not in str(e.value)


def test_version_1_state_still_restores():
    """A state of the previous format (no "sources") restores exactly."""
    inp = grain_input()
    it = iter(inp)
    _take(it, 3)
    state = json.loads(inp.iterator_state(it))
    expected = next(it)["x"].tolist()
    del state["sources"]
    state["version"] = 1
    restored = grain_input().restore_iterator(json.dumps(state).encode())
    assert next(restored)["x"].tolist() == expected


def _state_with(**changes) -> bytes:
    inp = grain_input()
    it = iter(inp)
    _take(it, 2)
    state = json.loads(inp.iterator_state(it))
    state.update(changes)
    return json.dumps(state).encode()


@pytest.mark.parametrize(
    "state,match",
    [
        (lambda: _state_with(num_batches="7b"), "field 'num_batches' must be an integer, got str"),
        (lambda: _state_with(num_batches=True), "field 'num_batches' must be an integer, got bool"),
        (lambda: _state_with(start_index=-3), "field 'start_index' is -3, outside"),
        (lambda: _state_with(num_shards=0), "field 'num_shards' is 0, outside"),
        (lambda: _state_with(shard_index=4), "'shard_index' is 4, not below num_shards=1"),
        (lambda: _state_with(rows_per_batch=[4]), "'rows_per_batch' must be an integer, got list"),
        (lambda: _state_with(grain="x"), "field 'grain' must be an object, got str"),
        (lambda: _state_with(sources={"a": 1}), "field 'sources' must be a list"),
        (lambda: _state_with(version="2"), "unsupported version"),
        (lambda: b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper than 64"),
        (
            lambda: _state_with(grain={"a": {"b": [[[[[[[[[[[]]]]]]]]]]]}})[:-1] + b"[" * 100_000,
            "nests deeper",
        ),
        (lambda: b'{"format": "axlearn.grain_input_state", "x": "\xff\xfe"}', "is not UTF-8"),
        (lambda: b"{" + b" " * (17 * 2**20) + b"}", "more than the 16777216"),
        (lambda: b'{"format": "axlearn.grain_input_state", ', "is not valid JSON"),
        (lambda: b'{"num_batches": 1' + b"1" * 5000 + b"}", "not valid JSON|Not a Grain"),
        (lambda: b"{}", "saved by an unknown input"),
    ],
)
def test_bad_state_is_one_line(state, match):
    """Unclear cases: wrong JSON types, deep nesting, non-UTF-8, huge: one line each."""
    with pytest.raises(InputStateError, match=match) as e:
        grain_input().restore_iterator(state())
    message = str(e.value)
    assert "\n" not in message and len(message) < 600
    assert "Input 'input'" in message or "Not a Grain" in message


def test_fifo_source_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.array_record"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="fifo.array_record is not a regular file"):
        array_record_dataset(str(fifo))
    with pytest.raises(InputStateError, match="fifo.array_record: not a regular file"):
        input_state_check.file_fingerprint(str(fifo))
